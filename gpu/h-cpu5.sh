#!/usr/bin/env bash
# h-cpu5 (issue 24) on the GPU machine: CPU = CUDA selections after the CPU selection changes
# (Quest's AVX2 bound-order loads, the packed-key top-k, the page-mass sweep split over pages,
# DPXA's threaded CPU select). Runs the test binaries that compare the CPU paths with CUDA, then
# (host side) the selection micro-benchmarks on 2 threads; stops itself within ~110 s once built.
# Logs in $OUT.
#   SIEVE_BUILD=build-device-all bash gpu/h-cpu5.sh     (else it builds with device_all.sh)
set -uo pipefail
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=${SIEVE_BUILD:-}
if [ -z "$B" ]; then
  timeout 420 bash bench/device_all.sh --fresh --no-tests > "$OUT/build.log" 2>&1
  B=build-device-all
fi
{
  START=$SECONDS
  for t in test_selection_cuda test_plugin_quest_cuda test_plugin_delta_cuda test_plugin_dpxa_cuda; do
    T=$((100 - (SECONDS - START)))
    if [ "$T" -le 1 ]; then
      echo "$t: skipped, out of time"
    elif [ -x "$B/bin/$t" ]; then
      timeout "$T" "$B/bin/$t" > "$OUT/$t.log" 2>&1
      echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$OUT/$t.log" | tr '\n' ' ')"
    else
      echo "$t: not built in $B"
    fi
  done
  LEFT=$((110 - (SECONDS - START)))
  [ -x "$B/bin/sieve_selection_bench" ] && [ "$LEFT" -gt 5 ] && OMP_NUM_THREADS=2 timeout "$LEFT" \
    "$B/bin/sieve_selection_bench" --benchmark_min_time=0.05 > "$OUT/selection_bench.txt" 2>&1
  echo "selection_bench rc=$?"
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
