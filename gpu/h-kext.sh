#!/usr/bin/env bash
# h-kext (issue 22 item 4: the core kernels' attention variant) on the GPU machine, one call, from
# the repository root:
#   1. build this tree (bench/device_all.sh --fresh --no-tests: everything, tests included, into
#      build-device-all) and, beside it, a baseline = this tree with gpu/h-kext-base.patch reversed
#      (main at aee063e: deltakv's and dpxa's own attention kernels) building sieve_bench only;
#   2. the CUDA tests touched: the core kernels (AttentionCuda*, AttentionVariantCuda), dpxa /
#      deltax and deltakv (test_plugin_dpxa*_cuda, test_plugin_deltakv_cuda);
#   3. compute-sanitizer memcheck on the deltax and deltakv CUDA test binaries and on the core
#      kernels' variant test;
#   4. the prefill policy bench rows of docs/results (deltax: prefill_deltax_speed_h200.md,
#      deltakv: prefill_deltakv.md) at 16K and 32K, baseline then this tree, same machine.
# Logs under $OUT: build.log, build-base.log, tests.log, memcheck.log, bench.log,
# bench_{base,new}_{deltax,deltakv}.json.
set -uo pipefail
OUT=${OUT:?}
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }

BASE=/tmp/hkext-base
rm -rf "$BASE" && mkdir -p "$BASE"
tar --exclude='./build*' --exclude='./.git' -cf - . | tar -xf - -C "$BASE"
(cd "$BASE" && patch -s -R -p1 < gpu/h-kext-base.patch) || { echo "baseline patch does not reverse"; exit 1; }
( cmake -S "$BASE" -B "$BASE/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS=OFF \
    -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" \
  && cmake --build "$BASE/build" -j 4 --target sieve_bench sieve_plugin_dpxa sieve_plugin_deltakv ) \
  > "$OUT/build-base.log" 2>&1 &
base_pid=$!
bash bench/device_all.sh --fresh --no-tests; new_rc=$?
wait $base_pid; base_rc=$?
stamp "build: new rc=$new_rc, base rc=$base_rc"
tail -3 "$OUT/build-base.log"
[ $new_rc = 0 ] || exit 1
B=build-device-all/bin

stamp "tests"
ctest --test-dir build-device-all -j 4 --timeout 240 --output-on-failure \
  -R 'cuda_test|kernels_variant|test_plugin_dpxa|test_plugin_deltakv' > "$OUT/tests.log" 2>&1
echo "ctest rc=$?"; grep -E "tests passed|tests failed|Failed|Timeout|Not Run|Skipped" "$OUT/tests.log" | head -20

stamp "memcheck"
: > "$OUT/memcheck.log"
for t in "$B/test_plugin_dpxa_deltax_cuda" "$B/test_plugin_deltakv_cuda" "$B/cuda_test --gtest_filter=AttentionVariantCuda.*"; do
  echo "== $t" >> "$OUT/memcheck.log"
  compute-sanitizer --tool memcheck --error-exitcode 9 $t --gtest_brief=1 >> "$OUT/memcheck.log" 2>&1
  echo "$t: memcheck rc=$?"
done

stamp "bench"
: > "$OUT/bench.log"
common="--policy --phase prefill --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 16384,32768 --batch 1"
for tree in base new; do
  if [ $tree = base ]; then [ $base_rc = 0 ] || continue; BB="$BASE/build/bin"; else BB="$B"; fi
  echo "== $tree deltax" >> "$OUT/bench.log"
  "$BB/sieve_bench" $common --chain 'prefill:*=dpxa(tau=0.9)' --chain 'prefill:*=dpxa(tau=0.9,mode=deltax)' \
    --keys similar:0.88 --steps 3 --warmup 1 --samples 1 --json="$OUT/bench_${tree}_deltax.json" >> "$OUT/bench.log" 2>&1
  echo "== $tree deltakv" >> "$OUT/bench.log"
  "$BB/sieve_bench" $common --chain 'prefill:*=deltakv(threshold=0.83)' --chain 'prefill:*=deltakv(threshold=0.78)' \
    --keys similar --steps 3 --warmup 1 --samples 1 --json="$OUT/bench_${tree}_deltakv.json" >> "$OUT/bench.log" 2>&1
  stamp "bench $tree done"
done
grep -E "deltax|deltakv|ctx" "$OUT/bench.log" | head -40
stamp "done"
