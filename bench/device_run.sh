#!/usr/bin/env bash
# One call on the GPU machine: build the CUDA kernels, tests and benchmark; run the CUDA tests
# (optionally under compute-sanitizer memcheck); count the tensor-core instructions in the
# kernels' SASS; run the benchmark suite with PyTorch SDPA side by side. Logs and JSON go to $OUT
# (default build-device/out; at most 7 files, the device tool's limit is 8). The GPU image lacks
# dlpack/nlohmann headers: they come from .devdeps.
#
#   bench/device_run.sh [--memcheck] [--no-tests] [--no-bench] [-- sieve_bench args...]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/build-device/out}
mkdir -p "$OUT"
memcheck=0 tests=1 bench=1
while [ $# -gt 0 ]; do
  case "$1" in
    --memcheck) memcheck=1 ;;
    --no-tests) tests=0 ;;
    --no-bench) bench=0 ;;
    --) shift; break ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
B=build-device
LOG="$OUT/build.log"
{
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
  nvcc --version | tail -2
  nproc
} > "$LOG" 2>&1
head -3 "$LOG"

t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" \
  >> "$LOG" 2>&1 || { tail -30 "$LOG"; exit 1; }
cmake --build $B -j 16 --target cuda_test sieve_bench >> "$LOG" 2>&1 || { grep -E "error|FAILED" "$LOG" | head -40; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

# Tensor-core instructions in the tensor-core kernels (HMMA = mma.sync, LDSM = ldmatrix).
for o in attention_decode_mma attention_prefill_mma attention_row; do
  f=$B/core/kernels/CMakeFiles/sieve_kernels.dir/cuda/$o.cu.o
  [ -f "$f" ] && echo "$o: $(cuobjdump -sass "$f" | grep -c HMMA) HMMA, $(cuobjdump -sass "$f" | grep -c LDSM) LDSM, $(cuobjdump -sass "$f" | grep -cE 'LDL|STL') LDL/STL"
done 2>&1 | tee "$OUT/sass.txt"

status=0
if [ $tests = 1 ]; then
  t0=$(date +%s)
  $B/bin/cuda_test --gtest_brief=1 > "$OUT/cuda_test.log" 2>&1; rc=$?
  tail -5 "$OUT/cuda_test.log"; grep -E "^\[  FAILED|Failure|error" "$OUT/cuda_test.log" | head -30
  echo "cuda_test rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || status=1
  if [ $memcheck = 1 ]; then
    t0=$(date +%s)
    compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/cuda_test --gtest_brief=1 \
      --gtest_filter='AttentionCudaTensorCores.*:AttentionCuda.Decode*:AttentionCuda.Prefill*' > "$OUT/memcheck.log" 2>&1; rc=$?
    tail -4 "$OUT/memcheck.log"; echo "memcheck rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || status=1
  fi
fi
if [ $bench = 1 ]; then
  t0=$(date +%s)
  $B/bin/sieve_bench --sdpa --json="$OUT/bench.json" "$@" > "$OUT/bench.log" 2> "$OUT/bench.err"; rc=$?
  sed -n '/== Sieve attention benchmark/,$p' "$OUT/bench.log"
  tail -3 "$OUT/bench.err"
  echo "bench rc=$rc ($(( $(date +%s) - t0 )) s)"; [ $rc = 0 ] || status=1
fi
exit $status
