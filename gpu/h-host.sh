#!/usr/bin/env bash
# GPU run for branch h-host (issue 20, the runtime's host time per decode layer call). Stops
# itself within $H_HOST_SECONDS (default 40) after the build:
#   bench     sieve_host_path_bench: host us per sieve_session_attend (decode, 1 layer, dense),
#             cpu/{1,16} (1 head, d8 f32) and cuda/{1,16} (32q/8kv d64 bf16, kernels not waited for)
#   binding   python/bench/binding_cost.py --device cuda (limit raised, so rc 1 is a failure): its
#             "bare" column is the same C call from Python (call A5, H200, before this branch: 26.5 us)
#   SIEVE_BUILD=build-device-all bash gpu/h-host.sh
set -uo pipefail
budget=${H_HOST_SECONDS:-40}
source "$(dirname "$0")/py-env.sh"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date -u; git log --oneline -1; } >> "$S" 2>&1
status=0

timeout 15 "$B/bin/sieve_host_path_bench" --benchmark_min_time=0.2 --benchmark_repetitions=3 \
  --benchmark_report_aggregates_only=true --benchmark_out="$OUT/host_path.json" --benchmark_out_format=json \
  > "$OUT/host_path.txt" 2>&1
rc=$?; step "sieve_host_path_bench" $rc; [ $rc = 0 ] || status=1
grep -E "median|rror" "$OUT/host_path.txt" | tee -a "$S"

t=$(( $(left) - 2 )); [ $t -lt 10 ] && t=10
timeout $t python3 python/bench/binding_cost.py --device cuda --calls 1500 --limit-us 1000 --json "$OUT/binding_cost.json" \
  > "$OUT/binding.txt" 2>&1
rc=$?; step "binding_cost.py --device cuda (timeout $t s)" $rc; [ $rc = 0 ] || status=1
grep -E '"(attend|attend_ready|bare)"|binding_us|rror' "$OUT/binding.txt" | head -8 | tee -a "$S"

echo "status=$status" | tee -a "$S"
exit $status
