#!/usr/bin/env bash
# h-raas on the GPU machine, from the repository root: raas's prefill_policy=quest on CUDA.
#   1. tests: test_plugin_raas_cuda (CPU and CUDA runners stamp, evict and select the same pages,
#      prefill_policy=quest included; outputs against the f64 reference), test_selection_cuda (the
#      shared top-k with per-segment tails, CPU == CUDA), test_plugin_quest_cuda (the shared top-k
#      unchanged for quest);
#   2. the 16 "raas prefill_policy=quest" cells of the long-context method table (errors on CUDA
#      before), as gpu/h-longctx2.sh runs bench/longctx/method_table.py (SKIP_TABLE=1: not);
#   3. with the time left: compute-sanitizer memcheck on the shared top-k test and on the f32
#      prefill_policy=quest case of test_plugin_raas_cuda (every raas kernel but top_ratio's, the
#      per-sequence tails, the pinned upload and download);
#   4. then sieve conform on raas with prefill_policy=quest (numeric_cuda_* skipped before).
# With $SIEVE_BUILD set its build is used as is; otherwise this tree is built into build-raas.
# Stops itself within LIMIT seconds of its start after the build (default 43). Everything comes
# back in $OUT/h-raas.tgz (summary also on stdout).
set -uo pipefail
OUT=${OUT:?}
R="$OUT/h-raas"
mkdir -p "$R"
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git log --oneline -1; date -u; } > "$R/env.log" 2>&1
B=${SIEVE_BUILD:-}
if [ -z "$B" ]; then
  B=build-raas
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS=ON \
      -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" > "$R/build.log" 2>&1 &&
    cmake --build $B -j 16 --target sieve sieve_plugin_raas sieve_plugin_quest test_plugin_raas_cuda \
      test_plugin_quest_cuda test_selection_cuda >> "$R/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$R/build.log" | head -30; tar czf "$OUT/h-raas.tgz" -C "$OUT" h-raas; exit 1; }
fi
T0=$(date +%s)
LIMIT=${LIMIT:-43}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
cap() { local want=$1 l; l=$(( $(left) - 2 )); echo $(( want < l ? want : l )); }
status=0
summary() { grep -hE "^\[  (PASSED|FAILED) |Failure|SKIPPED \] [0-9]+ tests" "$1" | head -8; }

# 1. Tests.
for t in test_plugin_raas_cuda test_selection_cuda test_plugin_quest_cuda; do
  timeout "$(cap 10)" "$B/bin/$t" > "$R/$t.log" 2>&1 || { rc=$?; status=1; echo "$t: rc $rc"; }
  stamp "$t"; summary "$R/$t.log"
done

# 2. The method table's RaaS prompt-Quest cells, 8 at once (the 8 cells of 8192 tokens first, ~15 s
#    each side by side, then the 8 of 4096, ~4 s); the JSON is rewritten after every cell.
if [ -z "${SKIP_TABLE:-}" ] && [ "$(left)" -gt 25 ]; then
  l=$(( $(left) - 2 ))
  timeout $l python3 bench/longctx/method_table.py --sieve "$B/bin/sieve" --device cuda \
    --out "$R/longctx_raas.json" --work "$R/lc" --calib-dir bench/longctx/calib --lengths 8192,4096 \
    --fractions 4,8,16,32 --tasks passkey,copy --methods "raas prefill_policy=quest" --instances 16 \
    --jobs 8 --deadline $(( l - 6 )) --stop $(( l - 1 )) > "$R/longctx.log" 2>&1
  stamp "method_table rc=$?"; tail -18 "$R/longctx.log"
fi

# 3. memcheck: the shared top-k (per-segment tails), then raas's prompt-Quest case (call A: both
#    0 errors in 1-2 s each on an H200).
if [ "$(left)" -gt 6 ]; then
  timeout "$(cap 8)" compute-sanitizer --tool memcheck --error-exitcode 9 "$B/bin/test_selection_cuda" \
    --gtest_filter='*TopKMatchesTheCpuBitForBit*' > "$R/memcheck_topk.log" 2>&1 || { rc=$?; status=1; echo "memcheck top-k: rc $rc"; }
  stamp "memcheck top-k"; grep -hE "ERROR SUMMARY|PASSED|FAILED" "$R/memcheck_topk.log" | head -4
fi
if [ "$(left)" -gt 6 ]; then
  timeout "$(cap 25)" compute-sanitizer --tool memcheck --error-exitcode 9 "$B/bin/test_plugin_raas_cuda" \
    --gtest_filter='*f32_prompt_quest*' > "$R/memcheck_raas.log" 2>&1 || { rc=$?; status=1; echo "memcheck raas: rc $rc"; }
  stamp "memcheck raas"; grep -hE "ERROR SUMMARY|PASSED|FAILED" "$R/memcheck_raas.log" | head -4
fi
# 4. Conformance with the prompt-Quest selection on the GPU too (call A: 28 passed, ~9 s).
if [ "$(left)" -gt 12 ]; then
  timeout "$(cap 12)" "$B/bin/sieve" conform "$B/lib/sieve/plugins/libsieve_raas.so" --param prefill_policy=quest \
    --param token_budget=64 --param prefill_budget=64 --param pin_prefill=true > "$R/conform.log" 2>&1 \
    || { rc=$?; status=1; echo "conform: rc $rc"; }
  stamp conform; grep -E "cuda|^PASS|^FAIL" "$R/conform.log" | head -12
fi
rm -rf "$R/lc"
tar czf "$OUT/h-raas.tgz" -C "$OUT" h-raas && rm -rf "$R"
exit $status
