#!/usr/bin/env bash
# Issue 24's CPU measurement, for a quiet 2-core machine like CI's (nothing else running: with a
# load above ~2 every OpenMP region waits for its second thread to be scheduled and the numbers
# are not the kernels'). Writes, with today's UTC date:
#   docs/bench/cpu-2core-DATE.json / .txt   sieve_bench's CPU suite: dense, 90% sparse and portable
#                                           decode (32q/8kv d128, bs 1/4, 8K/32K, f32/bf16) against
#                                           memcpy, and prefill (one causal 4K prompt) against
#                                           OpenBLAS sgemm, both measured in the same process
#   docs/results/policy-step-cpu.{json,md}  the policy step (bench/results/policy_cpu.sh)
# then prints the lines to paste into docs/bench/README.md's CPU section. 2 threads unless
# OMP_NUM_THREADS says otherwise (OpenBLAS gets the same count).
#
#   bench/results/cpu_speed.sh [BUILD_DIR]   (default build; needs sieve_bench, seer_random_gate
#                                            and the plugins: cmake --build BUILD_DIR)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
BENCH="$BUILD/bin/sieve_bench"
[ -x "$BENCH" ] || { echo "cpu_speed.sh: $BENCH not found (build the sieve_bench target)" >&2; exit 1; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-2}"
export OPENBLAS_NUM_THREADS="$OMP_NUM_THREADS"
DATE="$(date -u +%Y-%m-%d)"
OUT="$ROOT/docs/bench/cpu-2core-$DATE"

machine() {
  echo "$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc --all) cores," \
       "$(grep -o -w -E 'avx2|avx512f|avx512bw|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')" \
       "L3 $(lscpu | sed -n 's/^L3 cache: *//p')"
}
load() { cut -d' ' -f1-3 /proc/loadavg; }

{
  echo "# $(date -u +%FT%TZ) UTC; $(machine); OMP_NUM_THREADS=$OMP_NUM_THREADS; load before: $(load)"
  # Decode against memcpy, prefill against sgemm; the portable path beside each as the in-run
  # baseline of the SIMD kernels.
  "$BENCH" --cpu-only --filter='cpu/(decode|prefill)/.*(f32|bf16)/(dense|sparse0.90)' \
    --json="$OUT.json"
  echo "# load after: $(load)"
} 2>&1 | tee "$OUT.txt"

OMP_NUM_THREADS="$OMP_NUM_THREADS" "$ROOT/bench/results/policy_cpu.sh" "$BUILD"

python3 - "$OUT.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["ceilings"]
print(f"\nFor docs/bench/README.md (CPU section), {r['date']}: memcpy {c['host_copy_gbs']:.1f} GB/s, "
      f"sgemm {c.get('host_sgemm_gflops', 0):.1f} GFLOP/s, {c['host_threads']} threads")
for t in r["targets"]:
    if "CPU" in t["target"]:
        state = "info" if t["criterion"] == "report" else ("MET" if t["met"] else "NOT MET")
        print(f"  [{state}] {t['target']}: {t['measured']} ({t['case']})")
PY
echo "wrote $OUT.json, $OUT.txt, docs/results/policy-step-cpu.{json,md}"
