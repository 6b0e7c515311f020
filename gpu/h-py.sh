#!/usr/bin/env bash
# GPU run for the Python package and sieve.transformers (issue 19), branch h-py:
#   links     readelf: no policy plugin needs libsieve_runtime / libsieve_cli (the delta fix)
#   pytest    python/tests (binding, torch CUDA streams, transformers: dense = sdpa incl. the bf16
#             eager-vs-sdpa floor, greedy, padded batches, chains = direct sessions, RaaS memory)
#   binding   python/bench/binding_cost.py on CUDA (limit 50 us per layer call)
#   five      the five-line block of docs/engines/transformers.md, as written
#   teardown  gpu/h-py-teardown.py: which stage of a torch + Sieve process dies, per case
#   speed     python/bench/transformers_step.py: the decode-step table (1B geometry, bf16, 8K/32K,
#             batch 1/8, sdpa vs Sieve dense vs quest(token_budget=2048))
#   bash gpu/h-py.sh [all|tests|speed]      (default all; the whole run stops itself after
#                                            $H_PY_SECONDS, default 100 s; `all` leaves the speed
#                                            table what the tests left)
# `tests` runs the pytest cases the GPU machine failed or never passed first (the delta chain that
# segfaulted, the bf16 dense logits), the rest of pytest only when H_PY_SECONDS >= 200.
# Build: $SIEVE_BUILD when set (used as is), else bench/device_all.sh --fresh --no-tests.
set -uo pipefail
part=${1:-all}
budget=${H_PY_SECONDS:-100}
source "$(dirname "$0")/py-env.sh"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; git log --oneline -1
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
  command -v gdb || echo "no gdb"; echo "LD_PRELOAD=${LD_PRELOAD:-}"
  # an allocator other than glibc's in a torch process (RTLD_DEEPBIND would bypass it)
  python3 -c 'import torch; print("".join(l for l in open("/proc/self/maps") if "malloc" in l)[:400])'; } >> "$S" 2>&1
status=0
L="$OUT/log.txt"
: > "$L"

if [ "$part" != speed ]; then
  cmake -DREADELF=readelf "-DFILES=$(ls "$B"/lib/sieve/plugins/libsieve_*.so | tr '\n' '|')" \
    -P tests/plugins/plugin_links.cmake >> "$L" 2>&1; rc=$?; step "plugin links" $rc
  [ $rc = 0 ] || status=1

  # pytest-xdist (on the GPU image): a crash fails one test in a worker, the rest still run.
  xdist=""; python3 -c "import xdist" 2> /dev/null && xdist="-n 1"
  select=(-k "chain_equals_a_session or dense_chain_logits"); [ $budget -ge 200 ] && select=()
  t=$(( $(left) - 40 )); [ $t -gt 130 ] && t=130
  (cd "$B/python" && timeout $t python3 -X faulthandler -m pytest -v -rs -rP $xdist -p no:cacheprovider \
      "${select[@]}" "$OLDPWD/python/tests") > "$OUT/pytest.txt" 2>&1
  rc=$?; step "pytest ${select[*]} (timeout $t s)" $rc; [ $rc = 0 ] || status=1
  grep -E "^(FAILED|ERROR)|[0-9]+ (passed|failed)|worst relative|bf16|^SKIPPED|Fatal|Segmentation" "$OUT/pytest.txt" \
    | tail -40 | tee -a "$S"
  timeout 20 python3 -X faulthandler python/bench/binding_cost.py --device cuda --calls 1500 \
    --json "$OUT/binding_cost.json" > "$OUT/binding.txt" 2>&1
  rc=$?; step "binding cost (limit 50 us)" $rc; [ $rc = 0 ] || status=1
  grep -E "binding|median|attend|bare|Error|error|free|Fatal" "$OUT/binding.txt" | head -12 | tee -a "$S"
  if [ $rc -gt 128 ] && [ $rc != 137 ] && command -v gdb > /dev/null; then  # died on a signal: where
    timeout 20 gdb -q -batch -ex run -ex bt -ex "info sharedlibrary" --args python3 python/bench/binding_cost.py \
      --device cuda --calls 300 > "$OUT/binding_gdb.txt" 2>&1
    grep -A25 "^Thread\|signal SIG" "$OUT/binding_gdb.txt" | head -40 >> "$S"
  fi

  five_lines "$OUT/five_lines.py"
  (cd /tmp && timeout 20 python3 -X faulthandler "$OUT/five_lines.py") >> "$L" 2>&1; rc=$?
  step "five-line doc script" $rc; [ $rc = 0 ] || status=1

  t=$(( $(left) - 5 ))
  if [ $t -gt 8 ]; then
    timeout $t python3 gpu/h-py-teardown.py "$B" > "$OUT/teardown.txt" 2>&1; rc=$?; step "teardown (timeout $t s)" $rc
    cat "$OUT/teardown.txt" >> "$S"
  fi

fi

if [ "$part" = speed ]; then  # the import order and the binding's cost too (in `tests` pytest has them)
  (cd "$B/python" && timeout 40 python3 -m pytest -q -rA -p no:cacheprovider -k either_order \
      "$OLDPWD/python/tests/test_torch.py") > "$OUT/order.txt" 2>&1
  rc=$?; step "pytest -k either_order" $rc; [ $rc = 0 ] || status=1
  grep -E "passed|failed|PASSED|FAILED|free\(\)" "$OUT/order.txt" | tail -5 | tee -a "$S"
  timeout 20 python3 -X faulthandler python/bench/binding_cost.py --device cuda --calls 3000 \
    --json "$OUT/binding_cost.json" > "$OUT/binding.txt" 2>&1
  rc=$?; step "binding cost (limit 50 us)" $rc; [ $rc = 0 ] || status=1
  grep -E "binding|median|attend|bare|Error|error|free|Fatal" "$OUT/binding.txt" | head -12 | tee -a "$S"
fi
if [ "$part" != tests ] && [ $(( $(left) - 3 )) -gt 30 ]; then
  t=$(( $(left) - 3 ))
  timeout $t python3 python/bench/transformers_step.py --ctx 8192,32768 --batch 8,1 --steps 6 --warmup 3 --passes 2 \
    --json "$OUT/transformers_step.json" >> "$OUT/speed.txt" 2>&1
  rc=$?; step "speed table (timeout $t s)" $rc; [ $rc = 0 ] || status=1
  tail -14 "$OUT/speed.txt" >> "$S"
fi
echo "status=$status" | tee -a "$S"
# Everything but the summary in one archive (the device tool brings back few files).
(cd "$OUT" && ls | grep -vx -e summary.txt -e h-py.tgz | tar czf h-py.tgz -T - && ls | grep -vx -e summary.txt -e h-py.tgz | xargs rm -f)
exit $status
