#!/usr/bin/env bash
# GPU request of h-store18 (issue 18): the engine-pool store against the core paged store on the
# GPU, in one sieve_bench run per phase (each chain on every store in turn, same contents), and the
# CUDA half of the engine-pool identity tests. Target: engine pool within 3 % of the core store.
#   bash gpu/h-store18.sh        (from the repository root; $OUT receives every log and JSON)
# Builds only what it runs (sieve_bench, three plugins, two test binaries) into build-store18.
set -uo pipefail
OUT=${OUT:-$PWD/build-device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=build-store18
rm -rf $B
LOG="$OUT/build.log"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvcc --version | tail -1; git log --oneline -1; date -u; } > "$LOG" 2>&1
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS=ON \
  -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" >> "$LOG" 2>&1 \
  || { tail -30 "$LOG"; exit 1; }
cmake --build $B -j 16 --target sieve_bench sieve_plugin_dense sieve_plugin_quest sieve_plugin_raas \
  sieve_plugin_streaming sieve_engine_pool_test sieve_engine_identity_test >> "$LOG" 2>&1 \
  || { grep -E "error|FAILED" "$LOG" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
status=0

# 1. Identity on CUDA: every chain over the engine's shuffled pages (hnd, nhd, combined) equals the
#    core store bit for bit (f32 and bf16); the store's own tests (vLLM shapes, refusals).
timeout 150 $B/bin/sieve_engine_identity_test > "$OUT/identity.log" 2>&1 || status=1
timeout 90 $B/bin/sieve_engine_pool_test > "$OUT/engine_pool_test.log" 2>&1 || status=1
grep -hE "^\[  (PASSED|FAILED|SKIPPED) |tests? ran" "$OUT/identity.log" "$OUT/engine_pool_test.log"

# 2. Decode: bf16 32q/8kv d128 page 16, ctx 32K and 128K, batch 1 and 16, dense + Quest + RaaS at a
#    budget of 2048, on paged, engine_pool (HND) and engine_pool(layout=nhd).
P="$B/bin/sieve_bench --policy --device cuda --plugin-dir $B/lib/sieve/plugins --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16"
timeout 240 $P --phase decode --ctx 32768,131072 --batch 1,16 --steps 50 --warmup 5 \
  --chain 'decode:*=quest(token_budget=2048)' --chain 'decode:*=raas(token_budget=2048)' \
  --kv-store paged --kv-store engine_pool --kv-store 'engine_pool(layout=nhd)' \
  --json "$OUT/store_decode.json" > "$OUT/store_decode.log" 2>&1 || status=1
tail -3 "$OUT/store_decode.log"

# 3. Prefill: the last 4096 tokens of 32K, batch 1, dense + Quest + StreamingLLM.
timeout 150 $P --phase prefill --ctx 32768 --new 4096 --batch 1 --samples 5 \
  --chain '*=quest(token_budget=2048)' --chain 'prefill:*=streaming(sink=4,window=2048)' \
  --kv-store paged --kv-store engine_pool --kv-store 'engine_pool(layout=nhd)' \
  --json "$OUT/store_prefill.json" > "$OUT/store_prefill.log" 2>&1 || status=1
tail -3 "$OUT/store_prefill.log"
echo "status $status"
exit $status
