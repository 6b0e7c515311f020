#!/bin/bash
# Issue 23's method table on the GPU machine: bench/longctx/method_table.py over the committed
# long-context model (hosts/sieve/models/longctx) — every decode and prefill policy at budgets of
# 1/4..1/32 of the context, 4096 and 8192 tokens (the training length; the model has 8192 RoPE
# positions and no scaling: nothing longer), tasks passkey and copy, 16 held-out instances per cell
# (seed 1000), the CPU-only seer oracle on 8 instances beside them on the host's cores.
# Calibrations (Δ-layers, dpxa τ, the seer gate) are the committed ones in bench/longctx/calib; one
# missing is made there (the seer gate on the host's CPU beside the other cells); the directory as
# used comes back in $OUT/calib.tgz.
# Build: $SIEVE_BUILD as it is when set, else the CLI and the plugins into build-longctx2.
# Stops itself within LIMIT seconds (default 360); the JSON is rewritten after every cell.
# A smaller slice: TABLE_ARGS="--lengths 8192 --fractions 8,32" LIMIT=150 MARGIN=45.
# Comes back in $OUT: longctx.json, longctx.log, build.log (and calib.tgz).
set -uo pipefail
: "${OUT:?OUT must name the output folder}"
LIMIT=${LIMIT:-360}
t0=$(date +%s)
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; nproc
  git log -1 --format='git: %H' 2>/dev/null; } > "$OUT/build.log" 2>&1
B=${SIEVE_BUILD:-}
if [ -z "$B" ]; then
  B=build-longctx2
  timeout $((LIMIT - 120)) bash -c "cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON \
      -DSIEVE_BUILD_TESTS=OFF -DSIEVE_BUILD_BENCH=OFF -DCMAKE_PREFIX_PATH=$PWD/.devdeps/usr \
      -DDLPACK_INCLUDE_DIR=$PWD/.devdeps/usr/include &&
    cmake --build $B -j 16 --target sieve sieve_plugin_dense sieve_plugin_streaming sieve_plugin_quest \
      sieve_plugin_raas sieve_plugin_delta sieve_plugin_seer sieve_plugin_dpxa sieve_plugin_deltakv \
      sieve_plugin_delta_correction" >> "$OUT/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
fi
echo "build: $(( $(date +%s) - t0 )) s (B=$B)"
left=$(( LIMIT - ($(date +%s) - t0) - 10 ))
# No cell starts in the last MARGIN s (an 8K GPU cell takes a few seconds, an 8K oracle cell on the
# CPU up to ~1 min); a seer gate still distilling may go on until the end.
MARGIN=${MARGIN:-75}
TABLE_ARGS=${TABLE_ARGS:---lengths 4096,8192 --fractions 4,8,16,32}
timeout $left python3 bench/longctx/method_table.py --sieve "$B/bin/sieve" --device cuda \
  --out "$OUT/longctx.json" --work "$OUT" --calib-dir bench/longctx/calib $TABLE_ARGS \
  --tasks passkey,copy --instances 16 --oracle-instances 8 --jobs 6 --cpu-jobs 6 \
  --gate-sequences 8 --deadline $(( left - MARGIN )) --stop $(( left - 5 )) > "$OUT/longctx.log" 2>&1
echo "method_table rc=$? after $(( $(date +%s) - t0 )) s"
tar czf "$OUT/calib.tgz" bench/longctx/calib  # as used (with what was made here)
tail -3 "$OUT/longctx.log"
