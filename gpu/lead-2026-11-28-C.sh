#!/usr/bin/env bash
# Lead's last GPU call of 2026-11-28 (~01:15 UTC, ~5 min of device time left): main after the fixes that
# followed call B — the CUDA kernel tests (the decode revert, the negative-scale bound), the Python import-order
# test, the binding cost and the transformers step table (issue 19).
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/x; mkdir -p $X/py; st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > $X/summary.txt 2>&1
OUT=$X/build bash bench/device_all.sh --fresh --no-tests > $X/device_all.txt 2>&1; st "build rc=$? $(grep -E '^build:' $X/device_all.txt)"
B=build-device-all/bin
timeout 90 $B/cuda_test --gtest_brief=1 > $X/cuda_test.log 2>&1; st "cuda_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $X/cuda_test.log | tr '\n' ' ')"
timeout 40 $B/sieve_runner_test --gtest_filter='LayerGraphs.*:LayerRunnerCuda*' --gtest_brief=1 > $X/runner.log 2>&1; st "runner rc=$? $(grep -E '^\[  (PASSED|FAILED) ' $X/runner.log | tr '\n' ' ')"
export PYTHONPATH=$R/build-device-all/python SIEVE_TEST_PLUGIN_DIR=$R/build-device-all/lib/sieve/plugins SIEVE_TEST_BIN_DIR=$R/build-device-all/bin PYTHONUNBUFFERED=1
timeout 90 python3 -m pytest -q -rs -p no:cacheprovider python/tests/test_torch.py -k import_in_either_order > $X/py/test_torch.log 2>&1; st "test_torch rc=$? $(tail -1 $X/py/test_torch.log)"
L=$((330 - SECONDS)); [ $L -gt 170 ] && L=170
( OUT=$X/py H_PY_SECONDS=$((L - 10)) SIEVE_BUILD=build-device-all timeout $L bash gpu/h-py.sh speed > $X/py/stdout.txt 2>&1 ); st "py speed rc=$? (limit $L s)"
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
