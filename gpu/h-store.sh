#!/usr/bin/env bash
# h-store (issue 18, performance) on the GPU machine, from the repository root:
#   1. the engine-pool store's CUDA tests (sieve_engine_pool_test: round trips in every layout,
#      the new-page sidecar zeroing over poisoned memory, vLLM shapes, the host-side refusals;
#      sieve_engine_identity_test's CUDA case: every chain, Quest's sidecars included, over the
#      engine's shuffled pages bit for bit as over the core store), and compute-sanitizer memcheck
#      on the zeroing test (one kernel launch per page list);
#   2. sieve_bench --policy, core store against the engine pool (HND, NHD) in one run per shape
#      group, as in docs/bench/policy.md "Engine pool against the core store": prefill (the Quest
#      row was 1.043) first, then decode 128K x bs 16 (the Quest row was 1.040), then the other
#      decode shapes of the 12-row median set.
#   bash gpu/h-store.sh   ($OUT receives every log and JSON)
# With $SIEVE_BUILD set its build is used as is (bench/device_all.sh --fresh --no-tests builds
# everything this needs); otherwise this tree is built into build-store first. Stops itself
# 100 s after the build (each step gets what is left; a shape group that does not fit is skipped).
set -uo pipefail
OUT=${OUT:?}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=${SIEVE_BUILD:-}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git log --oneline -1; date -u; } > "$OUT/env.log" 2>&1
if [ -z "$B" ]; then
  B=build-store
  { cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS=ON \
      -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" &&
    cmake --build $B -j 16 --target sieve_bench sieve_plugin_quest sieve_plugin_raas sieve_plugin_streaming \
      sieve_engine_pool_test sieve_engine_identity_test; } > "$OUT/build.log" 2>&1 || { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
fi
T0=$(date +%s)
left() { echo $(( 100 - ($(date +%s) - T0) )); }
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
status=0

# 1. Tests.
timeout 20 $B/bin/sieve_engine_pool_test --gtest_filter='EnginePoolStore*:VllmShapes*' \
  > "$OUT/engine_pool_test.log" 2>&1 || status=1
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$OUT/engine_pool_test.log" | head -20
timeout 15 $B/bin/sieve_engine_identity_test --gtest_filter='EnginePoolIdentityCuda.*' > "$OUT/identity.log" 2>&1 || status=1
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |Failure" "$OUT/identity.log" | head -10
timeout 30 compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/sieve_engine_pool_test \
  --gtest_filter='EnginePoolStoreCuda.NewPagesSidecarsAreZeroed*' > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$? ($(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1))"
stamp "tests done"

# 2. Benchmarks: bf16 32q/8kv d128, page 16, one layer; paged, engine_pool (HND), engine_pool(layout=nhd).
P="$B/bin/sieve_bench --policy --device cuda --plugin-dir $B/lib/sieve/plugins --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16"
S=(--kv-store paged --kv-store engine_pool --kv-store 'engine_pool(layout=nhd)')
run() {  # name, then sieve_bench arguments
  local name=$1; shift
  local t; t=$(left)
  [ "$t" -gt 5 ] || { stamp "skipped (time): $name"; status=1; return; }
  timeout "$t" $P "$@" "${S[@]}" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 || status=1
  stamp "$name"; grep -E "step time: median" "$OUT/$name.log"
}
run prefill --phase prefill --ctx 32768 --new 4096 --batch 1 --samples 5 \
  --chain '*=quest(token_budget=2048)' --chain 'prefill:*=streaming(sink=4,window=2048)'
D=(--phase decode --steps 50 --warmup 5 --chain 'decode:*=quest(token_budget=2048)' --chain 'decode:*=raas(token_budget=2048)')
run decode_128k_bs16 "${D[@]}" --ctx 131072 --batch 16
run decode_32k "${D[@]}" --ctx 32768 --batch 1,16
run decode_128k_bs1 "${D[@]}" --ctx 131072 --batch 1
echo "status $status"
exit $status
