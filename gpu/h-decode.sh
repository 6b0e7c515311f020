#!/usr/bin/env bash
# h-decode (issue 20) on the GPU machine, one call, from the repository root; stops itself at
# ~100 s when the tree is prebuilt ($SIEVE_BUILD):
#   1. the CUDA tests of the touched code: the attention kernels against the f64 reference (the
#      row kernel's cluster merge and programmatic launch, the combine), LayerRunner's CUDA graphs,
#      the CUDA store, the policy bench's CUDA smoke test;
#   2. compute-sanitizer memcheck on the decode tests that run the cluster merge, the combine
#      kernel (tensor-core and FMA) and a graph capture;
#   3. the kernel suite's small decode cases (fixed cost per call: CUDA-graph replays, CUDA events)
#      and dense, baseline then this tree (this one with SDPA and the graph-launch floor);
#   4. the policy bench, dense, 32q/8kv d128 bf16 page 16, 1 layer, ctx 32K/128K x batch 1/16,
#      beside SDPA (eager step, graph step, core kernel), this tree, then the baseline if time is left.
#   bash gpu/h-decode.sh [BASE_TREE]
# BASE_TREE: main (4093434) with sieve_bench and the dense plugin built in BASE_TREE/build-base
# (not built here; without it the baseline rows are skipped). $SIEVE_BUILD: this tree's build
# directory, used as is; unset: bench/device_all.sh --fresh --no-tests builds it.
# Logs under $OUT: tests.log, memcheck.log, suite_{base,new}.{log,json}, policy_{base,new}.{log,json}.
set -uo pipefail
OUT=${OUT:?}
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt "$1" ] || { stamp "skipped (time): $2"; return 1; }; }

BASE=${1:-}
base_bin=
if [ -n "$BASE" ]; then
  base_bin=$(cd "$BASE" && pwd)/build-base/bin
  # Not built here: a build in the background would slow the other scripts of the call.
  [ -x "$base_bin/sieve_bench" ] || { echo "no baseline: $base_bin/sieve_bench is not built"; base_bin=; }
fi
B=${SIEVE_BUILD:-}
if [ -z "$B" ]; then
  bash bench/device_all.sh --fresh --no-tests || exit 1
  B=build-device-all
fi
stamp "build ready: $B"

timeout 45 ctest --test-dir "$B" -j 4 --timeout 40 --output-on-failure \
  -R 'AttentionCuda|AttentionVariantCuda|LayerGraphs|LayerRunnerCuda|PagedStoreCuda|policy_smoke_cuda' > "$OUT/tests.log" 2>&1
stamp "ctest rc=$?"; grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Not Run" "$OUT/tests.log" | head -20

before 50 memcheck && {
  timeout 25 compute-sanitizer --tool memcheck --error-exitcode 9 "$B/bin/cuda_test" --gtest_brief=1 \
    --gtest_filter='AttentionCudaTensorCores.DecodeSplitKvForced:AttentionCudaTensorCores.DecodeRaggedBatchWithIdleSplits:AttentionCudaTensorCores.CapturesIntoACudaGraph:AttentionCuda.DecodeSplitKvForced' \
    > "$OUT/memcheck.log" 2>&1
  stamp "memcheck rc=$? (9: errors found)"; grep -E "ERROR SUMMARY|FAILED" "$OUT/memcheck.log" | head -5
}


SUITE='gpu/decode/32q8kv128/bs(1|4|16)/ctx(8192|32768)/bf16/(dense|sparse0.90|sparse0.95)(/minkeys64|/splits8)?$'
POLICY=(--policy --phase decode --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 32768,131072
        --batch 1,16 --sdpa)
bin_of() { if [ "$1" = base ]; then echo "$base_bin"; else echo "$B/bin"; fi; }
run_suite() {
  local b; b=$(bin_of $1)
  [ -n "$b" ] && [ -x "$b/sieve_bench" ] || { stamp "no $1 sieve_bench"; return; }
  before "$2" "suite $1" || return
  timeout 12 "$b/sieve_bench" --filter="$SUITE" --json="$OUT/suite_$1.json" > "$OUT/suite_$1.log" 2>&1
  stamp "suite $1 rc=$?"
}
run_policy() {
  local b; b=$(bin_of $1)
  [ -n "$b" ] && [ -x "$b/sieve_bench" ] || return
  before "$2" "policy $1" || return
  timeout 16 "$b/sieve_bench" "${POLICY[@]}" --json="$OUT/policy_$1.json" > "$OUT/policy_$1.log" 2>&1
  stamp "policy $1 rc=$?"
}
# This tree first: when time runs short the baseline is what goes.
run_suite new 75
run_suite base 80
run_policy new 84
run_policy base 84
stamp done
