#!/usr/bin/env bash
# Lead's call B, part 3 (after G1's suite and G3's timed regenerations, on the same warm machine): the branches'
# own GPU scripts, one at a time — the Python binding's cost, host time per layer call, the transformers step
# table and the five-line script (gpu/h-bind.sh; pytest ran in G1's ctest), the RaaS prompt-Quest long-context
# cells (gpu/h-raas.sh), the Quest bound kernel under ncu (gpu/h-qb.sh), the Hopper prefill's tests, stall
# profiles and per-kernel timeline (gpu/h-pf.sh), the host-side cost of a decode call (gpu/h-host.sh) — then
# compute-sanitizer memcheck on every CUDA test binary at once (one process each, sharing the GPU), each capped
# at MC_CAP s; rc 124 = ran out of time (the log shows how far it got), 9 = errors found.
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/x; mkdir -p $X/mc; st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
date -u > $X/summary.txt
run() {  # run <branch> <limit s> [VAR=value ...]
  local b=$1 t=$2; shift 2; mkdir -p $X/$b
  ( env OUT=$X/$b SIEVE_BUILD=build-device-all "$@" timeout $t bash gpu/$b.sh > $X/$b/stdout.txt 2>&1 ); st "$b rc=$?"
}
run h-bind 130 H_BIND_SECONDS=125 H_BIND_SPEED_SECONDS=75
run h-raas 45
run h-qb 40
[ -f gpu/h-pf.sh ] && run h-pf 100
[ -f gpu/h-host.sh ] && run h-host 40
B=build-device-all/bin; CAP=${MC_CAP:-150}
for t in $B/test_plugin_*_cuda $B/test_selection_cuda $B/cuda_test $B/hopper_test $B/sieve_engine_pool_test \
         $B/sieve_engine_identity_test "$B/sieve_runner_test --gtest_filter=LayerGraphs.*:LayerRunnerCuda*"; do
  n=$(basename ${t%% *})
  ( timeout $CAP compute-sanitizer --tool memcheck --error-exitcode 9 $t --gtest_brief=1 > $X/mc/$n.log 2>&1
    echo "$n rc=$? $(grep -E 'ERROR SUMMARY|PASSED|FAILED' $X/mc/$n.log | tr '\n' ' ')" > $X/mc/$n.rc ) &
done
wait
cat $X/mc/*.rc | tee -a $X/summary.txt
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
