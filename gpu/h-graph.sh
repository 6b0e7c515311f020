#!/usr/bin/env bash
# h-graph (issue 20) on the GPU machine, one call, from the repository root:
#   1. build this tree (bench/device_all.sh --fresh --no-tests: everything, tests included, into
#      build-device-all) and, beside it, the baseline tree given as $1 (optional; call 2 used main
#      at aee063e), sieve_bench only;
#   2. the CUDA tests touched: LayerRunner's CUDA graphs (bit-identical to eager), the attention
#      kernels (f64 reference), the CUDA store, the policy bench's CUDA smoke test;
#   3. the policy bench, dense, 32q/8kv d128 bf16 page 16, 1 layer, ctx 32K/128K x batch 1/16,
#      beside SDPA: baseline, then this tree (its rows carry step ms eager and graph ms);
#   4. compute-sanitizer memcheck on the graph test and on the tensor-core decode kernel tests;
#   5. the kernel suite's small block-sparse decode cases (fixed cost per call), baseline and new.
#   bash gpu/h-graph.sh [BASELINE_TREE]
# Logs under $OUT: build.log, tests.log, memcheck.log, policy.log, policy_{base,new}.json, suite.log.
set -uo pipefail
OUT=${OUT:?}
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
before() { [ $(( $(date +%s) - T0 )) -lt "$1" ] || { stamp "skipped (time): $2"; return 1; }; }  # keep under ~8 min

BASE=${1:-}  # a baseline tree (e.g. a copy of main), optional
base_pid=
if [ -n "$BASE" ]; then
  BASE=$(cd "$BASE" && pwd)
  ( cmake -S "$BASE" -B "$BASE/build-hgraph-base" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON \
      -DSIEVE_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" \
    && cmake --build "$BASE/build-hgraph-base" -j 4 --target sieve_bench ) > "$OUT/build-base.log" 2>&1 &
  base_pid=$!
fi
bash bench/device_all.sh --fresh --no-tests; new_rc=$?
base_rc=-; [ -n "$base_pid" ] && { wait $base_pid; base_rc=$?; tail -3 "$OUT/build-base.log"; }
stamp "build: new rc=$new_rc, base rc=$base_rc"
[ $new_rc = 0 ] || exit 1
B=build-device-all/bin

stamp "tests"
ctest --test-dir build-device-all -j 4 --timeout 240 --output-on-failure \
  -R 'LayerGraphs|LayerRunnerCuda|AttentionCuda|PagedStoreCuda|policy_smoke_cuda' > "$OUT/tests.log" 2>&1
echo "ctest rc=$?"; grep -E "tests passed|tests failed|Failed|Timeout|Not Run|Skipped" "$OUT/tests.log" | head -20

P="--policy --phase decode --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 32768,131072 --batch 1,16 --sdpa"
: > "$OUT/policy.log"
for v in base new; do
  b=$B; [ $v = base ] && b=${BASE:+$BASE/build-hgraph-base/bin}
  [ -n "$b" ] && [ -x $b/sieve_bench ] || { echo "no $v sieve_bench"; continue; }
  before 380 "policy $v" || continue
  stamp "policy $v"
  echo "==== policy $v" >> "$OUT/policy.log"
  timeout 150 $b/sieve_bench $P --json="$OUT/policy_$v.json" >> "$OUT/policy.log" 2>&1
  echo "policy $v: rc=$?"
done

before 400 memcheck && {
stamp "memcheck"
: > "$OUT/memcheck.log"
for t in "sieve_runner_test --gtest_filter=LayerGraphs.*" \
         "cuda_test --gtest_filter=AttentionCudaTensorCores.Decode*"; do
  echo "== $t" >> "$OUT/memcheck.log"
  timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $B/$t --gtest_brief=1 >> "$OUT/memcheck.log" 2>&1
  echo "memcheck $t: rc=$?"
done
}

: > "$OUT/suite.log"
for v in base new; do
  b=$B; [ $v = base ] && b=${BASE:+$BASE/build-hgraph-base/bin}
  [ -n "$b" ] && [ -x $b/sieve_bench ] || continue
  before 450 "suite $v" || continue
  stamp "suite $v"
  echo "==== suite $v" >> "$OUT/suite.log"
  timeout 90 $b/sieve_bench --filter='gpu/decode/32q8kv128/bs(1|4|16)/ctx(8192|32768)/bf16/(dense|sparse0.90|sparse0.95)$' \
    >> "$OUT/suite.log" 2>&1
  echo "suite $v: rc=$?"
done
stamp "done"
