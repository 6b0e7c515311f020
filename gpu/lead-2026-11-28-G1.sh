#!/usr/bin/env bash
# Lead's call B, part 1 (fifth session, 2026-11-28 ~04:20 UTC): the integrated main built once and the whole
# test suite run on the GPU (every CUDA test really runs; python.pytest with torch 2.11 + transformers 5.17).
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/x; mkdir -p $X; st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > $X/summary.txt 2>&1
OUT=$X/build bash bench/device_all.sh --fresh --no-tests > $X/device_all.txt 2>&1; st "build rc=$? $(grep -E '^build:' $X/device_all.txt)"
timeout 420 ctest --test-dir build-device-all -j 10 --timeout 300 > $X/ctest.log 2>&1; st "ctest rc=$?"
grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Not Run|SKIPPED" $X/ctest.log | head -20 | tee -a $X/summary.txt
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
