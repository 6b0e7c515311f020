#!/usr/bin/env bash
# GPU run for branch h-bind (issue 19: the binding's cost, sieve.transformers' host work, the
# decode-step bench). Stops itself within $H_BIND_SECONDS (default 120) after the build:
#   binding   python/bench/binding_cost.py --device cuda: attend without ready= and with it,
#             against the bare C call (limit 50 us), and the binding's own work (C call stubbed)
#   cache     python/bench/cache_host_cost.py --device cuda: SieveCache.update + attend per decode
#             layer call, host us, with the C call and with it stubbed
#   speed     python/bench/transformers_step.py (host column, every run over new key lengths):
#             $H_BIND_SPEED, default the whole table (8K/32K, batch 8/1) in one pass of sdpa,
#             sdpa over lengths seen before, sdpa without cuDNN, Sieve dense and quest; at most
#             $H_BIND_SPEED_SECONDS (default 45); the JSON keeps every configuration finished
#   five      the five-line block of docs/engines/transformers.md, as written
#   pytest    python/tests without the 1B-geometry cases, with the time left (call A: 50 tests
#             in 49 s on an H200)
#   SIEVE_BUILD=build-device-all bash gpu/h-bind.sh
set -uo pipefail
budget=${H_BIND_SECONDS:-120}
source "$(dirname "$0")/py-env.sh"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date -u; git log --oneline -1; } >> "$S" 2>&1
status=0

timeout 20 python3 python/bench/binding_cost.py --device cuda --calls 1500 --json "$OUT/binding_cost.json" \
  > "$OUT/binding.txt" 2>&1
rc=$?; step "binding cost (limit 50 us)" $rc; [ $rc = 0 ] || status=1
grep -E "binding|python_side|attend|bare|over|rror" "$OUT/binding.txt" | head -14 | tee -a "$S"

timeout 15 python3 python/bench/cache_host_cost.py --device cuda > "$OUT/cache_host.txt" 2>&1
rc=$?; step "sieve.transformers host time per decode layer call" $rc; [ $rc = 0 ] || status=1
tail -2 "$OUT/cache_host.txt" | tee -a "$S"

t=${H_BIND_SPEED_SECONDS:-45}
# shellcheck disable=SC2086  # H_BIND_SPEED is a list of arguments
timeout $t python3 python/bench/transformers_step.py --steps 6 --warmup 3 --passes 1 \
  ${H_BIND_SPEED:---ctx 8192,32768 --batch 8,1 --methods "sdpa,sdpa (lengths seen),sdpa (no cuDNN),sieve dense,sieve quest(token_budget=2048)"} \
  --json "$OUT/transformers_step.json" > "$OUT/speed.txt" 2>&1
rc=$?; step "speed (timeout $t s)" $rc; [ $rc = 0 ] || [ $rc = 124 ] || status=1
[ -f "$OUT/transformers_step.json" ] && python3 python/bench/step_table.py "$OUT/transformers_step.json" >> "$S"

five_lines "$OUT/five_lines.py"
(cd /tmp && timeout 25 python3 "$OUT/five_lines.py") > "$OUT/five_lines.txt" 2>&1; rc=$?
step "five-line doc script" $rc; [ $rc = 0 ] || status=1
tail -2 "$OUT/five_lines.txt" >> "$S"

t=$(( $(left) - 3 )); [ $t -lt 10 ] && t=10
(cd "$B/python" && timeout $t python3 -m pytest -v -rs -p no:cacheprovider -k "not 1b" "$OLDPWD/python/tests") \
  > "$OUT/pytest.txt" 2>&1
rc=$?; step "pytest -k 'not 1b' (timeout $t s)" $rc; [ $rc = 0 ] || status=1
grep -E "FAILED|ERROR|[0-9]+ (passed|failed)|^SKIPPED|Fatal|Segmentation" "$OUT/pytest.txt" | tail -20 | tee -a "$S"
grep -c PASSED "$OUT/pytest.txt" | sed 's/^/tests passed: /' | tee -a "$S"

echo "status=$status" | tee -a "$S"
(cd "$OUT" && ls | grep -vx -e summary.txt -e h-bind.tgz | tar czf h-bind.tgz -T - && ls | grep -vx -e summary.txt -e h-bind.tgz | xargs rm -f)
exit $status
