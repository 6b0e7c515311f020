#!/usr/bin/env bash
# h-cpu24 (issue 24) on the GPU machine: CPU = CUDA where the tests check it, after the Quest CPU
# bounds moved to "bound order" (AVX2 / FMA) and the CPU prefill / statistics changes: the
# selection tests (CUDA bounds vs page_bounds_cpu bit for bit), Quest / RaaS / DELTA / DPXA /
# Seer CUDA plugin tests (same pages as the CPU path), and the CUDA attention tests. Logs in $OUT.
set -uo pipefail
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
bash bench/device_all.sh --fresh --ctest-regex \
  'Selection|PageBound|Quest|Raas|RaaS|Delta|Dpxa|DPXA|Seer|AttentionCuda|kernels_' \
  > "$OUT/h-cpu24.log" 2>&1
echo "device_all rc=$?" >> "$OUT/h-cpu24.log"
