#!/usr/bin/env bash
# Lead's call B, part 2: first, alone on the GPU, the Python binding's cost, the host time per layer call and the
# transformers step table with the five-line script (gpu/h-bind.sh; pytest ran in part 1's ctest); then compute-sanitizer memcheck on every CUDA test binary, all at once (one process each,
# sharing the GPU), each capped; rc 124 = ran out of time (the log shows how far it got), 9 = errors found.
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/x; mkdir -p $X/mc $X/py; st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
( OUT=$X/py SIEVE_BUILD=build-device-all H_BIND_SECONDS=140 H_BIND_SPEED_SECONDS=85 timeout 150 bash gpu/h-bind.sh > $X/py/stdout.txt 2>&1 ); st "py rc=$?"
mkdir -p $X/raas; ( OUT=$X/raas SIEVE_BUILD=build-device-all timeout 50 bash gpu/h-raas.sh > $X/raas/stdout.txt 2>&1 ); st "raas (tests + long-context cells) rc=$?"
B=build-device-all/bin; CAP=${MC_CAP:-230}
for t in $B/test_plugin_*_cuda $B/test_selection_cuda $B/cuda_test $B/hopper_test $B/sieve_engine_pool_test \
         $B/sieve_engine_identity_test "$B/sieve_runner_test --gtest_filter=LayerGraphs.*:LayerRunnerCuda*"; do
  n=$(basename ${t%% *})
  ( timeout $CAP compute-sanitizer --tool memcheck --error-exitcode 9 $t --gtest_brief=1 > $X/mc/$n.log 2>&1
    echo "$n rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $X/mc/$n.log | tr '\n' ' ')" > $X/mc/$n.rc ) &
done
wait
cat $X/mc/*.rc | tee -a $X/summary.txt
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
