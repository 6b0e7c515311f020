#!/usr/bin/env bash
# GPU run for branch h-bind (issue 19: the binding's cost, sieve.transformers' host work, the
# decode-step bench). Stops itself within $H_BIND_SECONDS (default 120) after the build:
#   binding   python/bench/binding_cost.py --device cuda: attend without ready= (one stream sync
#             per call now) and with ready=True, against the bare C call (limit 50 us)
#   five      the five-line block of docs/engines/transformers.md, as written
#   pytest    python/tests without the 1B-geometry cases (binding, torch CUDA streams incl. the
#             producer-on-another-stream cases, transformers on the tiny models)
#   speed     python/bench/transformers_step.py with the attention's host column, two passes in
#             opposite orders: $H_BIND_SPEED, default batch 8 at 8K then (time left) 32K, the sdpa
#             variants (untimed; timed; over key lengths seen before; without cuDNN) and Sieve dense
#   SIEVE_BUILD=build-device-all bash gpu/h-bind.sh
#   (the whole table: H_BIND_SPEED="--ctx 8192,32768 --batch 8,1", no --methods: all of them)
set -uo pipefail
budget=${H_BIND_SECONDS:-120}
source "$(dirname "$0")/py-env.sh"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date -u; git log --oneline -1; } >> "$S" 2>&1
status=0

timeout 20 python3 python/bench/binding_cost.py --device cuda --calls 1500 --json "$OUT/binding_cost.json" \
  > "$OUT/binding.txt" 2>&1
rc=$?; step "binding cost (limit 50 us)" $rc; [ $rc = 0 ] || status=1
grep -E "binding|python_side|attend|bare|over|rror" "$OUT/binding.txt" | head -14 | tee -a "$S"

five_lines "$OUT/five_lines.py"
(cd /tmp && timeout 20 python3 "$OUT/five_lines.py") > "$OUT/five_lines.txt" 2>&1; rc=$?
step "five-line doc script" $rc; [ $rc = 0 ] || status=1
tail -3 "$OUT/five_lines.txt" >> "$S"

t=$(( $(left) - 47 )); [ $t -gt 150 ] && t=150  # the speed rows need ~45 s (1B model, 12 runs at 8K)
[ $t -lt 10 ] && t=10
(cd "$B/python" && timeout $t python3 -m pytest -v -rs -p no:cacheprovider -k "not 1b" "$OLDPWD/python/tests") \
  > "$OUT/pytest.txt" 2>&1
rc=$?; step "pytest -k 'not 1b' (timeout $t s)" $rc; [ $rc = 0 ] || status=1
grep -E "FAILED|ERROR|[0-9]+ (passed|failed)|^SKIPPED|Fatal|Segmentation" "$OUT/pytest.txt" | tail -20 | tee -a "$S"
grep -c PASSED "$OUT/pytest.txt" | sed 's/^/tests passed: /' | tee -a "$S"

t=$(( $(left) - 2 ))
if [ $t -gt 20 ]; then
  # shellcheck disable=SC2086  # H_BIND_SPEED is a list of arguments
  timeout $t python3 python/bench/transformers_step.py --steps 6 --warmup 3 --passes 2 \
    ${H_BIND_SPEED:---ctx 8192,32768 --batch 8 --methods "sdpa (untimed),sdpa,sdpa (lengths seen),sdpa (no cuDNN),sieve dense"} \
    --json "$OUT/transformers_step.json" > "$OUT/speed.txt" 2>&1
  rc=$?; step "speed (timeout $t s)" $rc; [ $rc = 0 ] || status=1
  tail -8 "$OUT/speed.txt" >> "$S"
  [ -f "$OUT/transformers_step.json" ] && python3 python/bench/step_table.py "$OUT/transformers_step.json" >> "$S"
fi
echo "status=$status" | tee -a "$S"
(cd "$OUT" && ls | grep -vx -e summary.txt -e h-bind.tgz | tar czf h-bind.tgz -T - && ls | grep -vx -e summary.txt -e h-bind.tgz | xargs rm -f)
exit $status
