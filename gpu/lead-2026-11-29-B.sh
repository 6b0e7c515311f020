#!/usr/bin/env bash
# Ran (2026-11-28 06:00 UTC, H200) on main 3f8ead1 plus a first cp.async version (its copy loop divided by the
# page size and shuffled per chunk; not kept); C2 of call C is gpu/lead-2026-11-29-C-cp-async.patch.
# Lead's call B of the sixth session (issue 21). The working tree's Hopper prefill kernel ("C"): pages
# smaller than a tile are copied by two cp.async warps per ring (K, V), pages of a whole tile by TMA,
# one warp per ring. Correctness first (cuda_test whole, hopper_test, memcheck of the prefill tests
# with odd pages, the CUDA plugin tests and conformance of the prefill policies), then the rows at page
# 16/32/64/128 and two same-machine baselines made by editing the kernel choice in launch (rebuilt):
# TMA at every page size (= call A's "B"), cp.async at every page size (page 128 too). Then, on C
# again, the whole prefill suite beside SDPA, the prefill policy rows at 32K/128K, and Nsight Compute
# with warp-stall sampling per instruction on dense 64q 32K and 90% sparse 16K.
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/b; mkdir -p $X; RP=/tmp/ncu-b; rm -rf $RP; mkdir -p $RP
st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > $X/summary.txt 2>&1
BD=build-device-all; B=$BD/bin; K=core/kernels/cuda/hopper/prefill_wgmma.cu
OUT=$X/build timeout 300 bash bench/device_all.sh --fresh --no-tests > $X/build.txt 2>&1; st "build rc=$? $(tail -1 $X/build.txt)"
. gpu/ncu_source.sh  # SECT and ncu_src (printed summaries shortened since the run)
rows() {  # NAME PAGE REGEX
  timeout 40 $B/sieve_bench --gpu-only --page-size=$2 --filter="$3" --json=$X/rows_$1.json > $X/rows_$1.log 2>&1; st "rows $1 rc=$?"
  grep -E '^gpu/prefill' $X/rows_$1.log | grep -v iterations | cut -c1-150
}
# 1. Correctness of C.
timeout 150 $B/cuda_test --gtest_brief=1 > $X/cuda_test.log 2>&1; st "cuda_test rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' $X/cuda_test.log | tr '\n' ' ')"
grep -h "Failure" -A4 $X/cuda_test.log | head -20
timeout 60 $B/hopper_test --gtest_brief=1 > $X/hopper_test.log 2>&1; st "hopper_test rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' $X/hopper_test.log | tr '\n' ' ')"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 $B/cuda_test --gtest_brief=1 \
  --gtest_filter='AttentionCudaTensorCores.PrefillBlockSelections:AttentionCudaTensorCores.BadEntriesAreSkippedAndReported:AttentionCuda.PageSizesThatAreNotPowersOfTwo:AttentionCudaTensorCores.PrefillGqaHeadDimsPageSizes' \
  > $X/memcheck.log 2>&1; st "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $X/memcheck.log | tail -1)"
timeout 150 ctest --test-dir $BD -j 10 --timeout 120 -R 'Cuda|cuda|conform\.(dpxa|deltakv|delta_correction|streaming|seer|quest)|EnginePool|LayerRunner|DeltaX|Dpxa' > $X/ctest_cuda.log 2>&1
st "ctest CUDA subset rc=$? $(grep -E 'tests passed|tests failed' $X/ctest_cuda.log)"
grep -E "\*\*\*Failed|Timeout|Not Run" $X/ctest_cuda.log | head
# 2. Rows at four page sizes (C), then the two baselines.
R16='gpu/prefill/(64q8kv128|32q8kv128)/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)$'
RP_='gpu/prefill/64q8kv128/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)/page'
rows C16 16 "$R16"; rows C32 32 "${RP_}32\$"; rows C64 64 "${RP_}64\$"; rows C128 128 "${RP_}128\$"
cp $K /tmp/kernel_C.cu
sed -i 's/auto kernel = p.page_size < kKeys ?/auto kernel = false ?/' $K; grep -c "auto kernel = false ?" $K >> $X/summary.txt
timeout 120 cmake --build $BD -j 16 --target sieve_bench > $X/rebuild_tma.log 2>&1; st "rebuild TMA-everywhere rc=$?"
rows T16 16 "$R16"; rows T64 64 "${RP_}64\$"
cp /tmp/kernel_C.cu $K; sed -i 's/auto kernel = p.page_size < kKeys ?/auto kernel = true ?/' $K; grep -c "auto kernel = true ?" $K >> $X/summary.txt
timeout 120 cmake --build $BD -j 16 --target sieve_bench > $X/rebuild_cp.log 2>&1; st "rebuild cp.async-everywhere rc=$?"
rows A128 128 "${RP_}128\$"
cp /tmp/kernel_C.cu $K; touch $K
timeout 120 cmake --build $BD -j 16 --target sieve_bench > $X/rebuild_C.log 2>&1; st "rebuild C rc=$?"
# 3. On C: the whole prefill suite beside SDPA, the prefill policy rows, the profiles.
timeout 120 $B/sieve_bench --gpu-only --sdpa --filter='gpu/prefill/' --json=$X/suite_prefill.json > $X/suite_prefill.log 2>&1; st "prefill suite rc=$?"
timeout 90 $B/sieve_bench --policy --phase prefill --chain 'prefill:*=dpxa(tau=0.9)' --chain 'prefill:*=deltakv(threshold=0.83)' \
  --chain 'prefill:*=streaming(sink=4,window=2048)>delta_correction(gamma=64)' --layers 1 --hq 32 --hkv 8 --d 128 --page 16 \
  --dtype bf16 --ctx 32768,131072 --batch 1 --keys similar:0.88 --samples 3 --json=$X/policy_prefill.json > $X/policy_prefill.log 2>&1
st "prefill policy rc=$?"; grep -E "dense|dpxa|deltakv|delta_correction" $X/policy_prefill.log | head -12
ncu_src dense32k_C prefill_wgmma 1 60 $B/sieve_bench --gpu-only --filter='gpu/prefill/64q8kv128/bs1/ctx32768/bf16/dense$'
ncu_src sparse16k_C prefill_wgmma 1 40 $B/sieve_bench --gpu-only --filter='gpu/prefill/64q8kv128/bs1/ctx16384/bf16/sparse0.90$'
cuobjdump -sass $BD/core/kernels/CMakeFiles/sieve_hopper.dir/cuda/hopper/prefill_wgmma.cu.o > $X/sass_C.txt 2>&1
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
