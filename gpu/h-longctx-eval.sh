#!/bin/bash
# Issue 23: the committed long-context model (hosts/sieve/models/longctx) through `sieve eval
# --task` on CUDA, to set beside the CPU's numbers (hosts/sieve/models/longctx/README.md). Builds
# only the CLI and the two plugins it uses (no tests, sm_90), then at the training length 8192,
# 8 held-out instances (seed 1000, as on the CPU), no per-call attention measurement:
#   passkey, copy, mqar dense; passkey and copy with quest(token_budget=1024) (1/8).
# Comes back in $OUT: build.log, eval.log, eval.jsonl (one compact JSON object a run, with its command).
set -uo pipefail
: "${OUT:?OUT must name the output folder}"
M=hosts/sieve/models/longctx
B=build-longctx
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > "$OUT/build.log" 2>&1
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS=OFF \
  -DSIEVE_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" \
  >> "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
cmake --build $B -j 16 --target sieve sieve_plugin_quest >> "$OUT/build.log" 2>&1 \
  || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
: > "$OUT/eval.jsonl"
run() {  # task chain
  local cmd=("$B/bin/sieve" eval --model "$M" --task "$1" --length 8192 --instances 8 --seed 1000 --device cuda
             --no-attention-metrics --json ${2:+--chain "$2"})
  echo "== ${cmd[*]}" >> "$OUT/eval.log"
  "${cmd[@]}" > "$OUT/run.json" 2>> "$OUT/eval.log" || { echo "failed: ${cmd[*]}"; return; }
  python3 - "$OUT/run.json" "${cmd[*]}" "$OUT/eval.jsonl" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
j["command"] = sys.argv[2]
open(sys.argv[3], "a").write(json.dumps(j) + "\n")
t = j["task"]
print(t["name"], j["chain"] or "dense", "dense", t["dense"]["accuracy"], t["dense"]["exact"], "chain",
      t["chain"]["accuracy"], t["chain"]["exact"], "KL", j["teacher_forced"]["kl_mean"])
PY
}
for task in passkey copy mqar; do run $task ""; done
for task in passkey copy; do run $task "quest(token_budget=1024)"; done
rm -f "$OUT/run.json"
echo "total: $(( $(date +%s) - t0 )) s"
