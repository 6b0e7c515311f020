#!/usr/bin/env bash
# Issue 20 (Quest's select, the block-sparse kernel's fixed cost) on the GPU machine, one call,
# this tree against a baseline tree in the same run: builds both (sieve_bench + quest; this one
# also the CUDA tests), runs the CUDA selection / quest / attention tests and compute-sanitizer
# memcheck on the selection and quest ones, then for each tree
#   - the policy step: 32q/8kv d128 bf16 page 16, 1 layer, ctx 32K/128K, batch 1/16, dense +
#     quest(token_budget=2048) with and without gqa_share, beside PyTorch SDPA;
#   - Nsight Compute's duration of every kernel of a short quest gqa_share run (batch 16, 32K):
#     where the select's microseconds go, per launch;
#   - the kernel suite's small block-sparse decode cases (the fixed cost per call), and each of
#     their kernels' own duration (ncu);
#   - Nsight Compute's sections (speed of light, memory, occupancy, stalls) of the select kernels
#     (the bound + top-k; quest_select for the fused kernel of commits 543247d..f64fbc6).
# Logs go to $OUT (at most 8 files come back).
#
#   bench/results/quest_select.sh BASELINE_TREE
set -uo pipefail
cd "$(dirname "$0")/../.."
BASE=$(cd "${1:?baseline tree}" && pwd)
OUT=${OUT:-$PWD/build-quest-out}
mkdir -p "$OUT"
DEPS=${DEVDEPS:-$PWD/.devdeps}
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
LOG=$OUT/build.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nvcc --version | tail -1; date -u; } > "$LOG" 2>&1
configure() {  # SRC BUILD TESTS
  cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS="$3" \
    -DCMAKE_PREFIX_PATH="$DEPS/usr" -DDLPACK_INCLUDE_DIR="$DEPS/usr/include"
}
t0=$(date +%s)
( configure "$BASE" "$BASE/build-qbase" OFF && cmake --build "$BASE/build-qbase" -j 8 --target sieve_bench sieve_plugin_quest ) \
  > "$OUT/build-base.tmp" 2>&1 &
( configure . build-qnew ON && cmake --build build-qnew -j 8 --target sieve_bench sieve_plugin_quest \
    test_selection_cuda test_plugin_quest_cuda test_plugin_raas_cuda cuda_test ) > "$OUT/build-new.tmp" 2>&1
new_rc=$?
wait $!; base_rc=$?
for f in base new; do echo "== build $f"; grep -E "error|FAILED" "$OUT/build-$f.tmp" | head -20; tail -1 "$OUT/build-$f.tmp"; done >> "$LOG"
rm -f "$OUT"/build-*.tmp
echo "build: $(( $(date +%s) - t0 )) s (new rc=$new_rc, base rc=$base_rc)" | tee -a "$LOG"
[ $new_rc = 0 ] && [ $base_rc = 0 ] || exit 1
N=build-qnew/bin Bb=$BASE/build-qbase/bin
status=0
T=$OUT/tests.txt
: > "$T"
t0=$(date +%s)
for t in "test_selection_cuda" "test_plugin_quest_cuda" "test_plugin_raas_cuda" \
         "cuda_test --gtest_filter=AttentionCudaTensorCores.*:AttentionCuda.Decode*:AttentionCuda.CapturesIntoACudaGraph"; do
  echo "==== $t" >> "$T"
  timeout 240 $N/$t --gtest_brief=1 >> "$T" 2>&1; rc=$?
  echo "$t: rc=$rc" | tee -a "$T"; [ $rc = 0 ] || status=1
done
for t in test_selection_cuda test_plugin_quest_cuda; do
  echo "==== memcheck $t" >> "$T"
  timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 $N/$t --gtest_brief=1 >> "$T" 2>&1; rc=$?
  echo "memcheck $t: rc=$rc" | tee -a "$T"; [ $rc = 0 ] || status=1
done
echo "tests: $(( $(date +%s) - t0 )) s" | tee -a "$T"
P="--policy --phase decode --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 32768,131072 --batch 1,16 --sdpa"
chains=(--chain 'quest(token_budget=2048,gqa_share=true)' --chain 'quest(token_budget=2048)')
for v in base new; do
  b=$N; [ $v = base ] && b=$Bb
  t0=$(date +%s)
  echo "==== policy $v" >> "$OUT/policy.log"
  timeout 200 $b/sieve_bench $P "${chains[@]}" --json="$OUT/policy_$v.json" >> "$OUT/policy.log" 2>&1; rc=$?
  echo "policy $v: rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || status=1
done
for v in base new; do
  b=$N; [ $v = base ] && b=$Bb
  echo "==== ncu $v" >> "$OUT/ncu.csv"
  timeout 120 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    $b/sieve_bench --policy --phase decode --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 \
    --ctx 32768 --batch 16 --steps 3 --warmup 1 --chain 'quest(token_budget=2048,gqa_share=true)' \
    2>&1 | grep -E '^"' >> "$OUT/ncu.csv"; echo "ncu $v: rc=${PIPESTATUS[0]}"
done
for v in base new; do
  b=$N; [ $v = base ] && b=$Bb
  echo "==== suite $v" >> "$OUT/suite.log"
  timeout 120 $b/sieve_bench --filter='gpu/decode/32q8kv128/bs(1|4|16)/ctx(8192|32768)/bf16/(dense|sparse0.90|sparse0.95)$' \
    >> "$OUT/suite.log" 2>&1; echo "suite $v: rc=$?"
done
# Where the block-sparse call's fixed cost goes: each kernel's own duration on the smallest case
# (its graph replay time in suite.log minus these is the launch gaps and the scratch nodes).
echo "==== ncu suite new" >> "$OUT/ncu.csv"
timeout 90 ncu --clock-control none --metrics gpu__time_duration.sum --csv -k regex:'row_mma|split_combine' --launch-count 12 \
  $N/sieve_bench --filter='gpu/decode/32q8kv128/bs4/ctx8192/bf16/sparse0.95$' 2>&1 | grep -E '^"' >> "$OUT/ncu.csv"
# The select kernels in detail (throughput, memory, occupancy, stalls): base bound + top-k, new fused.
for v in base new; do
  b=$N; [ $v = base ] && b=$Bb
  echo "==== ncu detail $v" >> "$OUT/ncu_detail.txt"
  timeout 120 ncu --clock-control none -k regex:'page_bounds_fast|top_k_select|top_k_emit|quest_select' \
    --launch-skip 3 --launch-count 3 --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
    --section WarpStateStats --section LaunchStats \
    $b/sieve_bench --policy --phase decode --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 \
    --ctx 32768 --batch 16 --steps 3 --warmup 1 --chain 'quest(token_budget=2048,gqa_share=true)' \
    >> "$OUT/ncu_detail.txt" 2>&1; echo "ncu detail $v: rc=$?"
done
grep -E "^ *(32768|131072) " "$OUT/policy.log" | cut -c1-160
exit $status
