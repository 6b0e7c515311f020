#!/usr/bin/env bash
# Issue 24's CPU measurement, for a quiet 2-core machine like CI's (nothing else running: with a
# load above ~2 every OpenMP region waits for its second thread to be scheduled and the numbers
# are not the kernels'). Writes, with today's UTC date:
#   docs/bench/cpu-2core-DATE.json / .txt   sieve_bench's CPU suite: dense, 90% sparse and portable
#                                           decode (32q/8kv d128, bs 1/4, 8K/32K, f32/bf16), each
#                                           sample against a memcpy and a read-only stream run right
#                                           before it, and prefill (one causal 4K prompt) against
#                                           OpenBLAS sgemm, all in the same process
#   docs/results/policy-step-cpu.{json,md}  the policy step and the selection micro-benchmarks
#                                           (bench/results/policy_cpu.sh)
#   docs/bench/README.md                    the measured part of its CPU section (between the
#                                           cpu_speed.sh markers; bench/results/cpu_section.py)
#   docs/report/README.md, speed_cpu.png    the report's CPU speed section (sieve_report.py
#                                           --update-cpu; needs python3 with matplotlib, Debian's
#                                           /usr/bin/python3 with python3-matplotlib)
# 2 threads unless OMP_NUM_THREADS says otherwise (OpenBLAS gets the same count).
#
#   bench/results/cpu_speed.sh [BUILD_DIR]   (default build; needs sieve_bench, seer_random_gate,
#                                            sieve_selection_bench and the plugins: cmake --build BUILD_DIR)
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

START="$(date -u '+%Y-%m-%d %H:%M')"
T0=$SECONDS
LOAD_BEFORE="$(load)"
{
  echo "# $(date -u +%FT%TZ) UTC; $(machine); OMP_NUM_THREADS=$OMP_NUM_THREADS; load before: $LOAD_BEFORE"
  # Decode against memcpy and the read-only ceilings, prefill against sgemm; the portable path
  # beside each as the in-run baseline of the SIMD kernels.
  "$BENCH" --cpu-only --filter='cpu/(decode|prefill)/.*(f32|bf16)/(dense|sparse0.90)' \
    --json="$OUT.json"
  echo "# load after: $(load)"
} 2>&1 | tee "$OUT.txt"
T_SUITE=$((SECONDS - T0))

OMP_NUM_THREADS="$OMP_NUM_THREADS" "$ROOT/bench/results/policy_cpu.sh" "$BUILD"
LOAD_AFTER="$(load)"

INFO="Run **$START UTC** by \`bench/results/cpu_speed.sh\` at $(git -C "$ROOT" rev-parse --short HEAD) on $(machine), $OMP_NUM_THREADS threads; load average (1 / 5 / 15 min) before: $LOAD_BEFORE, after: $LOAD_AFTER; suite $T_SUITE s, whole run $((SECONDS - T0)) s"
python3 "$ROOT/bench/results/cpu_section.py" "$OUT.json" "$ROOT/docs/results/policy-step-cpu.json" \
  "$ROOT/docs/bench/README.md" "$INFO"
REPORT_PY=/usr/bin/python3
[ -x "$REPORT_PY" ] && "$REPORT_PY" -c 'import matplotlib' 2>/dev/null || REPORT_PY=python3
if "$REPORT_PY" -c 'import matplotlib' 2>/dev/null; then
  "$REPORT_PY" "$ROOT/bench/report/sieve_report.py" --update-cpu --cpu-suite-json "$OUT.json" \
    --cpu-policy-json "$ROOT/docs/results/policy-step-cpu.json" --out "$ROOT/docs/report"
  REPORT="and docs/report's CPU speed section"
else
  REPORT="(not docs/report: no python3 with matplotlib; run sieve_report.py --update-cpu later)"
fi
echo "wrote $OUT.json, $OUT.txt, docs/results/policy-step-cpu.{json,md}, docs/bench/README.md's CPU tables $REPORT"
