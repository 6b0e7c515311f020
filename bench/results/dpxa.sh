#!/usr/bin/env bash
# Regenerates docs/results/prefill_dpxa.json (+ the per-head thresholds files it used) and prints
# the tables of docs/results/prefill_dpxa.md: the dpxa plugin's tile estimators (dpxa = delta
# anchors, xattn = XAttention antidiagonal, stride = naive striding) compared at matched density,
#   model:     stories260K prompt prefill (CPU, f32 KV, page 16, block 32 = 2 pages), then dense
#              decode: true-mass recall and output error of the sparse prefill (per layer and all),
#              teacher-forced KL / top-1 and free-running greedy agreement of the decode (sieve eval);
#              global tau sweep + per-head tau calibrated for r (sieve calibrate dpxa) on 4 other
#              prompts;
#   synthetic: long contexts with realistic adjacent-key similarity (--keys similar:
#              core/reference/long_context.hpp), 2048-token prefill, 8 q / 2 KV heads, d 128, block
#              128 (sieve attn, f64 reference); tau sweep + per-head tau calibrated on other seeds;
#   deltax:    mode=deltax (DeltaXAttention, CPU) against mode=select at the same tau on the same
#              synthetic inputs (set synthetic_deltax).
#   bench/results/dpxa.sh [BUILD_DIR]      (default: build; needs the sieve CLI and the plugins)
#   ONLY_LONG=1 / ONLY_DELTAX=1: only the 8K set / only the deltax set (the other rows are kept).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
SIEVE="$BUILD/bin/sieve"
STEPS="${STEPS:-64}"          # the longest prompt is 438 tokens; the model has 512 positions
SYN_TOKENS="${SYN_TOKENS:-2048}"
OUT_JSON="$ROOT/docs/results/prefill_dpxa.json"
P_ALL="$ROOT/bench/results/dpxa_prompts.txt"
T="$(mktemp -d)"
trap 'rm -rf "$T"' EXIT
[ -x "$SIEVE" ] || { echo "dpxa.sh: $SIEVE not found (build the sieve target)" >&2; exit 1; }

# 12 stories written by the model itself (sampled, T = 0.9, seeds 1..12): 175-438 tokens each.
if [ ! -s "$P_ALL" ]; then
  for s in $(seq 1 12); do
    "$SIEVE" run --prompt "Once upon a time" --steps 440 --temperature 0.9 --seed "$s" 2>/dev/null |
      awk '/^model: /{exit} {t=t" "$0} END{gsub(/^ +| +$/,"",t); gsub(/  +/," ",t); print t}'
  done > "$P_ALL"
fi
sed -n 1,4p "$P_ALL" > "$T/calib.txt"   # calibration prompts
sed -n 5,12p "$P_ALL" > "$T/eval.txt"   # evaluation prompts

n=0
meta() {  # meta SET ESTIMATOR TAU TARGET CHAIN COMMAND
  printf '{"set":"%s","method":"dpxa","estimator":"%s","tau":%s,"target_r":%s,"chain":"%s","command":"%s"}\n' \
    "$1" "$2" "$3" "$4" "$5" "$(printf '%s' "$6" | sed 's/"/\\"/g')"
}
model_eval() {  # model_eval ESTIMATOR TAU TARGET CHAIN
  n=$((n + 1)); local f="$T/$(printf '%03d' $n)"
  local cmd="sieve eval --chain '$4' --prompts bench/results/dpxa_prompts.txt[5-12] --steps $STEPS --json"
  "$SIEVE" eval --chain "$4" --prompts "$T/eval.txt" --steps "$STEPS" --json > "$f.model" 2> "$T/err" ||
    { echo "dpxa.sh: $cmd failed:" >&2; cat "$T/err" >&2; exit 1; }
  meta model "$1" "$2" "$3" "$4" "$cmd" > "$f.meta"
}
syn_attn() {  # syn_attn ESTIMATOR TAU TARGET CHAIN [SET TOKENS HQ HKV]
  n=$((n + 1)); local f="$T/$(printf '%03d' $n)"
  local tokens="${6:-$SYN_TOKENS}"
  local args=(attn --phase prefill --keys similar --context "$tokens" --new-tokens "$tokens"
              --q-heads "${7:-8}" --kv-heads "${8:-2}" --head-dim 128 --seed 5 --reps 1 --chain "$4" --json)
  "$SIEVE" "${args[@]}" > "$f.syn" 2> "$T/err" ||
    { echo "dpxa.sh: sieve ${args[*]} failed:" >&2; cat "$T/err" >&2; exit 1; }
  meta "${5:-synthetic}" "$1" "$2" "$3" "$4" "sieve ${args[*]}" > "$f.meta"
}

ONLY_DELTAX="${ONLY_DELTAX:-0}"
[ "$ONLY_DELTAX" = 1 ] && ONLY_LONG=skip   # neither the main sets nor the 8K set
for est in dpxa xattn stride; do
  [ "${ONLY_LONG:-0}" != 0 ] && break
  for tau in 0.5 0.7 0.8 0.9 0.95; do
    model_eval "$est" "$tau" null "prefill:*=dpxa(estimator=$est,block=32,tau=$tau)"
  done
  for r in 0.8 0.9 0.95; do
    th="$ROOT/docs/results/prefill_dpxa_tau_${est}_r${r#0.}.txt"
    "$SIEVE" calibrate dpxa --estimator "$est" --block 32 --target "$r" --prompts "$T/calib.txt" --out "$th" \
      --json > /dev/null
    sed -i "s|$T/calib.txt|bench/results/dpxa_prompts.txt[1-4]|" "$th"
    model_eval "$est" null "$r" "prefill:*=dpxa(estimator=$est,block=32,thresholds=$th)"
  done
  for tau in 0.7 0.9 0.97; do
    syn_attn "$est" "$tau" null "prefill:*=dpxa(estimator=$est,tau=$tau)"
  done
  th="$ROOT/docs/results/prefill_dpxa_tau_${est}_synthetic_r9.txt"
  "$SIEVE" calibrate dpxa --synthetic --tokens "$SYN_TOKENS" --heads 8 --kv-heads 2 --head-dim 128 --samples 2 \
    --seed 100 --estimator "$est" --target 0.9 --out "$th" --json > /dev/null
  syn_attn "$est" null 0.9 "prefill:*=dpxa(estimator=$est,thresholds=$th)"
done

# A longer synthetic context (8192 tokens = 64 key blocks of 128; 4 q / 1 KV heads to keep the
# f64 reference affordable on a CPU).
for est in dpxa xattn stride; do
  [ "$ONLY_DELTAX" = 1 ] && break
  for tau in 0.8 0.9 0.95; do
    syn_attn "$est" "$tau" null "prefill:*=dpxa(estimator=$est,tau=$tau)" synthetic_8k 8192 4 1
  done
done

# DeltaXAttention (mode=deltax, CPU only): the kept tiles of mode=select at the same tau, with the
# off-diagonal ones outside the sink and the top exact_top share attended over their Delta-KV
# packed keys (pack_threshold, default 0.83); select rows of the same run for comparison, also at
# the taus between, to compare at matched KV loads (the paper's tile-skipping ablation, §4.2.2).
if [ "${ONLY_LONG:-0}" = 0 ] || [ "$ONLY_DELTAX" = 1 ]; then
  for tau in 0.75 0.8 0.85 0.93 0.95; do
    syn_attn dpxa "$tau" null "prefill:*=dpxa(tau=$tau)" synthetic_deltax
  done
  for tau in 0.7 0.9 0.97; do
    syn_attn dpxa "$tau" null "prefill:*=dpxa(tau=$tau)" synthetic_deltax
    for et in 0.1 0.3; do
      syn_attn dpxa "$tau" null "prefill:*=dpxa(tau=$tau,mode=deltax,exact_top=$et)" synthetic_deltax
    done
    syn_attn dpxa "$tau" null "prefill:*=dpxa(tau=$tau,mode=deltax,pack_threshold=0.9)" synthetic_deltax
  done
fi

# Per-head tau for the GPU speed runs (32 q / 8 KV heads, d 128, block 128, layer 0):
# docs/results/prefill_dpxa.md section 3 passes it to sieve_bench.
[ "${ONLY_LONG:-0}" != 0 ] ||
  "$SIEVE" calibrate dpxa --synthetic --tokens 4096 --heads 32 --kv-heads 8 --head-dim 128 --samples 1 \
    --seed 100 --target 0.9 --out "$ROOT/docs/results/prefill_dpxa_tau_dpxa_synthetic_32h_r9.txt" --json > /dev/null

# One flat row per run (metric names as sieve eval / sieve attn print them).
RUN_DATE="${RUN_DATE:-$(date -u +%F)}" python3 - "$T" "$OUT_JSON" "$ROOT" <<'PY'
import glob, json, os, re, sys
tmp, out, root = sys.argv[1], sys.argv[2], sys.argv[3]
rows = []
for m in sorted(glob.glob(os.path.join(tmp, "*.meta"))):
    base = m[:-5]
    row = json.load(open(m))
    row["chain"] = row["chain"].replace(root + "/", "")
    if os.path.exists(base + ".model"):
        j = json.load(open(base + ".model"))
        p = j["attention"]["prefill"]
        row.update({"device": j["device"], "model": j["model"], "prompts": j["prompts"], "steps": j["steps"],
                    "prefill_recall": p["recall"], "prefill_min_recall": p["min_recall"],
                    "prefill_output_rel_err": p["output_rel_err"], "prefill_attended_fraction": p["attended_fraction"],
                    "kl_mean": j["teacher_forced"]["kl_mean"], "kl_max": j["teacher_forced"]["kl_max"],
                    "top1_agreement": j["teacher_forced"]["top1_agreement"],
                    "greedy_token_agreement": j["free_running"]["token_agreement"],
                    "per_layer_prefill_recall": [l["prefill"]["recall"] for l in j["layers"]],
                    "per_layer_prefill_attended": [l["prefill"]["attended_fraction"] for l in j["layers"]]})
    else:
        j = json.load(open(base + ".syn"))
        mt = j.get("metrics", {})
        row.update({"device": j["device"], "model": "synthetic long context (--keys similar)",
                    "prefill_recall": j["recall"], "prefill_output_rel_err": j["output_rel_err"],
                    "prefill_attended_fraction": j["attended_fraction"],
                    "tile_density": mt.get("dpxa_density", {}).get("mean"),
                    "sampled_fraction": mt.get("dpxa_sampled", {}).get("mean")})
        if "deltax_kv_reduction" in mt:  # mean over the per-q-head and the layer reports
            row.update({"deltax_kv_reduction": mt["deltax_kv_reduction"]["mean"],
                        "deltax_packed_tiles": mt.get("deltax_packed", {}).get("mean")})
    m = re.search(r"mode=(\w+)", row["chain"])
    row["mode"] = m.group(1) if m else "select"
    row["date"] = os.environ["RUN_DATE"]
    rows.append(row)
only = {"1": "synthetic_8k"}.get(os.environ.get("ONLY_LONG", "0"))
if os.environ.get("ONLY_DELTAX") == "1":
    only = "synthetic_deltax"
if only and os.path.exists(out):  # keep the other sets
    rows = [r for r in json.load(open(out))["rows"] if r["set"] != only] + rows
json.dump({"topic": "prefill_dpxa", "rows": rows}, open(out, "w"), indent=1)
print(f"{'set':16} {'est':6} {'mode':6} {'tau':>5} {'r':>5} {'attended':>8} {'recall':>7} {'rel_err':>8} {'KL':>9} {'top1':>6} {'greedy':>6} {'kv_red':>6}  chain")
for r in rows:
    f = lambda k, fmt: (fmt % r[k]) if r.get(k) is not None else "-"
    print(f"{r['set']:16} {r['estimator']:6} {r.get('mode', 'select'):6} {f('tau','%.2f'):>5} {f('target_r','%.2f'):>5} "
          f"{f('prefill_attended_fraction','%.3f'):>8} {f('prefill_recall','%.4f'):>7} {f('prefill_output_rel_err','%.4f'):>8} "
          f"{f('kl_mean','%.2e'):>9} {f('top1_agreement','%.4f'):>6} {f('greedy_token_agreement','%.4f'):>6} "
          f"{f('deltax_kv_reduction','%.3f'):>6}  {r['chain']}")
PY
