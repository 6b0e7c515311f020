#!/usr/bin/env bash
# GPU request of h-hopper (issue 21): the Hopper prefill kernel (wgmma + TMA, SIEVE_CUDA_HOPPER=ON)
# after its overlap rework (intra-warpgroup overlap of S_j with P_{j-1}·V_{j-1}, ping-pong of the two
# consumer warpgroups, separate K and V rings). Steps in the order that localises a failure:
#   1. hopper_test: single-tile microtests (wgmma descriptors, register-A P·V, TMA swizzle).
#   2. cuda_test, the prefill tests: on sm_90 they run the Hopper kernel (plan "prefill-wgmma") for
#      head_dim 128 and page sizes 8..128 dividing 128, and the mma.sync kernel with hopper = false;
#      f64 reference, NaN-poisoned outputs. Then compute-sanitizer memcheck on two of them.
#   3. sieve_bench: dense + 90% sparse prefill 64q/8kv/128 bf16 at 16K, 32K, 64K with PyTorch SDPA
#      (--sdpa); at 16K the mma.sync kernel (--no-hopper) and the Hopper kernel with one query tile
#      per CTA (--hopper-ctas=1000000000: what persistence saves) in the same call.
#   4. If time is left: the prefill policy rows at 128K (DPXA, Delta-KV, streaming + Δ-correction),
#      then Nsight Compute's stall reasons for one dense launch where ncu exists.
# $SIEVE_BUILD: a build directory made with -DSIEVE_CUDA_HOPPER=ON (bench/device_all.sh's), used as
# is; unset: this script builds its own. The whole script stops itself at 150 s (HOPPER_LIMIT_S).
#   bash gpu/h-hopper.sh        (from the repository root; $OUT receives every log and JSON)
set -uo pipefail
T0=$(date +%s)
LIMIT=${HOPPER_LIMIT_S:-150}
# Every step runs under `within CAP cmd...`: at most CAP seconds and never past $LIMIT from the start;
# a step with under 10 s left is skipped, said so.
within() {
  local cap=$1 left=$(( LIMIT - ($(date +%s) - T0) )); shift
  [ $left -lt 10 ] && { echo "skipped (time): $*" | cut -c1-160; return 124; }
  timeout $(( cap < left ? cap : left )) "$@"
}
OUT=${OUT:-$PWD/build-device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
LOG="$OUT/build.log"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv; nvcc --version | tail -1
  git log --oneline -1; date -u; } > "$LOG" 2>&1
head -2 "$LOG"
B=${SIEVE_BUILD:-}
if [ -n "$B" ]; then
  grep -q "SIEVE_CUDA_HOPPER:BOOL=ON" "$B/CMakeCache.txt" || echo "warning: $B was not configured with SIEVE_CUDA_HOPPER=ON"
else
  B=build-hopper
  t0=$(date +%s)
  within 200 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS=ON \
    -DSIEVE_CUDA_HOPPER=ON -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" \
    >> "$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
  within 200 cmake --build $B -j 16 --target hopper_test cuda_test sieve_bench >> "$LOG" 2>&1 \
    || { grep -E "error|FAILED" "$LOG" | head -40; exit 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
  grep -E "spill|C75[0-9][0-9]" "$LOG" | grep -i "wgmma\|hopper\|sm90" | head -5
fi
status=0
summary() { grep -hE "^\[  (PASSED|FAILED|SKIPPED) |tests? ran|ERROR SUMMARY|Failure|error:" "$@" | head -25; }

# 1. Microtests (each alone would name a hang; together they take seconds).
within 30 $B/bin/hopper_test > "$OUT/hopper_test.log" 2>&1
rc=$?; echo "hopper_test: rc=$rc"; [ $rc = 0 ] || status=1
summary "$OUT/hopper_test.log"

# 2. The prefill kernel tests (Hopper path and mma.sync fallback), then memcheck on two of them.
F='AttentionCudaTensorCores.*:AttentionCuda.Prefill*:AttentionCuda.PageSizesThatAreNotPowersOfTwo:AttentionCuda.CapturesIntoACudaGraph'
within 90 $B/bin/cuda_test --gtest_filter="$F" > "$OUT/cuda_test.log" 2>&1
rc=$?; echo "cuda_test: rc=$rc"; [ $rc = 0 ] || status=1
summary "$OUT/cuda_test.log"
within 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/cuda_test \
  --gtest_filter='AttentionCudaTensorCores.PrefillGqaHeadDimsPageSizes:AttentionCudaTensorCores.BadEntriesAreSkippedAndReported' \
  > "$OUT/sanitizer.log" 2>&1
rc=$?; echo "memcheck cuda_test prefill: rc=$rc"; [ $rc = 0 ] || status=1
grep -h "ERROR SUMMARY" "$OUT/sanitizer.log"

# 3. Kernel suite rows: the Hopper kernel with SDPA at 16K-64K, the mma.sync kernel at 16K beside.
R='gpu/prefill/64q8kv128/bs1/ctx(16384|32768|65536)/bf16/(dense|sparse0.90)$'
within 100 $B/bin/sieve_bench --gpu-only --sdpa --filter="$R" --json="$OUT/bench_hopper.json" \
  > "$OUT/bench.log" 2>&1 || status=1
within 30 $B/bin/sieve_bench --gpu-only --no-hopper --filter='gpu/prefill/64q8kv128/bs1/ctx16384/bf16/(dense|sparse0.90)$' \
  --json="$OUT/bench_mmasync.json" >> "$OUT/bench.log" 2>&1 || status=1
within 30 $B/bin/sieve_bench --gpu-only --hopper-ctas=1000000000 \
  --filter='gpu/prefill/64q8kv128/bs1/ctx16384/bf16/(dense|sparse0.90)$' >> "$OUT/bench.log" 2>&1 || status=1
grep -E "^gpu/prefill.*(wgmma|mma) |prefill/64q8kv128|NOT MET|MET " "$OUT/bench.log" | grep -v iterations | head -30

# 4. Prefill policy rows at 128K (one sample each; the dense baseline runs on the same kernel).
within 60 $B/bin/sieve_bench --policy --phase prefill --chain 'prefill:*=dpxa(tau=0.9)' \
  --chain 'prefill:*=deltakv(threshold=0.83)' --chain 'prefill:*=streaming(sink=4,window=2048)>delta_correction(gamma=64)' \
  --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 131072 --batch 1 --keys similar:0.88 --samples 1 \
  --json="$OUT/policy_prefill_128k.json" > "$OUT/policy.log" 2>&1 || status=1
grep -E "dpxa|deltakv|delta_correction|dense" "$OUT/policy.log" | head -12
# 5. Stall reasons of the dense 16K launch, where Nsight Compute exists on the machine.
if command -v ncu > /dev/null; then
  within 60 ncu --kernel-name regex:prefill_wgmma --launch-count 1 --section SpeedOfLight --section WarpStateStats \
    --section ComputeWorkloadAnalysis $B/bin/sieve_bench --gpu-only --filter='gpu/prefill/64q8kv128/bs1/ctx16384/bf16/dense$' \
    > "$OUT/ncu.log" 2>&1; echo "ncu: rc=$?"
  grep -E "Stall|Throughput|Issue|Warp Cycles|Pipe" "$OUT/ncu.log" | head -30
else
  echo "ncu: absent"
fi
echo "status $status ($(( $(date +%s) - T0 )) s)"
exit $status
