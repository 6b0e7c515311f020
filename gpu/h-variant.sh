#!/usr/bin/env bash
# h-variant on the GPU machine (issue 22: the core kernels' attention variant), from the
# repository root, self-limited to ~100 s (HV_BASE=1: ~200 s, the baseline built and benched too):
#   1. this tree: $SIEVE_BUILD as is, or built here (bench/device_all.sh --fresh --no-tests);
#      with HV_BASE=1 (or when .xfer/base/build is already there) the baseline .xfer/base beside it
#      (a `git archive aee063e` tree: deltakv's and dpxa's own attention kernels), its bench and
#      three plugins only; without it the rows read against dense of the same run;
#   2. the variant's CUDA tests (AttentionVariantCuda.*, test_plugin_deltakv_cuda,
#      test_plugin_dpxa_deltax_cuda, DpxaCuda.ChunkedPrefillUpToMaxSeqLenFitsTheScratch) and
#      compute-sanitizer memcheck on them (after the bench);
#   3. the prefill rows of docs/results/variant_speed_h200.md, base then new per chain pair, then
#      the memcheck runs of 2.;
#   4. if time is left: per-kernel times under ncu (gpu__time_duration) of stage 3, base vs new.
# Everything under $OUT/h-variant.tgz (summary.txt first).
set -uo pipefail
OUT=${OUT:?}
R=$PWD
export LD_LIBRARY_PATH="$R/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
X=$OUT/h-variant; mkdir -p "$X"
S=$SECONDS
T=$([ "${HV_BASE:-0}" = 1 ] && echo 100 || echo 0)  # extra seconds when the baseline is built
st() { echo "[$((SECONDS - S)) s] $*" | tee -a "$X/summary.txt"; }
left() { [ $((SECONDS - S)) -lt "$1" ] || { st "skipped (time): $2"; return 1; }; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; } > "$X/summary.txt" 2>&1

# 1. builds: the baseline in the background (8 cores), this tree unless given.
BASE=$R/.xfer/base
BB=$BASE/build/bin
base_pid=
if [ -x "$BB/sieve_bench" ] && [ -e "$BASE/build/lib/sieve/plugins/libsieve_deltakv.so" ]; then
  st "base: already built"
elif [ "${HV_BASE:-0}" != 1 ]; then
  st "base: not built (HV_BASE=1 builds it): rows against dense only"
elif [ -f "$BASE/CMakeLists.txt" ]; then
  ln -sfn "$R/.devdeps" "$BASE/.devdeps"
  ( cd "$BASE" && timeout 150 cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON \
      -DSIEVE_BUILD_TESTS=OFF -DCMAKE_PREFIX_PATH="$R/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$R/.devdeps/usr/include" &&
    timeout 150 cmake --build build -j 8 --target sieve_bench sieve_plugin_dpxa sieve_plugin_deltakv sieve_plugin_dense ) \
    > "$X/base_build.log" 2>&1 &
  base_pid=$!
else
  st "no baseline tree at .xfer/base (git archive aee063e): base rows skipped"
fi
B=${SIEVE_BUILD:-}
if [ -z "$B" ]; then
  OUT=$X bash bench/device_all.sh --fresh --no-tests > "$X/device_all.txt" 2>&1 || { st "build failed"; tail -20 "$X/device_all.txt"; }
  B=build-device-all
fi
NB=$R/$B/bin; [ -d "$NB" ] || NB=$B/bin
st "new tree: $NB"

# 2. tests and memcheck (beside the baseline's build).
# Of dpxa's selection only the chunked prefill that once overran its tile scratch (the whole suite
# runs in the integrated call); under memcheck it goes first.
tests=("$NB/test_plugin_dpxa_cuda --gtest_filter=DpxaCuda.ChunkedPrefill*" "$NB/cuda_test --gtest_filter=AttentionVariantCuda.*"
       "$NB/test_plugin_deltakv_cuda" "$NB/test_plugin_dpxa_deltax_cuda")
checked=("${tests[@]}")
for t in "${tests[@]}"; do
  timeout 60 $t --gtest_brief=1 > "$X/test_$(basename "${t%% *}").log" 2>&1
  st "test $(basename "${t%% *}") rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$X/test_$(basename "${t%% *}").log" | tr '\n' ' ')"
done
if [ -n "$base_pid" ]; then wait "$base_pid"; st "base build rc=$? $(tail -1 "$X/base_build.log")"; fi

# 3. the bench rows, base then new for each chain pair (same commands as the doc's table).
C="--policy --phase prefill --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 16384,32768 --batch 1"
bench() {  # tree bin name keys chain chain
  local tree=$1 bin=$2 name=$3 keys=$4; shift 4
  [ -x "$bin/sieve_bench" ] || { st "no $tree sieve_bench (skipped)"; return; }
  echo "==== $tree $name" >> "$X/bench.log"
  timeout 45 "$bin/sieve_bench" $C --chain "$1" --chain "$2" --keys "$keys" --steps 3 --warmup 1 --samples 1 \
    --json="$X/${tree}_${name}.json" >> "$X/bench.log" 2>&1
  st "bench $tree $name rc=$?"
}
for tree in base new; do b=$NB; [ $tree = base ] && b=$BB
  left $((45 + T)) "bench $tree deltakv" && bench $tree "$b" deltakv similar 'prefill:*=deltakv(threshold=0.83)' 'prefill:*=deltakv(threshold=0.78)'
done
for tree in base new; do b=$NB; [ $tree = base ] && b=$BB
  left $((60 + T)) "bench $tree deltax" && bench $tree "$b" deltax similar:0.88 'prefill:*=dpxa(tau=0.9)' 'prefill:*=dpxa(tau=0.9,mode=deltax)'
done
grep -E "^====|deltakv\(|deltax\)|dense " "$X/bench.log" >> "$X/summary.txt"

# Memcheck after the bench (the bench first, so its rows fit the time).
for t in "${checked[@]}"; do
  left $((95 + T)) "memcheck $t" || break
  timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $t --gtest_brief=1 > "$X/memcheck_$(basename "${t%% *}").log" 2>&1
  st "memcheck $(basename "${t%% *}") rc=$? $(grep 'ERROR SUMMARY' "$X/memcheck_$(basename "${t%% *}").log")"
done

# 4. stage 3 alone: kernel durations under ncu at 16K (deltakv 0.83), base vs new.
if command -v ncu > /dev/null; then
  for tree in base new; do b=$NB; [ $tree = base ] && b=$BB
    left $((90 + T)) "ncu $tree" || break
    timeout 30 ncu --clock-control none --metrics gpu__time_duration.sum --csv -k 'regex:variant|deltakv|deltax' \
      "$b/sieve_bench" --policy --phase prefill --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 16384 \
      --batch 1 --chain 'prefill:*=deltakv(threshold=0.83)' --keys similar --steps 1 --warmup 0 --samples 1 \
      > "$X/ncu_$tree.csv" 2> "$X/ncu_$tree.err"
    st "ncu $tree rc=$? $(grep -E 'gpu__time_duration' "$X/ncu_$tree.csv" | awk -F'","' '{print $5 ": " $NF}' | sort | uniq -c | head -6 | tr '\n' ';')"
  done
fi
st done
cd "$X" && tar czf "$OUT/h-variant.tgz" . && cp summary.txt "$OUT/h-variant-summary.txt"
