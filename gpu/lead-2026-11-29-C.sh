#!/usr/bin/env bash
# Ran (2026-11-28 06:09 UTC, H200) on main 3f8ead1 + gpu/lead-2026-11-29-C-cp-async.patch (C2); it kept T,
# which is the code of 3f8ead1 (the cp.async kernel instantiated but never launched).
# Lead's call C of the sixth session (issue 21). The working tree's kernel ("C2"): pages smaller than
# a tile copied by cp.async (two warps per ring; per page two shuffles and one row address, per chunk an
# add and the copy), a page of a whole tile by TMA. Against "T" (TMA at every page size: the launch's
# choice edited to `false`, rebuilt) on the same machine: dense and 90% rows at page 16, 32, 64.
# The faster on dense 64q 32K at page 16 is kept (T: the edit stays in), rebuilt, and then, on it:
# the CUDA-touching tests (ctest subset: every Cuda/cuda test incl. cuda_test and the plugins' CUDA
# tests, conformance, the engine pool, the layer runner, python.pytest, longctx_slice), memcheck of
# the prefill tests with odd pages, the whole prefill suite beside SDPA, the prefill policy rows at
# 32K/128K and Nsight Compute (warp-stall sampling per instruction) on dense 64q 32K and 90% 16K.
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/c; mkdir -p $X; RP=/tmp/ncu-c; rm -rf $RP; mkdir -p $RP
st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > $X/summary.txt 2>&1
BD=build-device-all; B=$BD/bin; K=core/kernels/cuda/hopper/prefill_wgmma.cu
OUT=$X/build timeout 300 bash bench/device_all.sh --fresh --no-tests > $X/build.txt 2>&1; st "build rc=$? $(tail -1 $X/build.txt)"
. gpu/ncu_source.sh  # SECT and ncu_src (printed summaries shortened since the run)
rows() {  # NAME PAGE REGEX
  timeout 40 $B/sieve_bench --gpu-only --page-size=$2 --filter="$3" --json=$X/rows_$1.json > $X/rows_$1.log 2>&1; st "rows $1 rc=$?"
  grep -E '^gpu/prefill' $X/rows_$1.log | grep -v iterations | cut -c1-150
}
med() { grep -E "^$2 " $X/rows_$1.log | awk '{print $4}'; }
R16='gpu/prefill/(64q8kv128|32q8kv128)/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)$'
RP_='gpu/prefill/64q8kv128/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)/page'
timeout 60 $B/cuda_test --gtest_brief=1 --gtest_filter='AttentionCudaTensorCores.Prefill*:AttentionCuda.PageSizesThatAreNotPowersOfTwo' > $X/cuda_prefill_C2.log 2>&1
st "C2 cuda_test prefill rc=$? $(grep -hE '^\[  (PASSED|FAILED) ' $X/cuda_prefill_C2.log | tr '\n' ' ')"
rows C2_16 16 "$R16"; rows C2_32 32 "${RP_}32\$"; rows C2_64 64 "${RP_}64\$"
cp $K /tmp/kernel_C2.cu
sed -i 's/auto kernel = p.page_size < kKeys ?/auto kernel = false ?/' $K; grep -c "auto kernel = false ?" $K >> $X/summary.txt
timeout 120 cmake --build $BD -j 16 > $X/rebuild_T.log 2>&1; st "rebuild T rc=$?"
rows T16 16 "$R16"; rows T32 32 "${RP_}32\$"
D='gpu/prefill/64q8kv128/bs1/ctx32768/bf16/dense'
c2=$(med C2_16 $D); t=$(med T16 $D)
if awk -v a="$c2" -v b="$t" 'BEGIN { exit !(a > 0 && a < 0.98 * b) }'; then
  st "kept C2 (cp.async below a tile): dense 64q 32K $c2 us vs TMA $t us"; cp /tmp/kernel_C2.cu $K; touch $K
  timeout 120 cmake --build $BD -j 16 > $X/rebuild_final.log 2>&1; st "rebuild C2 rc=$?"; echo C2 > $X/kept.txt
else
  st "kept T (TMA at every page size): dense 64q 32K TMA $t us vs cp.async $c2 us"; echo T > $X/kept.txt
fi
timeout 200 ctest --test-dir $BD -j 10 --timeout 180 -R 'Cuda|cuda|Hopper|hopper|conform|EnginePool|LayerRunner|LayerGraphs|DeltaX|Dpxa|python|longctx' > $X/ctest.log 2>&1
st "ctest CUDA-touching subset rc=$? $(grep -E 'tests passed|tests failed' $X/ctest.log)"
grep -E "\*\*\*Failed|Timeout|Not Run" $X/ctest.log | head
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/cuda_test --gtest_brief=1 \
  --gtest_filter='AttentionCudaTensorCores.PrefillBlockSelections:AttentionCudaTensorCores.BadEntriesAreSkippedAndReported:AttentionCuda.PageSizesThatAreNotPowersOfTwo:AttentionCudaTensorCores.PrefillGqaHeadDimsPageSizes' \
  > $X/memcheck.log 2>&1; st "memcheck rc=$? $(grep -h 'ERROR SUMMARY' $X/memcheck.log | tail -1)"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/hopper_test --gtest_brief=1 > $X/memcheck_hopper.log 2>&1; st "memcheck hopper_test rc=$?"
timeout 80 $B/sieve_bench --gpu-only --sdpa --filter='gpu/prefill/' --json=$X/suite_prefill.json > $X/suite_prefill.log 2>&1; st "prefill suite rc=$?"
timeout 100 $B/sieve_bench --policy --phase prefill --chain 'prefill:*=dpxa(tau=0.9)' --chain 'prefill:*=deltakv(threshold=0.83)' \
  --chain 'prefill:*=streaming(sink=4,window=2048)>delta_correction(gamma=64)' --layers 1 --hq 32 --hkv 8 --d 128 --page 16 \
  --dtype bf16 --ctx 32768,131072 --batch 1 --keys similar:0.88 --samples 3 --json=$X/policy_prefill.json > $X/policy_prefill.log 2>&1
st "prefill policy rc=$?"; grep -E "^ +[0-9]+ +1 " $X/policy_prefill.log | cut -c1-120 | head -10
ncu_src dense32k_final prefill_wgmma 1 40 $B/sieve_bench --gpu-only --filter='gpu/prefill/64q8kv128/bs1/ctx32768/bf16/dense$'
ncu_src sparse16k_final prefill_wgmma 1 30 $B/sieve_bench --gpu-only --filter='gpu/prefill/64q8kv128/bs1/ctx16384/bf16/sparse0.90$'
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
