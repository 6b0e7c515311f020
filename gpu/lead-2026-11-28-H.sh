#!/usr/bin/env bash
# Lead's follow-up commands after call B (2026-11-28 03:57-04:03 UTC, same warm H200, build-device-all of G1),
# recorded as run. G3's prefill suite showed dense Hopper prefill ~23% slower than call B2 of the fourth session
# (64q8kv 16K 12.78 vs 10.49 ms; same-run SDPA unchanged), so the two kernel commits merged from h-pf were reverted
# one at a time and the rows re-timed (each step: `touch core/kernels/cuda/hopper/*.cu; cmake --build
# build-device-all -j16`, since a copied tree can carry older timestamps than the objects).
#   H1: sieve_bench <line 9 of bench/policy_cases.txt> (it ran past G3's 45 s cap)             -> policy-9.json
#   H2: revert 7ec7c09 (tile-major work order)                  -> rows unchanged (12.95 ms dense 16K)
#   H3: + revert 332d2fc (producer's page-at-a-time copy)       -> dense 16K 10.41 ms, 32K 40.79 ms
#   H4: re-apply 7ec7c09 (final kernel)                         -> the rows below + streaming+delta_correction 128K
#   H5: cuda_test (51) and compute-sanitizer memcheck of hopper_test on the final kernel
set -uo pipefail
export LD_LIBRARY_PATH=$PWD/.devdeps/usr/lib/x86_64-linux-gnu
B=build-device-all/bin
line=$(grep -v '^#' bench/policy_cases.txt | grep . | sed -n 9p)
[ "${1:-}" = H1 ] && eval "timeout 230 $B/sieve_bench $line --json=$OUT/policy-9.json"
ROWS='gpu/prefill/(64q8kv128|32q8kv128)/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)$'
timeout 40 $B/sieve_bench --gpu-only --sdpa --filter="$ROWS" --json=$OUT/final_rows.json > $OUT/final_rows.log 2>&1
timeout 90 $B/sieve_bench --policy --phase prefill --chain 'prefill:*=streaming(sink=4,window=2048)>delta_correction(gamma=64)' \
  --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 131072 --batch 1 --keys similar:0.88 --samples 3 \
  --json=$OUT/dc128k.json > $OUT/dc128k.log 2>&1
timeout 110 $B/cuda_test --gtest_brief=1 > $OUT/cuda_test.log 2>&1
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $B/hopper_test --gtest_brief=1 > $OUT/mc_hopper.log 2>&1
