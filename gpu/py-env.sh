# Sourced by the GPU scripts of the Python package (gpu/h-py.sh, gpu/h-bind.sh): the repository
# root, $OUT, the device machine's libraries, the build ($SIEVE_BUILD used as is, else
# bench/device_all.sh), the package's environment, and helpers:
#   step NAME RC     one summary line (to $S) with the seconds since the budget started
#   left             seconds left of $budget
#   five_lines FILE  the five-line block of docs/engines/transformers.md, as written, into FILE
# Before sourcing: budget (seconds, counted from after the build).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/build-device-out}
mkdir -p "$OUT"
if [ -d "$PWD/.devdeps/usr/lib/x86_64-linux-gnu" ]; then
  export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
S="$OUT/summary.txt"
: > "$S"
start=$(date +%s)
step() { echo "== $1: rc=$2 (at $(( $(date +%s) - start )) s)" | tee -a "$S"; }
left() { echo $(( budget - ($(date +%s) - start) )); }
five_lines() {
  awk '/<!-- five-lines -->/{f=1; next} f && /^```python/{g=1; next} g && /^```/{exit} g' docs/engines/transformers.md > "$1"
}
B=${SIEVE_BUILD:-}
if [ -z "$B" ]; then
  bash bench/device_all.sh --fresh --no-tests > "$OUT/build.txt" 2>&1; rc=$?; step build $rc
  [ $rc = 0 ] || { tail -20 "$OUT/build.txt" | tee -a "$S"; exit 1; }
  B=build-device-all
fi
B=$(cd "$B" && pwd)
start=$(date +%s)  # the budget is counted from here (the build is the lead's or device_all's)
export PYTHONPATH="$B/python" SIEVE_TEST_PLUGIN_DIR="$B/lib/sieve/plugins" SIEVE_TEST_BIN_DIR="$B/bin" PYTHONUNBUFFERED=1
