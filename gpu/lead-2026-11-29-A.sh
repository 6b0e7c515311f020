#!/usr/bin/env bash
# Lead's call A of the sixth session (issue 21), an A/B call on one warm GPU.
#   B = the working tree: the Hopper prefill kernel with two producer warps (K + Q, V), each looking up
#       its next tile's pages while it waits for that tile's stage (gpu/lead-2026-11-29-A-two-producers.patch);
#   A = the same tree with that patch reversed: the kernel of main 0b90174 (one producer warp).
# For each: cuda_test's Hopper prefill tests (B only, with the long many-tile test: 1/3/132 CTAs), the
# dense and 90% rows at 16K/32K (page 16, and page 128: 16 KB TMA boxes, one page lookup per tile),
# and Nsight Compute with per-instruction warp-stall sampling (SourceCounters) on dense 64q 32K.
# Then the SASS of both, and DPXA's scoring kernel (scores_mma) at 128K with the same sections.
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/a; mkdir -p $X; RP=/tmp/ncu-a; rm -rf $RP; mkdir -p $RP
st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; ncu --version | tail -1; } > $X/summary.txt 2>&1
BD=build-device-all; B=$BD/bin
OUT=$X/build timeout 300 bash bench/device_all.sh --fresh --no-tests > $X/build.txt 2>&1; st "build rc=$? $(tail -1 $X/build.txt)"
ROWS='gpu/prefill/(64q8kv128|32q8kv128)/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)$'
ROWS128='gpu/prefill/64q8kv128/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)/page128$'
. gpu/ncu_source.sh  # SECT and ncu_src (printed summaries shortened since the run)
variant() {  # V: rows, page-128 rows, ncu
  local v=$1
  timeout 40 $B/sieve_bench --gpu-only --filter="$ROWS" --json=$X/rows_$v.json > $X/rows_$v.log 2>&1; st "$v rows rc=$?"
  timeout 30 $B/sieve_bench --gpu-only --page-size=128 --filter="$ROWS128" --json=$X/rows128_$v.json > $X/rows128_$v.log 2>&1; st "$v page-128 rows rc=$?"
  grep -E "^gpu/prefill" $X/rows_$v.log $X/rows128_$v.log | awk '{print $1, $2, $3, $4}'
  ncu_src dense32k_$v prefill_wgmma 1 60 $B/sieve_bench --gpu-only --filter='gpu/prefill/64q8kv128/bs1/ctx32768/bf16/dense$'
  ncu_src sparse16k_$v prefill_wgmma 1 40 $B/sieve_bench --gpu-only --filter='gpu/prefill/64q8kv128/bs1/ctx16384/bf16/sparse0.90$'
  cuobjdump -sass $BD/core/kernels/CMakeFiles/sieve_hopper.dir/cuda/hopper/prefill_wgmma.cu.o > $X/sass_$v.txt 2>&1
}
TF='AttentionCudaTensorCores.Prefill*:AttentionCudaTensorCores.BadEntriesAreSkippedAndReported:AttentionCudaTensorCores.EngineLayoutsGiveBitIdenticalOutputs:AttentionCuda.PageSizesThatAreNotPowersOfTwo'
timeout 120 $B/cuda_test --gtest_filter="$TF" > $X/cuda_test_B.log 2>&1; st "B cuda_test prefill rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' $X/cuda_test_B.log | tr '\n' ' ')"
grep -h "Failure" -A4 $X/cuda_test_B.log | head -16
timeout 60 $B/hopper_test > $X/hopper_test_B.log 2>&1; st "B hopper_test rc=$?"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/cuda_test --gtest_filter='AttentionCudaTensorCores.PrefillBlockSelections:AttentionCudaTensorCores.BadEntriesAreSkippedAndReported:AttentionCuda.PageSizesThatAreNotPowersOfTwo' > $X/memcheck_B.log 2>&1
st "B memcheck rc=$? $(grep -h 'ERROR SUMMARY' $X/memcheck_B.log | tail -1)"
variant B
patch -R -p1 < gpu/lead-2026-11-29-A-two-producers.patch > $X/patch.log 2>&1 && touch core/kernels/cuda/hopper/prefill_wgmma.cu
timeout 150 cmake --build $BD -j 16 --target sieve_bench > $X/rebuild_A.log 2>&1; st "A rebuild rc=$?"
variant A
# DPXA's scoring kernel at 128K (the first step's), same sections.
POL=(--policy --phase prefill --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 131072 --batch 1
     --keys similar:0.88 --similar-period 2048 --samples 1)
ncu_src dpxa_scores scores_mma 0 70 $B/sieve_bench "${POL[@]}" --chain 'prefill:*=dpxa(tau=0.9)'
patch -p1 < gpu/lead-2026-11-29-A-two-producers.patch >> $X/patch.log 2>&1
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
