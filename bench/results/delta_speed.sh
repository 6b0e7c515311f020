#!/usr/bin/env bash
# DELTA on the GPU machine, one device call: build; the core CUDA kernel tests (the page statistics
# from the tensor-core row kernel's logits) and the delta CUDA tests, the decode tensor-core cases
# and the delta tests under compute-sanitizer memcheck; then the policy-step benchmark of issue 6
# (28 layers, 28q/4kv d128 bf16, K = 1024, the paper's Δ-layers [2,14,22] and a single Δ-layer [2])
# and a 1-layer model whose only layer is a Δ-layer beside dense (the cost of one Δ-layer's
# statistics + selection over a dense layer), the latter also under Nsight Compute for the time of
# each kernel of a Δ-layer. Logs and JSON under $OUT (default build-device/out; build dir $B, default build-device-delta).
#
#   bench/results/delta_speed.sh [--no-tests] [--no-bench28] [--no-ncu]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/build-device/out}
mkdir -p "$OUT"
tests=1 bench28=1 ncu=1
for a in "$@"; do
  case "$a" in
    --no-tests) tests=0 ;;
    --no-bench28) bench28=0 ;;
    --no-ncu) ncu=0 ;;
    *) echo "unknown option $a" >&2; exit 2 ;;
  esac
done
B=${B:-build-device-delta}  # its own build dir: a shared one may hold objects built from other trees
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" > "$OUT/build.log" 2>&1 &&
  cmake --build $B -j16 --target sieve_bench sieve_plugin_delta test_plugin_delta_cuda cuda_test >> "$OUT/build.log" 2>&1 ||
  { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"

if [ $tests = 1 ]; then
  { $B/bin/cuda_test --gtest_brief=1 2>&1 | tail -4
    $B/bin/test_plugin_delta_cuda --gtest_brief=1 2>&1 | tail -4
    compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/cuda_test --gtest_brief=1 \
      --gtest_filter='AttentionCudaTensorCores.Decode*:AttentionCuda.Decode*' 2>&1 | tail -4
    echo "memcheck cuda_test rc=${PIPESTATUS[0]}"
    compute-sanitizer --tool memcheck --error-exitcode 9 $B/bin/test_plugin_delta_cuda --gtest_brief=1 2>&1 | tail -4
    echo "memcheck delta rc=${PIPESTATUS[0]}"
  } > "$OUT/test.log" 2>&1
  grep -E "PASSED|FAILED|rc=|ERROR SUMMARY" "$OUT/test.log"
fi

GEO=(--layers 28 --hq 28 --hkv 4 --d 128 --page 16 --dtype bf16)
D3='decode:*=delta(token_budget=1024,recent=32,dense_layers=[0,1],select_layers=[2,14,22])'
D1='decode:*=delta(token_budget=1024,recent=32,dense_layers=[0,1],select_layers=[2])'
if [ $bench28 = 1 ]; then
  t0=$(date +%s)
  $B/bin/sieve_bench --policy --phase decode --chain "$D3" --chain "$D1" "${GEO[@]}" --ctx 32768 --batch 1,16 \
    --steps 10 --warmup 2 --json="$OUT/bench28.json" > "$OUT/bench28.log" 2>&1
  sed -n '/== Sieve policy step/,$p' "$OUT/bench28.log" | grep -v "^\[" | head -12
  echo "bench28: $(( $(date +%s) - t0 )) s"
fi
t0=$(date +%s)
ONE=(--policy --phase decode --chain 'decode:*=delta(token_budget=1024,recent=32,select_layers=[0])'
     --layers 1 --hq 28 --hkv 4 --d 128 --page 16 --dtype bf16 --ctx 32768 --batch 16)
$B/bin/sieve_bench "${ONE[@]}" --steps 30 --warmup 3 --json="$OUT/bench1.json" > "$OUT/bench1.log" 2>&1
sed -n '/== Sieve policy step/,$p' "$OUT/bench1.log" | grep -v "^\[" | head -6
echo "bench1: $(( $(date +%s) - t0 )) s"
if [ $ncu = 1 ]; then
  ncu --clock-control none --metrics gpu__time_duration.sum --csv \
    -k 'regex:row_mma|page_mass|split_combine|top_k|delta_scores|copy_selection' \
    $B/bin/sieve_bench "${ONE[@]}" --steps 2 --warmup 1 > "$OUT/ncu.csv" 2> "$OUT/ncu.err"
  # Per kernel: launches and mean duration (us); row_mma appears with statistics (the Δ-layer's
  # step) and without (dense chain, core-only timings).
  python3 - "$OUT/ncu.csv" <<'EOF'
import csv, sys, collections, re
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: sys.exit("ncu: no rows")
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ui = h.index("Metric Unit")
d = collections.defaultdict(list)
for r in rows[1:]:
    v = float(r[vi].replace(",", "")); v = v / 1000 if r[ui] in ("ns", "nsecond") else v * 1000 if r[ui] in ("ms", "msecond") else v
    d[re.sub(r"\(.*", "", r[ki]).split("::")[-1]].append(v)
for k, v in sorted(d.items()):
    if k.startswith("row_mma"): print(k, "in launch order (us):", " ".join(f"{x:.0f}" for x in v))
    v.sort(); print(f"{k[:50]:50s} n={len(v):3d} median={v[len(v)//2]:9.2f} us  min={v[0]:9.2f}  max={v[-1]:9.2f}")
EOF
fi
