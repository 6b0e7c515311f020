#!/usr/bin/env bash
# Lead's call B2 (right after B1, same warm machine, build-device-all kept): the timed regenerations on a
# quiet GPU — Hopper prefill kernel suite + baselines + prefill policy rows (issue 21), decode suite + Quest
# policy rows beside SDPA (issue 20), the transformers step-time table (issue 19).
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/x; mkdir -p $X/hop $X/dec $X/py; st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > $X/summary.txt 2>&1
B=build-device-all/bin
timeout 110 $B/sieve_bench --gpu-only --sdpa --filter='gpu/prefill/' --json=$X/hop/suite_prefill_hopper.json > $X/hop/suite_prefill_hopper.log 2>&1; st "hopper suite rc=$?"
RX='gpu/prefill/64q8kv128/bs1/ctx(16384|32768)/bf16/(dense|sparse0.90)$'
timeout 45 $B/sieve_bench --gpu-only --no-hopper --filter="$RX" --json=$X/hop/prefill_mmasync.json > $X/hop/prefill_baselines.log 2>&1; st "mmasync rc=$?"
timeout 40 $B/sieve_bench --gpu-only --hopper-ctas=1000000000 --filter="$RX" --json=$X/hop/prefill_onetile.json >> $X/hop/prefill_baselines.log 2>&1; st "onetile rc=$?"
timeout 70 $B/sieve_bench --policy --phase prefill --chain 'prefill:*=dpxa(tau=0.9)' --chain 'prefill:*=deltakv(threshold=0.83)' --chain 'prefill:*=streaming(sink=4,window=2048)>delta_correction(gamma=64)' --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 32768,131072 --batch 1 --keys similar:0.88 --samples 3 --json=$X/hop/policy_prefill_hopper.json > $X/hop/policy_prefill_hopper.log 2>&1; st "prefill policy rc=$?"
timeout 50 $B/sieve_bench --sdpa --filter='gpu/decode/32q8kv128/bs(1|4|16)/ctx(8192|32768|131072)/bf16/(dense|sparse0.90|sparse0.95)(/minkeys64|/splits8)?$' --json=$X/dec/suite_decode.json > $X/dec/suite_decode.log 2>&1; st "decode suite rc=$?"
timeout 45 $B/sieve_bench --policy --phase decode --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 32768,131072 --batch 1,16 --sdpa --chain 'decode:*=quest(token_budget=2048,gqa_share=true)' --json=$X/dec/policy_decode.json > $X/dec/policy_decode.log 2>&1; st "decode policy rc=$?"
L=$((450 - SECONDS)); [ $L -gt 160 ] && L=160
( OUT=$X/py H_PY_SECONDS=$((L - 10)) SIEVE_BUILD=build-device-all timeout $L bash gpu/h-py.sh speed > $X/py/stdout.txt 2>&1 ); st "py speed rc=$? (limit $L s)"
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
