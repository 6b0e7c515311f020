#!/usr/bin/env bash
# One call on the GPU machine for the whole project: build everything with CUDA, run the whole
# test suite there (the CUDA tests really run), compute-sanitizer memcheck on the plugins' CUDA
# tests, then the policy benchmarks listed in a file (one `sieve_bench --policy ...` per line, `#`
# comments; each line's JSON is merged into one file) and optionally the kernel suite.
# Logs and JSON go to $OUT (the device tool brings back at most 8 files).
#
#   bench/device_all.sh [--fresh] [--no-build-tests] [--no-tests] [--memcheck] [--suite]
#                       [--policy-cases FILE] [--case-timeout S] [--ctest-regex RE]
#
# --fresh starts from an empty build directory: a warm machine keeps build outputs between calls,
# and a tree copied later can carry older timestamps than the objects there (Ninja would then
# keep stale objects).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/build-device-out}
mkdir -p "$OUT"
tests=1 memcheck=0 suite=0 cases="" regex="" build_tests=ON fresh=0 case_timeout=0
while [ $# -gt 0 ]; do
  case "$1" in
    --fresh) fresh=1 ;;
    --no-tests) tests=0 ;;
    --no-build-tests) build_tests=OFF; tests=0 ;;
    --memcheck) memcheck=1 ;;
    --suite) suite=1 ;;
    --policy-cases) cases="$2"; shift ;;
    --case-timeout) case_timeout="$2"; shift ;;  # seconds per policy line (0: none); 124 = timed out
    --ctest-regex) regex="$2"; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
B=build-device-all
# The GPU image has no libboost_program_options: the CLI (and the SDK test's installed CLI) run
# with the carried Debian library (.devdeps, see docs/bench/README.md) on the loader path.
if [ -d "$PWD/.devdeps/usr/lib/x86_64-linux-gnu" ]; then
  export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
[ $fresh = 1 ] && rm -rf $B
LOG="$OUT/build.log"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nvcc --version | tail -1; date -u; } > "$LOG" 2>&1
head -2 "$LOG" | tail -1
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_CUDA_HOPPER=ON -DSIEVE_BUILD_TESTS=$build_tests \
  -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" >> "$LOG" 2>&1 \
  || { tail -30 "$LOG"; exit 1; }
cmake --build $B -j 16 >> "$LOG" 2>&1 || { grep -E "error|FAILED" "$LOG" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
status=0
if [ $tests = 1 ]; then
  t0=$(date +%s)
  ctest --test-dir $B -j 8 --timeout 300 ${regex:+-R "$regex"} > "$OUT/ctest.log" 2>&1; rc=$?
  grep -E "tests passed|tests failed|\*\*\*Failed|Timeout|Not Run" "$OUT/ctest.log" | head -30
  echo "ctest rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || status=1
  # Every CUDA test that skipped here would be a defect on a GPU machine: list skips.
  grep -h "SKIPPED\|Skipped" "$OUT/ctest.log" | head -5
fi
if [ $memcheck = 1 ]; then
  t0=$(date +%s)
  : > "$OUT/memcheck.log"
  for t in $B/bin/test_plugin_*_cuda $B/bin/test_selection_cuda; do
    [ -x "$t" ] || continue
    echo "== $t" >> "$OUT/memcheck.log"
    compute-sanitizer --tool memcheck --error-exitcode 9 "$t" --gtest_brief=1 >> "$OUT/memcheck.log" 2>&1
    rc=$?; echo "$(basename $t): memcheck rc=$rc"; [ $rc = 0 ] || status=1
  done
  echo "memcheck: $(( $(date +%s) - t0 )) s"
fi
if [ -n "$cases" ]; then
  t0=$(date +%s)
  : > "$OUT/policy.log"
  rm -f $B/policy-*.json
  # SeerAttention-R's speed rows need a gate file of their geometry (untrained: speed only).
  [ -x $B/bin/seer_random_gate ] && $B/bin/seer_random_gate --out $B/seer_64q8kv.safetensors \
    --layers 1 --hq 64 --hkv 8 --d 128 --block 64 >> "$OUT/policy.log" 2>&1
  i=0
  while IFS= read -r line; do
    case "$line" in ''|'#'*) continue ;; esac
    i=$((i + 1))
    echo "== $line" >> "$OUT/policy.log"
    t1=$(date +%s)
    eval "timeout $case_timeout $B/bin/sieve_bench $line --json=$B/policy-$i.json" >> "$OUT/policy.log" 2>&1
    rc=$?; echo "policy case $i rc=$rc ($(( $(date +%s) - t1 )) s)"; [ $rc = 0 ] || status=1
  done < "$cases"
  python3 - "$B" "$OUT/policy.json" <<'EOF'
import glob, json, sys
runs = []
for p in sorted(glob.glob(sys.argv[1] + "/policy-*.json"), key=lambda s: int(s.rsplit("-", 1)[1][:-5])):
    try:
        runs.append(json.load(open(p)))
    except ValueError as e:
        runs.append({"file": p, "error": str(e)})
json.dump({"kind": "policy-batch", "runs": runs}, open(sys.argv[2], "w"), indent=1)
EOF
  grep -E "speed-up|speedup|x dense|TARGET|target" "$OUT/policy.log" | head -60
  echo "policy benchmarks: $(( $(date +%s) - t0 )) s"
fi
if [ $suite = 1 ]; then
  t0=$(date +%s)
  $B/bin/sieve_bench --sdpa --json="$OUT/bench.json" > "$OUT/bench.log" 2>&1; rc=$?
  sed -n '/== Sieve attention benchmark/,$p' "$OUT/bench.log" | tail -40
  echo "suite rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || status=1
fi
exit $status
