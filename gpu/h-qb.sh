#!/usr/bin/env bash
# h-qb (issue 20, Quest's select) on the GPU machine, one call, from the repository root; ends by
# itself within ~72 s of GPU work when the tree is prebuilt ($SIEVE_BUILD):
#   1. the Quest CUDA tests: core/selection's kernels against the CPU bit for bit (the bound
#      kernel's new walk: long sequences, head_dim 64 / 128, NaN / inf records, forced grids),
#      quest's and raas's CUDA selections against their CPU ones;
#   2. the policy bench line of docs/bench/policy.md's Quest section (dense, quest gqa_share and
#      per query head, 32q/8kv d128 bf16 page 16, ctx 32K / 128K x batch 1 / 16, beside SDPA);
#   3. Nsight Compute on page_bounds_fast at batch 1 and 16 x 32K (gqa_share): duration, DRAM
#      throughput and bytes, registers, achieved occupancy, instructions, grid;
#   4. compute-sanitizer memcheck on the bound tests.
#   bash gpu/h-qb.sh
# $SIEVE_BUILD: the build directory, used as is; unset: bench/device_all.sh --fresh --no-tests
# builds it (not counted in the time limit). Everything goes to $OUT: summary.txt, policy.json,
# ncu.csv, ncu_launches.csv and h-qb.tgz (tests.log, memcheck.log, policy.log, ncu.log).
set -uo pipefail
OUT=${OUT:?}
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=${SIEVE_BUILD:-}
if [ -z "$B" ]; then
  bash bench/device_all.sh --fresh --no-tests || exit 1
  B=build-device-all
fi
W=$OUT/work
mkdir -p "$W"
S=$OUT/summary.txt
T0=$(date +%s)
LIMIT=72
stamp() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$S"; }
# A step's timeout: its own budget, cut to what is left of LIMIT (0: skip it).
budget() { local left=$(( LIMIT - ($(date +%s) - T0) )); [ "$left" -lt "$1" ] && echo "$left" || echo "$1"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; git log -1 --format='%h %s' | cut -c1-100; date -u; } > "$S" 2>&1

status=0
: > "$W/tests.log"
for t in "test_selection_cuda" "test_plugin_quest_cuda" "test_plugin_raas_cuda"; do
  s=$(budget 12); [ "$s" -gt 2 ] || { stamp "skipped (time): $t"; continue; }
  echo "==== $t" >> "$W/tests.log"
  timeout "$s" "$B/bin/$t" --gtest_brief=1 >> "$W/tests.log" 2>&1; rc=$?
  stamp "$t rc=$rc"; [ $rc = 0 ] || status=1
done
grep -E "FAILED|Failure|PASSED|SKIPPED" "$W/tests.log" | head -12 >> "$S"

POLICY=(--policy --phase decode --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16)
s=$(budget 24)
if [ "$s" -gt 5 ]; then
  timeout "$s" "$B/bin/sieve_bench" "${POLICY[@]}" --ctx 32768,131072 --batch 1,16 --sdpa \
    --chain 'quest(token_budget=2048,gqa_share=true)' --chain 'quest(token_budget=2048)' \
    --json="$OUT/policy.json" > "$W/policy.log" 2>&1
  stamp "policy rc=$?"
  grep -E "^ *(32768|131072) " "$W/policy.log" | cut -c1-200 >> "$S"
else
  stamp "skipped (time): policy"
fi

s=$(budget 20)
if [ "$s" -gt 5 ] && command -v ncu > /dev/null; then
  timeout "$s" ncu --clock-control none -k regex:page_bounds_fast --launch-count 10 --csv \
    --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__grid_size,smsp__inst_executed.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed \
    "$B/bin/sieve_bench" "${POLICY[@]}" --ctx 32768 --batch 1,16 --steps 2 --warmup 1 \
    --chain 'quest(token_budget=2048,gqa_share=true)' > "$W/ncu.log" 2>&1
  stamp "ncu rc=$?"
  grep -E '^"' "$W/ncu.log" > "$OUT/ncu.csv"
  # kernel, grid, metric, value (one line each)
  python3 - "$OUT/ncu.csv" >> "$S" 2>&1 <<'PY' || true
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
for r in rows:
    print(r.get("ID"), r.get("Kernel Name", "")[:40], r.get("Grid Size"), r.get("Metric Name"), r.get("Metric Unit"), r.get("Metric Value"))
PY
else
  stamp "skipped (time or no ncu): ncu"
fi

# Every launch of the select column at batch 16 x 32K (the breakdown table of docs/bench/policy.md),
# gqa_share and per query head.
s=$(budget 18)
if [ "$s" -gt 8 ] && command -v ncu > /dev/null; then
  for chain in 'quest(token_budget=2048,gqa_share=true)' 'quest(token_budget=2048)'; do
    echo "==== $chain" >> "$OUT/ncu_launches.csv"
    timeout 8 ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      -k regex:'page_bounds|top_k|minmax_append|scatter_tokens|publish_view' \
      "$B/bin/sieve_bench" "${POLICY[@]}" --ctx 32768 --batch 16 --steps 3 --warmup 1 --chain "$chain" \
      2>&1 | grep -E '^(====|")' >> "$OUT/ncu_launches.csv"
  done
  stamp "ncu launches done"
  python3 - "$OUT/ncu_launches.csv" >> "$S" 2>&1 <<'PY' || true
import collections, csv, statistics, sys
for part in open(sys.argv[1]).read().split("==== ")[1:]:
    head, _, body = part.partition("\n")
    times = collections.defaultdict(list)
    for r in csv.DictReader(body.splitlines()):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            name = r["Kernel Name"].split("<")[0].split("(")[0].split("::")[-1]
            times[(name, r["Grid Size"])].append(float(r["Metric Value"].replace(",", "")) / 1000)
    print(head)
    for (k, g), v in times.items():
        print(f"  {k:24s} {g:14s} n={len(v)} median {statistics.median(v):7.1f} us")
PY
fi

s=$(budget 25)
if [ "$s" -gt 5 ]; then
  timeout "$s" compute-sanitizer --tool memcheck --error-exitcode 9 "$B/bin/test_selection_cuda" --gtest_brief=1 \
    --gtest_filter='*Bounds*:*MinMax*' > "$W/memcheck.log" 2>&1
  rc=$?; stamp "memcheck test_selection_cuda (bounds) rc=$rc (9: errors found, 124: time)"
  [ $rc = 0 ] || [ $rc = 124 ] || status=1
  grep -E "ERROR SUMMARY|FAILED" "$W/memcheck.log" | head -5 >> "$S"
else
  stamp "skipped (time): memcheck"
fi
tar -czf "$OUT/h-qb.tgz" -C "$W" . && rm -rf "$W"
stamp "done (status $status)"
exit $status
