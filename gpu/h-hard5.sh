#!/usr/bin/env bash
# h-hard5 on the GPU machine, from the repository root: the discovery probe now dlcloses each
# plugin it loaded (running its finalisers in the child). A CUDA plugin's finalisers unregister
# its fatbinary from the CUDA runtime; this checks that doing so in the probe child is harmless,
# both from a process that has not touched the GPU (`sieve plugins`) and from test processes
# that initialise CUDA before later registries probe (the CUDA plugin tests).
#   bash gpu/h-hard5.sh   ($OUT receives every log)
# With $SIEVE_BUILD set its build is used as is (steps whose test binary it lacks are skipped: a
# --no-tests build runs 1 and 2); otherwise this tree is built into build-hard5.
# Stops itself within 120 s after the build.
set -uo pipefail
OUT=${OUT:?}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=${SIEVE_BUILD:-}
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git log --oneline -1; date -u; } > "$OUT/env.log" 2>&1
if [ -z "$B" ]; then
  B=build-hard5
  { cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_WITH_CUDA=ON -DSIEVE_BUILD_TESTS=ON \
      -DCMAKE_PREFIX_PATH="$PWD/.devdeps/usr" -DDLPACK_INCLUDE_DIR="$PWD/.devdeps/usr/include" &&
    cmake --build $B -j 16 --target sieve sieve_plugin_dense sieve_plugin_streaming sieve_plugin_quest \
      sieve_plugin_raas sieve_plugin_delta sieve_plugin_seer sieve_plugin_deltakv sieve_plugin_dpxa \
      sieve_plugin_delta_correction test_discovery_hostile test_plugin_seer_cuda \
      test_plugin_quest_cuda sieve_fixtures; } > "$OUT/build.log" 2>&1 ||
    { grep -E "error|FAILED" "$OUT/build.log" | head -30; exit 1; }
fi
status=0
run() {  # name seconds command...
  local name=$1 secs=$2
  shift 2
  if [ ! -x "$1" ]; then echo "$name: $1 not built (a --no-tests build?): skipped" | tee -a "$OUT/summary.log"; return; fi
  timeout "$secs" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc" | tee -a "$OUT/summary.log"
  [ $rc -eq 0 ] || status=1
}
# 1. No GPU touched before the probe: every bundled plugin probed (loaded, unloaded) and listed.
run plugins 20 "$B/bin/sieve" plugins
# 2. A CUDA run after discovery, then the host's own exit (its finalisers, the plugins pinned).
run attn_cuda 30 "$B/bin/sieve" attn --chain 'streaming(sink=4,window=256)' --context 4096 --q-heads 32 \
  --kv-heads 8 --head-dim 128 --device cuda --dtype bf16
# 3. Test processes that initialise CUDA and build registries (probing) afterwards.
run seer_cuda 30 "$B/bin/test_plugin_seer_cuda"
run quest_cuda 30 "$B/bin/test_plugin_quest_cuda"
# 4. The hostile fixtures (CPU), on this machine too.
run hostile 30 "$B/bin/test_discovery_hostile" --gtest_filter='HostileDiscovery.*:HostileCli.*'
grep -hE "probe process|not loaded|^\[  (PASSED|FAILED) |Failure" "$OUT"/*.log | head -40
exit $status
