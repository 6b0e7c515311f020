#!/usr/bin/env bash
# Lead's call A of the fifth session (2026-11-28 ~03:30 UTC): one build of main merged with the helper
# branches under test, then each branch's gpu/<branch>.sh against it under its own time limit.
#   bash gpu/lead-2026-11-28-F.sh h-bind:120 h-pf:100 ...
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/x; mkdir -p $X; st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; git log --oneline -1; } > $X/summary.txt 2>&1
OUT=$X/build bash bench/device_all.sh --fresh --no-tests > $X/device_all.txt 2>&1; st "build rc=$? $(grep -E '^build:' $X/device_all.txt)"
for spec in "$@"; do
  b=${spec%%:*}; t=${spec#*:}
  mkdir -p $X/$b
  ( cd $R && OUT=$X/$b SIEVE_BUILD=build-device-all timeout $((t + 15)) bash gpu/$b.sh > $X/$b/stdout.txt 2>&1 ); st "$b rc=$? (limit $t s)"
done
cd $X && tar czf $OUT/all.tgz . && cat summary.txt
