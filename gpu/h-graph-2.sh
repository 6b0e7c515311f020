#!/usr/bin/env bash
# h-graph, second GPU call (< 3 min): the split rule back to one split per 256 keys begun (call 1
# showed one split of 7 tiles slower than 2 of 4: 11.3 -> 14.6 us), with one-split rows still
# skipping the combine; and the same small block-sparse cases with one split per 64-key tile
# (suite cases .../minkeys64), to see whether finer splits cut the fixed cost. Builds only what it
# runs (this tree; the baseline is call 1's suite.log, same GPU type), then the attention tests,
# memcheck on the tensor-core decode tests, the graph test, and the suite cases.
# Logs under $OUT: build.log, tests.log, memcheck.log, suite.log, timers.{log,json}.
set -uo pipefail
OUT=${OUT:?}
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
B=build-hgraph2
rm -rf $B
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > "$OUT/build.log" 2>&1
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS=ON \
  -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" >> "$OUT/build.log" 2>&1 &&
  cmake --build $B -j 16 --target sieve_bench cuda_test sieve_runner_test sieve_plugin_dense sieve_plugin_streaming \
    sieve_plugin_quest >> "$OUT/build.log" 2>&1
rc=$?; stamp "build rc=$rc"; [ $rc = 0 ] || { grep -E "error|FAILED" "$OUT/build.log" | head -20; exit 1; }

timeout 60 $B/bin/sieve_bench --filter='gpu/decode/32q8kv128/bs(1|4|16)/ctx(8192|32768)/bf16/(dense|sparse0.90|sparse0.95)(/minkeys64)?$' \
  > "$OUT/suite.log" 2>&1
stamp "suite rc=$?"
timeout 90 $B/bin/cuda_test --gtest_filter='AttentionCuda*' --gtest_brief=1 > "$OUT/tests.log" 2>&1
stamp "cuda_test AttentionCuda* rc=$?"
timeout 40 $B/bin/sieve_runner_test --gtest_filter='LayerGraphs.*:LayerRunnerCuda.*' --gtest_brief=1 >> "$OUT/tests.log" 2>&1
stamp "sieve_runner_test LayerGraphs rc=$?"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/cuda_test \
  --gtest_filter='AttentionCudaTensorCores.Decode*' --gtest_brief=1 > "$OUT/memcheck.log" 2>&1
stamp "memcheck rc=$?"
# Where a replayed step's time goes on the host (batch 1 x 32K, dense): SIEVE_HOST_TIMERS=1 makes
# the runner report host_us.append / view / graph (the key and cudaGraphLaunch) as metrics (the
# append and view means cover both passes, eager and graphed).
SIEVE_HOST_TIMERS=1 timeout 60 $B/bin/sieve_bench --policy --phase decode --layers 1 --hq 32 --hkv 8 --d 128 --page 16 \
  --dtype bf16 --ctx 32768 --batch 1,16 --json="$OUT/timers.json" > "$OUT/timers.log" 2>&1
stamp "policy with host timers rc=$?"
