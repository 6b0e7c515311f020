#!/usr/bin/env bash
# DPXA prefill speed on the GPU machine (docs/results/prefill_dpxa.md section 3): builds the bench,
# the plugin and its CUDA test, runs the test (+ memcheck), the policy-step bench at 32K and 128K,
# and ncu kernel times of one dpxa selection at 128K. Logs go to $OUT (default /tmp/dpxa_speed).
# Usage (repository root, CUDA machine): bench/results/dpxa_speed.sh [build-dir]
set -uo pipefail
OUT=${OUT:-/tmp/dpxa_speed}
BD=${1:-build-device}
mkdir -p "$OUT"
SECONDS=0
cmake -S . -B "$BD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON \
  -DCMAKE_PREFIX_PATH=$PWD/.devdeps/usr -DDLPACK_INCLUDE_DIR=$PWD/.devdeps/usr/include > "$OUT/cfg.log" 2>&1 &&
  cmake --build "$BD" -j16 --target sieve_bench sieve_plugin_dpxa test_plugin_dpxa_cuda > "$OUT/build.log" 2>&1
echo "build rc=$? ${SECONDS}s"
T=$BD/bin/test_plugin_dpxa_cuda
timeout 60 "$T" --gtest_brief=1 > "$OUT/test.log" 2>&1
echo "test rc=$?"; tail -20 "$OUT/test.log" | cut -c1-300
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$T" --gtest_brief=1 > "$OUT/memcheck.log" 2>&1
echo "memcheck rc=$? ${SECONDS}s"; tail -3 "$OUT/memcheck.log" | cut -c1-200
B=$BD/bin/sieve_bench
GEO=(--layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --batch 1 --keys similar:0.88)
timeout 100 "$B" --policy --phase prefill --chain 'prefill:*=dpxa(tau=0.9)' \
  --chain 'prefill:*=dpxa(thresholds=docs/results/prefill_dpxa_tau_dpxa_synthetic_32h_r9.txt)' \
  --chain 'prefill:*=dpxa(estimator=xattn,tau=0.9)' --chain 'prefill:*=dpxa(estimator=stride,tau=0.9)' \
  "${GEO[@]}" --ctx 32768,131072 --samples 3 --sdpa --json="$OUT/bench.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$? ${SECONDS}s"; sed -n '/== Sieve policy step/,$p' "$OUT/bench.log" | cut -c1-170 | head -13
ONE=(--policy --phase prefill --chain 'prefill:*=dpxa(tau=0.9)' "${GEO[@]}" --samples 1)
timeout 50 ncu --clock-control none -k regex:'scores|greedy|anchors|counts_k|write_k|offsets' \
  --launch-count 6 --metrics gpu__time_duration.sum "$B" "${ONE[@]}" --ctx 131072 > "$OUT/ncu_131072.log" 2>&1
echo "ncu rc=$? ${SECONDS}s"
grep -E "^  [^ ]|gpu__time" "$OUT/ncu_131072.log" | sed -E 's/\(const sieve.*|\(SequenceLaunch.*//; s/.*::([a-z_]+).*/\1/' |
  paste - - | awk '{print $1, $(NF-1), $NF}'
if [ "${DETAIL:-1}" = 1 ]; then
  timeout 60 ncu -k regex:scores_mma --launch-count 1 --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section ComputeWorkloadAnalysis "$B" "${ONE[@]}" --ctx 32768 > "$OUT/ncu_detail.log" 2>&1
  echo "ncu detail rc=$?"
  grep -E "Throughput|Duration|Achieved Occupancy|Stall|Issue Slots|Executed Ipc|Registers|Theoretical Occ" "$OUT/ncu_detail.log" | head -24
fi
