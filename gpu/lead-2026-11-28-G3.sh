#!/usr/bin/env bash
# Lead's call B, part 3 (quiet GPU, nothing else running): the timed regenerations from the final code —
# the policy batch (bench/policy_cases.txt -> docs/results/gpu_policy_<gpu>.json, issue 20), the decode and
# prefill kernel suites beside SDPA (issues 20, 21), the prefill policy rows (issue 21).
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/x; mkdir -p $X/pol $X/hop $X/dec; st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > $X/summary.txt 2>&1
B=build-device-all/bin
OUT=$X/pol timeout 250 bash bench/device_all.sh --no-tests --policy-cases bench/policy_cases.txt --case-timeout 45 > $X/pol/device_all.txt 2>&1; st "policy batch rc=$? $(grep -c 'rc=0' $X/pol/device_all.txt) lines ok"
timeout 50 $B/sieve_bench --sdpa --filter='gpu/decode/32q8kv128/bs(1|4|16)/ctx(8192|32768|131072)/bf16/(dense|sparse0.90|sparse0.95)(/minkeys64|/splits8)?$' --json=$X/dec/suite_decode.json > $X/dec/suite_decode.log 2>&1; st "decode suite rc=$?"
timeout 110 $B/sieve_bench --gpu-only --sdpa --filter='gpu/prefill/' --json=$X/hop/suite_prefill.json > $X/hop/suite_prefill.log 2>&1; st "prefill suite rc=$?"
timeout 70 $B/sieve_bench --policy --phase prefill --chain 'prefill:*=dpxa(tau=0.9)' --chain 'prefill:*=deltakv(threshold=0.83)' --chain 'prefill:*=streaming(sink=4,window=2048)>delta_correction(gamma=64)' --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 32768,131072 --batch 1 --keys similar:0.88 --samples 3 --json=$X/hop/policy_prefill.json > $X/hop/policy_prefill.log 2>&1; st "prefill policy rc=$?"
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
