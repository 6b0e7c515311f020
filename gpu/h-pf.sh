#!/usr/bin/env bash
# GPU request of h-pf (issue 21: the prefill misses' stall reasons; the sparse0.50 suite failure).
# From the repository root; $OUT receives everything (h-pf.tgz + summary.txt). Stops itself at
# PF_LIMIT_S (100) seconds. $SIEVE_BUILD: a build made with -DSIEVE_CUDA_HOPPER=ON
# (bench/device_all.sh's build-device-all), used as is; unset: built here.
#   0. The Hopper kernel's correctness after 332d2fc (its non-TMA page copy) and a4842a4 (K issued a
#      tile ahead of V): cuda_test's prefill tests that cover them (ragged pages, page sizes 8..64
#      incl. 24, bad page ids, block selections with empty rows; ~6 s; the 45 s
#      PrefillLongPromptsManyTiles only with PF_LONG_TEST=1, else left to ctest), then
#      compute-sanitizer memcheck on the bad-page-id and page-size-24 tests; delta_correction's CUDA
#      tests (its Δ update, 8c5c533).
#   1. The suite case that failed its device check in B2 (16K 50% sparse), the 16K and 32K dense and
#      50/90/95% rows (the per-tile fit of docs/bench/README.md before/after 332d2fc), 32q/8kv 16K
#      dense and 90% (the item order of 7ec7c09; 64q 64K dense: that order spreads a round over every
#      KV head, more K/V in flight for L2), and
#      bench_device_arena_test (the uploads land in stream order).
#   2. Nsight Compute (--clock-control none) on the Hopper prefill kernel: dense 32K and 90%
#      sparse 16K of the kernel suite; sections SpeedOfLight, WarpStateStats, SchedulerStats,
#      Occupancy, MemoryWorkloadAnalysis, ComputeWorkloadAnalysis; the top stall reasons printed.
#   3. The prefill policy step at 128K (similar keys as the report's rows, a 2K-token period: ~2 s of
#      host generation; with random keys call A's DPXA attended 90% and scored for 890 ms) under ncu
#      with one metric
#      (gpu__time_duration) on every kernel: the per-kernel split of streaming + delta_correction's
#      "select" column and of DPXA's scoring.
#   4. The same sections on DPXA's selection kernels (anchors, tile scores, greedy cover) and on
#      delta_correction's anchor pass (its far-key call of the Hopper kernel: the first
#      prefill_wgmma launch after its gather kernel, counted in 3.), at 128K.
set -uo pipefail
T0=$(date +%s)
LIMIT=${PF_LIMIT_S:-100}
within() {  # within CAP cmd...: at most CAP s and never past LIMIT; skipped with under 8 s left
  local cap=$1 left=$((LIMIT - ($(date +%s) - T0))); shift
  [ $left -lt 8 ] && { st "skipped (time): $*"; return 124; }
  timeout $((cap < left ? cap : left)) "$@"
}
OUT=${OUT:-$PWD/build-device-out}
X=$OUT/h-pf
mkdir -p "$X"
st() { echo "[$(($(date +%s) - T0)) s] $*" | tee -a "$X/summary.txt"; }
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; git log --oneline -1; date -u
  command -v ncu > /dev/null && ncu --version | tail -1; } > "$X/summary.txt" 2>&1
cat "$X/summary.txt"
B=${SIEVE_BUILD:-}
if [ -z "$B" ]; then
  B=build-device-all
  within 400 bash bench/device_all.sh --no-tests > "$X/build.log" 2>&1 || { st "build failed"; tail -20 "$X/build.log"; }
fi
BIN=$B/bin
P=gpu/ncu_summary.py
R=/tmp/h-pf-ncu; rm -rf $R; mkdir -p $R  # reports stay here; their text comes back
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis"

# ncu_sections NAME KERNEL_REGEX SKIP COUNT CAP CMD...: the sections on COUNT launches after SKIP (CAP s).
ncu_sections() {
  local name=$1 k=$2 skip=$3 count=$4 cap=$5; shift 5
  within $cap ncu --clock-control none $SECTIONS -k "regex:$k" --launch-skip $skip --launch-count $count \
    -o $R/$name -f "$@" > "$X/ncu_$name.app.log" 2>&1
  local rc=$?
  if [ -f $R/$name.ncu-rep ]; then
    ncu -i $R/$name.ncu-rep --page details > "$X/ncu_$name.details.txt" 2>&1
    ncu -i $R/$name.ncu-rep --page raw --csv > "$X/ncu_$name.raw.csv" 2>&1
    python3 $P stalls "$X/ncu_$name.raw.csv" > "$X/ncu_$name.stalls.txt" 2>&1
  fi
  st "ncu $name rc=$rc"
  cat "$X/ncu_$name.stalls.txt" 2>/dev/null | head -40
}

# 0. Correctness of the Hopper kernel's page copy (332d2fc).
TF='AttentionCudaTensorCores.PrefillGqaHeadDimsPageSizes:AttentionCudaTensorCores.PrefillBlockSelections:AttentionCudaTensorCores.BadEntriesAreSkippedAndReported:AttentionCudaTensorCores.PrefillScaleSignPicksTheKernel:AttentionCudaTensorCores.EngineLayoutsGiveBitIdenticalOutputs:AttentionCuda.PageSizesThatAreNotPowersOfTwo'
# PF_LONG_TEST=1 adds PrefillLongPromptsManyTiles (~45 s on an H100): the rings wrapping across
# items with 1, 3 and 132 persistent CTAs, the case a4842a4's issue order changes.
[ "${PF_LONG_TEST:-0}" = 1 ] && TF="$TF:AttentionCudaTensorCores.PrefillLongPromptsManyTiles"
within $([ "${PF_LONG_TEST:-0}" = 1 ] && echo 75 || echo 25) $BIN/cuda_test --gtest_filter="$TF" > "$X/cuda_test.log" 2>&1
st "cuda_test (Hopper prefill subset) rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' "$X/cuda_test.log" | tr '\n' ' ')"
grep -h "Failure" -A3 "$X/cuda_test.log" | head -12

# 0a. delta_correction's CUDA tests (8c5c533's 16-byte Δ update: bf16 rows against the CPU path).
if [ -x $BIN/test_plugin_delta_correction_cuda ]; then
  within 40 $BIN/test_plugin_delta_correction_cuda > "$X/delta_correction_test.log" 2>&1
  st "test_plugin_delta_correction_cuda rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' "$X/delta_correction_test.log" | tr '\n' ' ')"
fi

# 0b. memcheck on the tests that take the copy's odd paths (bad page ids, page size 24).
if command -v compute-sanitizer > /dev/null; then
  within 15 compute-sanitizer --tool memcheck --error-exitcode 9 $BIN/cuda_test \
    --gtest_filter='AttentionCudaTensorCores.BadEntriesAreSkippedAndReported:AttentionCuda.PageSizesThatAreNotPowersOfTwo' \
    > "$X/memcheck.log" 2>&1
  st "memcheck rc=$? $(grep -h 'ERROR SUMMARY' "$X/memcheck.log" | tail -1)"
fi
# 1. The failed case, the rows of the per-tile fit, and the arena test.
if [ -x $BIN/bench_device_arena_test ]; then
  within 30 $BIN/bench_device_arena_test > "$X/arena_test.log" 2>&1
  st "bench_device_arena_test rc=$? $(grep -hE '^\[  (PASSED|FAILED|SKIPPED) ' "$X/arena_test.log" | tr '\n' ' ')"
else
  st "bench_device_arena_test: not built in $B"
fi
within 30 $BIN/sieve_bench --gpu-only \
  --filter='gpu/prefill/(64q8kv128/bs1/(ctx16384/bf16/(dense|sparse0.50|sparse0.90|sparse0.95)|ctx32768/bf16/(dense|sparse0.90|sparse0.95)|ctx65536/bf16/dense)|32q8kv128/bs1/ctx16384/bf16/(dense|sparse0.90))$' \
  --json="$X/suite_rows.json" > "$X/suite_rows.log" 2>&1
st "suite 16K/32K dense + 50/90/95% rc=$? $(grep -c 'ERROR OCCURRED' "$X/suite_rows.log") errors"
awk '/^gpu\/prefill/ { t = ""; for (i = 2; i <= NF; ++i) if ($i ~ /^TFLOP/) t = $i; print $1, $2, $3, t, ($0 ~ /ERROR/ ? $0 : "") }' \
  "$X/suite_rows.log" | cut -c1-240

if ! command -v ncu > /dev/null; then
  st "ncu: absent on this machine"
else
  # 2. The Hopper kernel on the suite's 90% sparse 16K and dense 32K (the second call: warm).
  S='gpu/prefill/64q8kv128/bs1'
  ncu_sections sparse90_16k prefill_wgmma 1 1 20 $BIN/sieve_bench --gpu-only --filter="$S/ctx16384/bf16/sparse0.90\$"
  ncu_sections dense32k prefill_wgmma 1 1 25 $BIN/sieve_bench --gpu-only --filter="$S/ctx32768/bf16/dense\$"

  # 3. Per-kernel times of the 128K prefill steps (dense first, then the chains in this order).
  POL=(--policy --phase prefill --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 131072 --batch 1
       --keys similar:0.88 --similar-period 2048 --samples 1)
  DC='prefill:*=streaming(sink=4,window=2048)>delta_correction(gamma=64)'
  DPXA='prefill:*=dpxa(tau=0.9)'
  within 35 ncu --clock-control none --metrics gpu__time_duration.sum -o $R/timeline -f \
    $BIN/sieve_bench "${POL[@]}" --chain "$DC" --chain "$DPXA" > "$X/ncu_timeline.app.log" 2>&1
  st "ncu timeline rc=$?"
  if [ -f $R/timeline.ncu-rep ]; then
    ncu -i $R/timeline.ncu-rep --page raw --csv > "$X/ncu_timeline.raw.csv" 2>&1
    python3 $P timeline "$X/ncu_timeline.raw.csv" > "$X/ncu_timeline.txt" 2>&1
    grep -A40 "^per kernel" "$X/ncu_timeline.txt" | head -30
  fi
  grep -E "dense|dpxa|delta_correction" "$X/ncu_timeline.app.log" | head -8

  # 4. DPXA's selection kernels (the first step's), then delta_correction's far-key anchor call.
  ncu_sections dpxa_select 'anchors_kernel|scores_mma|greedy_kernel' 0 3 25 \
    $BIN/sieve_bench "${POL[@]}" --chain "$DPXA"
  N=$(python3 $P skip "$X/ncu_timeline.raw.csv" tiled_gather prefill_wgmma 2> "$X/skip.err")
  if [ -n "$N" ]; then
    st "delta_correction's far-key call: prefill_wgmma launch $N (0-based)"
    ncu_sections dc_anchor_far prefill_wgmma "$N" 1 25 $BIN/sieve_bench "${POL[@]}" --chain "$DC"
  else
    st "no delta_correction far-key launch found: $(cat "$X/skip.err")"
  fi
fi
st "done"
cd "$OUT" && tar czf h-pf.tgz h-pf && cp h-pf/summary.txt "$OUT/summary.txt"
