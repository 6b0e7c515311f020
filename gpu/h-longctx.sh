#!/bin/bash
# Issue 23: train the long-context model (bench/train/train.py) on the GPU machine for a fixed
# wall-clock budget. Needs only the image's python3 (torch 2.x, numpy); no build.
#   MINUTES    training budget of this call (default 7.5; the call's total is about a minute more)
#   RESUME     a ckpt.pt in the working tree to continue from (ckpt_opt.pt beside it), e.g. the
#              previous call's $OUT/train/ckpt.pt + ckpt_opt.pt copied into an ignored folder and
#              carried; RESUME_LR its peak learning rate (default 5e-4)
#   EXTRA      more train.py arguments
# Comes back in $OUT (7 files): train.log, train/curve.jsonl (held-out accuracy curve),
# train/ckpt.pt + ckpt_opt.pt, train/model/{config.json, model.safetensors, training.json}.
set -euo pipefail
: "${OUT:?OUT must name the output folder}"
export PYTHONUNBUFFERED=1
args=(--out "$OUT/train" --minutes "${MINUTES:-7.5}" --device cuda)
if [ -n "${RESUME:-}" ]; then
  args+=(--resume "$RESUME" --lr "${RESUME_LR:-5e-4}")
fi
{
  date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'
  echo "git: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "train.py ${args[*]} ${EXTRA:-}"
} 2>&1 | tee "$OUT/train.log"
# shellcheck disable=SC2086
python3 bench/train/train.py "${args[@]}" ${EXTRA:-} 2>&1 | tee -a "$OUT/train.log"
