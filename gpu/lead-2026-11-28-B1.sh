#!/usr/bin/env bash
# Lead's call B1 (2026-11-28 ~00:55 UTC): the integrated main built whole (Hopper ON), the whole suite,
# memcheck on every plugin's CUDA test, and beside them (accuracy only, not timed) longctx2's method table.
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/x; mkdir -p $X; st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; git log --oneline -1 2>/dev/null || cat COMMIT; } > $X/summary.txt 2>&1
OUT=$X/build bash bench/device_all.sh --fresh --no-tests > $X/device_all.txt 2>&1; st "build rc=$? $(grep -E '^build:' $X/device_all.txt)"
mkdir -p $X/lc; ( OUT=$X/lc SIEVE_BUILD=build-device-all LIMIT=330 timeout 345 bash gpu/h-longctx2.sh > $X/lc/stdout.txt 2>&1; echo "rc=$?" >> $X/lc/stdout.txt ) &
LP=$!
ctest --test-dir build-device-all -j 10 --timeout 200 --output-on-failure > $X/ctest.txt 2>&1; st "ctest rc=$?"
grep -E "tests passed|tests failed|\(Failed\)|Timeout|SEGFAULT|Exception" $X/ctest.txt | head -20 | tee -a $X/summary.txt
B=build-device-all/bin
( for t in $B/test_plugin_*_cuda $B/test_selection_cuda "$B/cuda_test" "$B/sieve_engine_pool_test" "$B/sieve_runner_test --gtest_filter=LayerGraphs.*"; do
    [ $SECONDS -lt 440 ] || { echo "== $t skipped (time)"; continue; }
    echo "== $t"; timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 $t --gtest_brief=1 2>&1 | tail -3; echo "rc=${PIPESTATUS[0]}"; done ) > $X/memcheck.log 2>&1
grep -E "^==|rc=|ERROR SUMMARY" $X/memcheck.log | tee -a $X/summary.txt
wait $LP; st "longctx2 $(tail -1 $X/lc/stdout.txt)"
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
