#!/usr/bin/env bash
# Lead's call E of the sixth session (the last ~4 device minutes): the stall reasons of the two issue-21
# misses whose attention is the attention-variant kernel, not the Hopper one. Nsight Compute on one launch
# each of variant_kernel (DeltaX: dpxa mode=deltax, f32 softmax weights, FMA) and variant_mma_kernel
# (Delta-KV, mma.sync) in a 16K prefill step, 32q/8kv d128 bf16, page 16. Only the targets these need.
set -uo pipefail
R=$PWD; export LD_LIBRARY_PATH=$R/.devdeps/usr/lib/x86_64-linux-gnu
X=$OUT/e; mkdir -p $X; RP=/tmp/ncu-e; mkdir -p $RP
st() { echo "[$SECONDS s] $*" | tee -a $X/summary.txt; }
BD=build-e; B=$BD/bin
cmake -S . -B $BD -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_CUDA_HOPPER=ON -DSIEVE_BUILD_TESTS=OFF \
  -DCMAKE_PREFIX_PATH="$R/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$R/.devdeps/usr/include" > $X/build.log 2>&1
timeout 120 cmake --build $BD -j 16 --target sieve_bench sieve_plugin_dpxa sieve_plugin_deltakv sieve_plugin_dense >> $X/build.log 2>&1; st "build rc=$?"
POL=(--policy --phase prefill --layers 1 --hq 32 --hkv 8 --d 128 --page 16 --dtype bf16 --ctx 16384 --batch 1 --keys similar:0.88 --steps 1 --warmup 0 --samples 1)
SECT="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis"
for pair in "deltax|variant_kernel|prefill:*=dpxa(tau=0.9,mode=deltax)" "deltakv|variant_mma_kernel|prefill:*=deltakv(threshold=0.83)"; do
  IFS='|' read -r n k chain <<< "$pair"
  timeout 35 ncu --clock-control none $SECT -k "regex:^$k" --launch-count 1 -o $RP/$n -f $B/sieve_bench "${POL[@]}" --chain "$chain" > $X/ncu_$n.app.log 2>&1
  st "ncu $n rc=$?"
  [ -f $RP/$n.ncu-rep ] && ncu -i $RP/$n.ncu-rep --page raw --csv > $X/ncu_$n.raw.csv 2>&1 && python3 gpu/ncu_summary.py stalls $X/ncu_$n.raw.csv > $X/ncu_$n.stalls.txt 2>&1
  head -20 $X/ncu_$n.stalls.txt 2>/dev/null
  cd $X && tar czf $OUT/all.tgz . ; cd $R
done
