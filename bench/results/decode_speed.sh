#!/usr/bin/env bash
# Issue 20 on the GPU machine, one call: build sieve_bench and cuda_test, run the CUDA attention
# tests (decode and tensor-core cases) and the paged CUDA store's (under compute-sanitizer
# memcheck with --memcheck), then the
# dense decode cases against PyTorch SDPA and the read-only ceiling. Every VARIANT given as
# NAME=ENV (e.g. bulk=SIEVE_DECODE_BULK=1) repeats the timing with that environment ("base" has
# none); --tests and --policy name the variants (comma list) that also run the tests / the
# policy-step benchmark.
# Logs go to $OUT (the device tool brings back at most 8 files).
#
# The policy-step benchmark: dense, 32q/8kv d128, 1 layer, bs 1/16, 32K/128K: the whole runtime
# step beside the core kernel alone.
#
#   bench/results/decode_speed.sh [--memcheck] [--tests N,..] [--policy N,..] [--filter REGEX] [VARIANT...]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-device-out}
mkdir -p "$OUT"
DEPS=${DEVDEPS:-$PWD/.devdeps}
[ -d "$DEPS" ] || DEPS=$PWD/../../.devdeps
memcheck=0 policy=, tests=,base,
filter='gpu/decode/32q8kv128/bs(1|16)/ctx(32768|131072)/bf16/dense$'
variants=("base=")
while [ $# -gt 0 ]; do
  case "$1" in
    --memcheck) memcheck=1 ;;
    --policy) policy=",$2,"; shift ;;
    --tests) tests=",$2,"; shift ;;
    --filter) filter="$2"; shift ;;
    *=*) variants+=("$1") ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
B=build-device
LOG="$OUT/build.log"
L=$B/logs; rm -rf $L; mkdir -p $L
{ nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv; date -u; } > "$LOG" 2>&1
head -2 "$LOG" | tail -1
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$DEPS/usr" -DDLPACK_INCLUDE_DIR="$DEPS/usr/include" >> "$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
cmake --build $B -j 16 --target cuda_test sieve_bench >> "$LOG" 2>&1 || { grep -E "error|FAILED" "$LOG" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
gfilter='AttentionCudaTensorCores.*:AttentionCuda.Decode*:AttentionCuda.CapturesIntoACudaGraph:PagedStoreCuda*'
status=0
for v in "${variants[@]}"; do
  name=${v%%=*} env=${v#*=}
  case "$tests" in *,$name,*) ;; *) continue ;; esac
  t0=$(date +%s)
  env $env $B/bin/cuda_test --gtest_brief=1 --gtest_filter="$gfilter" > "$L/test-$name.log" 2>&1; rc=$?
  grep -E "^\[  FAILED|PASSED" "$L/test-$name.log" | head -8
  echo "[$name] cuda_test rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || status=1
  if [ $memcheck = 1 ]; then
    t0=$(date +%s)
    env $env compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/cuda_test --gtest_brief=1 \
      --gtest_filter="$gfilter" > "$L/memcheck-$name.log" 2>&1; rc=$?
    tail -2 "$L/memcheck-$name.log"; echo "[$name] memcheck rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || status=1
  fi
done
sdpa=--sdpa
for v in "${variants[@]}"; do
  name=${v%%=*} env=${v#*=}
  env $env $B/bin/sieve_bench $sdpa --filter="$filter" --json="$L/bench-$name.json" > "$L/bench-$name.log" 2>&1; rc=$?
  echo "[$name] bench rc=$rc"; [ $rc = 0 ] || status=1
  sdpa=""
done
if [ "$policy" != , ]; then
  for v in "${variants[@]}"; do
    name=${v%%=*} env=${v#*=}
    case "$policy" in *,$name,*) ;; *) continue ;; esac
    env $env $B/bin/sieve_bench --policy --phase decode --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 \
      --ctx 32768,131072 --batch 1,16 --json "$L/policy-$name.json" > "$L/policy-$name.log" 2>&1; rc=$?
    echo "[$name] policy rc=$rc"; [ $rc = 0 ] || status=1
  done
fi
for v in "${variants[@]}"; do
  name=${v%%=*}
  [ -f "$L/policy-$name.log" ] && { echo "== policy $name"; grep -E "^ *(32768|131072|ctx|context)" "$L/policy-$name.log" | cut -c1-150; }
  echo "== $name"; grep -E "^GPU|^gpu/|^  decode|NOT MET|MET  " "$L/bench-$name.log" | cut -c1-150
done
# At most 8 files come back: one log per kind, every variant's section headed by its name.
for kind in test memcheck bench policy; do
  for f in $L/$kind-*.log; do [ -f "$f" ] && { echo "==== $(basename $f .log)"; cat "$f"; }; done > "$OUT/$kind.log"
  [ -s "$OUT/$kind.log" ] || rm -f "$OUT/$kind.log"
done
python3 - "$L" "$OUT/results.json" <<'PY'
import glob, json, os, sys
out = {}
for p in sorted(glob.glob(sys.argv[1] + "/*.json")):
    try:
        out[os.path.basename(p)[:-5]] = json.load(open(p))
    except ValueError as e:
        out[os.path.basename(p)[:-5]] = {"error": str(e)}
json.dump(out, open(sys.argv[2], "w"), indent=1)
PY
exit $status
