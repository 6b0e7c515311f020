#!/usr/bin/env bash
# GPU request of h-hopper (issue 21): the Hopper prefill path (wgmma + TMA, SIEVE_CUDA_HOPPER=ON),
# never run on a GPU before this. Steps in the order that localises a failure:
#   1. hopper_test: single-tile microtests. QkFromSwizzledSharedMemory proves the wgmma
#      descriptors and the 128-byte swizzle; PvWithRegisterA... the register-A fragment and the
#      transposed (MN-major) V descriptor; TmaLoadsShuffledPages... the tensor map and the TMA
#      engine's swizzle byte for byte. A failure here explains any failure below.
#   2. cuda_test, the tensor-core prefill tests: on an sm_90 device they run the Hopper kernel
#      (plan "prefill-wgmma") for head_dim 128 and page sizes 8..128 dividing 128, the mma.sync
#      kernel for the rest and again with options.hopper = false; f64 reference, NaN-poisoned
#      outputs, GQA groups, ragged last pages, selections with empty rows, bad entries.
#   3. compute-sanitizer memcheck (and synccheck on the microtests) over both.
#   4. sieve_bench: dense + 90% sparse prefill 64q/8kv/128 bf16 at 16K and 32K, Hopper kernel and
#      the mma.sync kernel (--no-hopper) in the same run, PyTorch SDPA alongside (--sdpa).
#   bash gpu/h-hopper.sh        (from the repository root; $OUT receives every log and JSON)
set -uo pipefail
T0=$(date +%s)
# Every step runs under `within CAP cmd...`: at most CAP seconds and never past 460 s from the start
# (the call's 8 minutes, less the transfers); a step with under 10 s left is skipped, said so.
within() {
  local cap=$1 left=$(( 460 - ($(date +%s) - T0) )); shift
  [ $left -lt 10 ] && { echo "skipped (time): $*" | cut -c1-120; return 124; }
  timeout $(( cap < left ? cap : left )) "$@"
}
OUT=${OUT:-$PWD/build-device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=build-hopper
rm -rf $B
LOG="$OUT/build.log"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv; nvcc --version | tail -1
  git log --oneline -1; date -u; } > "$LOG" 2>&1
head -2 "$LOG"
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS=ON -DSIEVE_CUDA_HOPPER=ON \
  -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" >> "$LOG" 2>&1 \
  || { tail -30 "$LOG"; exit 1; }
cmake --build $B -j 16 --target hopper_test cuda_test sieve_bench >> "$LOG" 2>&1 \
  || { grep -E "error|FAILED" "$LOG" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
grep -E "spill|C75[0-9][0-9]" "$LOG" | grep -i "wgmma\|hopper\|sm90" | head -5
status=0
summary() { grep -hE "^\[  (PASSED|FAILED|SKIPPED) |tests? ran|ERROR SUMMARY|Failure|error:" "$@" | head -25; }

# 1. Microtests, each alone so a hang (an mbarrier that never flips) names its test.
for t in QkFromSwizzledSharedMemoryMatchesF64 PvWithRegisterAAndTransposedBMatchesF64 TmaLoadsShuffledPagesSwizzledThenQk; do
  within 30 $B/bin/hopper_test --gtest_filter="HopperTile.$t" >> "$OUT/hopper_test.log" 2>&1
  rc=$?; echo "hopper_test $t: rc=$rc"; [ $rc = 0 ] || status=1
done
within 10 $B/bin/hopper_test --gtest_filter='HopperTensorMap.*' >> "$OUT/hopper_test.log" 2>&1 || status=1
summary "$OUT/hopper_test.log"

# 2. The prefill kernel tests (Hopper path and mma.sync fallback).
F='AttentionCudaTensorCores.*:AttentionCuda.Prefill*:AttentionCuda.PageSizesThatAreNotPowersOfTwo:AttentionCuda.CapturesIntoACudaGraph'
within 120 $B/bin/cuda_test --gtest_filter="$F" > "$OUT/cuda_test.log" 2>&1
rc=$?; echo "cuda_test: rc=$rc"; [ $rc = 0 ] || status=1
summary "$OUT/cuda_test.log"

# 3. Sanitizers (a hang or an out-of-bounds TMA / shared access shows here first).
within 40 compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/hopper_test > "$OUT/sanitizer.log" 2>&1
rc=$?; echo "memcheck hopper_test: rc=$rc"; [ $rc = 0 ] || status=1
within 40 compute-sanitizer --tool synccheck --error-exitcode 9 $B/bin/hopper_test --gtest_filter='HopperTile.*' \
  >> "$OUT/sanitizer.log" 2>&1
rc=$?; echo "synccheck hopper_test: rc=$rc"; [ $rc = 0 ] || status=1
within 70 compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/cuda_test \
  --gtest_filter='AttentionCudaTensorCores.PrefillGqaHeadDimsPageSizes:AttentionCudaTensorCores.BadEntriesAreSkippedAndReported' \
  >> "$OUT/sanitizer.log" 2>&1
rc=$?; echo "memcheck cuda_test prefill: rc=$rc"; [ $rc = 0 ] || status=1
grep -h "ERROR SUMMARY" "$OUT/sanitizer.log"

# 4. Bench: the Hopper kernel (with SDPA) and the mma.sync kernel, same shapes, same machine.
R='gpu/prefill/64q8kv128/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)$'
within 100 $B/bin/sieve_bench --gpu-only --sdpa --filter="$R" --json="$OUT/bench_hopper.json" \
  > "$OUT/bench.log" 2>&1 || status=1
within 60 $B/bin/sieve_bench --gpu-only --no-hopper --filter="$R" --json="$OUT/bench_mmasync.json" \
  >> "$OUT/bench.log" 2>&1 || status=1
grep -E "prefill|kernel|TFLOP|sdpa" "$OUT/bench.log" | head -30
echo "status $status"
exit $status
