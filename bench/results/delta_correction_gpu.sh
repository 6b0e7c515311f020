#!/usr/bin/env bash
# delta_correction on the GPU machine: build the plugin, its CUDA test and sieve_bench; run the
# CUDA tests; time streaming + Δ against streaming alone, dense and PyTorch SDPA with
# `sieve_bench --policy --phase prefill` (32q/8kv, d 128, bf16). Logs and JSON go to $OUT.
#   bench/results/delta_correction_gpu.sh [--no-bench] [--sdpa] [--ctx 32768,131072] [--build DIR]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-device/out}
mkdir -p "$OUT"
B=build-device bench=1 sdpa="" ctx=32768,131072 tests=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-bench) bench=0 ;;
    --no-tests) tests=0 ;;
    --sdpa) sdpa=--sdpa ;;
    --ctx) ctx=$2; shift ;;
    --build) B=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
LOG="$OUT/delta_build.log"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$LOG" 2>&1
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" \
  >> "$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
cmake --build $B -j 16 --target test_plugin_delta_correction_cuda sieve_plugin_delta_correction \
  sieve_plugin_streaming sieve_plugin_dense sieve_bench >> "$LOG" 2>&1 ||
  { grep -E "error|FAILED" "$LOG" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
if [ $tests = 1 ]; then
  $B/bin/test_plugin_delta_correction_cuda > "$OUT/delta_cuda_test.log" 2>&1
  echo "test_plugin_delta_correction_cuda: rc=$?"; grep -E "^\[  (PASSED|FAILED|SKIPPED)|Failure|actual|CUDA vs" -A2 "$OUT/delta_cuda_test.log" | head -60
fi
if [ $bench = 1 ]; then
  W='prefill:*=streaming(sink=4,window=2048)'
  $B/bin/sieve_bench --policy --phase prefill --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 \
    --ctx "$ctx" --batch 1 --samples 3 $sdpa \
    --chain "$W" \
    --chain "$W>delta_correction(gamma=64,tail=128)" \
    --chain "$W>delta_correction(gamma=64,tail=128,anchor_kernel=rows)" \
    --json "$OUT/delta_policy_prefill.json" 2>&1 | tee "$OUT/delta_policy_prefill.txt"
fi
