#!/usr/bin/env bash
# Lead's call D of the sixth session: the committed tree as it is (main after 3f8ead1: two TMA producer
# warps), built fresh: the whole test suite (ctest), memcheck of the Hopper prefill tests with odd
# pages, the prefill rows at 16K/32K (a check against call C's suite), and the 64q/8kv decode suite
# beside SDPA (the headline decode shape, which the fifth session's call B did not re-run).
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/d; mkdir -p $X
st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > $X/summary.txt 2>&1
BD=build-device-all; B=$BD/bin
OUT=$X/build timeout 300 bash bench/device_all.sh --fresh --no-tests > $X/build.txt 2>&1; st "build rc=$? $(tail -1 $X/build.txt)"
timeout 280 ctest --test-dir $BD -j 10 --timeout 250 > $X/ctest.log 2>&1
st "ctest rc=$? $(grep -E 'tests passed|tests failed' $X/ctest.log)"
grep -E "\*\*\*Failed|Timeout|Not Run" $X/ctest.log | head
timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $B/cuda_test --gtest_brief=1 \
  --gtest_filter='AttentionCudaTensorCores.PrefillBlockSelections:AttentionCudaTensorCores.BadEntriesAreSkippedAndReported:AttentionCuda.PageSizesThatAreNotPowersOfTwo:AttentionCudaTensorCores.PrefillGqaHeadDimsPageSizes' \
  > $X/memcheck.log 2>&1; st "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $X/memcheck.log | tail -1)"
timeout 30 $B/sieve_bench --gpu-only --filter='gpu/prefill/(64q8kv128|32q8kv128)/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)$' \
  --json=$X/rows.json > $X/rows.log 2>&1; st "prefill rows rc=$?"
grep -E '^gpu/prefill' $X/rows.log | grep -v iterations | cut -c1-150
timeout 60 $B/sieve_bench --sdpa --filter='gpu/decode/64q8kv128/bs(1|4|16)/ctx(8192|32768|131072)/bf16/(dense|sparse0.90|sparse0.95)$' \
  --json=$X/suite_decode_64q.json > $X/suite_decode_64q.log 2>&1; st "decode suite 64q rc=$?"
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
