#!/usr/bin/env bash
# GPU machine: the seer decode step (gate + block-sparse attention) against dense, the issue-7
# geometry: one layer, 64 q / 8 KV heads, head dim 128, page 64, bf16, block 64, an untrained gate
# of d_gate 128 (seer_random_gate: speed does not depend on the weights), contexts 32K and 128K,
# batch 1 and 16, 90% sparsity (token_budget = context / 10). Each size runs fused=true (the
# default: the decode step's cache update and block offsets folded into the gate query kernel)
# and fused=false (the first implementation) side by side with dense, REPS times (dense's own
# step moves by up to 10% between repetitions).
# Writes docs/results/seer_speed.{json,md} (medians over the repetitions) and the raw sieve_bench
# JSON under RAW (default: a temporary folder).
#
#   bench/results/seer_speed.sh [BUILD_DIR]   (default: build; needs sieve_bench, seer_random_gate
#                                              and the seer plugin)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
REPS="${REPS:-3}"
RAW="${RAW:-$(mktemp -d)}"
DOCS="${DOCS:-$ROOT/docs/results}"
mkdir -p "$RAW" "$DOCS"
GATE="$RAW/g64.st"
"$BUILD/bin/seer_random_gate" --out "$GATE" --layers 1 --hq 64 --hkv 8 --d 128 --block 64
for rep in $(seq 1 "$REPS"); do
  for ctx in 32768 131072; do
    k=$((ctx / 10))
    "$BUILD/bin/sieve_bench" --policy --phase decode --device cuda \
      --chain "decode:*=seer(fused=true,weights=$GATE,block=64,token_budget=$k)" \
      --chain "decode:*=seer(fused=false,weights=$GATE,block=64,token_budget=$k)" \
      --layers 1 --hq 64 --hkv 8 --d 128 --page 64 --dtype bf16 --ctx "$ctx" --batch 1,16 \
      --plugin-dir "$BUILD/lib/sieve/plugins" --json "$RAW/seer_speed_ctx${ctx}_rep$rep.json" |
      sed -n '/== Sieve policy step/,/^step ms/p'
  done
done
python3 - "$RAW" "$DOCS" <<'PY'
import glob, json, statistics, sys
raw, docs = sys.argv[1], sys.argv[2]
runs, commands, device, date = {}, [], "", ""
for f in sorted(glob.glob(raw + "/seer_speed_ctx*_rep*.json")):
    d = json.load(open(f))
    commands.append(d["meta"]["command"])
    device = d["meta"]["device"]
    date = str(d["meta"].get("date", ""))[:10]
    for r in d["results"]:
        chain = r["chain"]
        variant = "dense" if chain == "dense" else ("fused=true" if "fused=true" in chain else "fused=false")
        runs.setdefault((r["context"], r["batch"], variant), []).append(r)
keys = ("step_ms", "dense_step_ms", "core_ms", "selection_overhead_ms", "attended_fraction")
rows = []
for (ctx, batch, variant), rs in sorted(runs.items()):
    row = {"method": "seer" if variant != "dense" else "dense", "variant": variant, "context": ctx,
           "batch": batch, "repetitions": len(rs), "chain": rs[0]["chain"], "device": device,
           "date": date}
    for k in keys:
        row[k] = statistics.median(x[k] for x in rs if x.get(k) is not None)
    row["speedup_vs_dense"] = row["dense_step_ms"] / row["step_ms"]
    rows.append(row)
json.dump({"results": rows, "commands": commands}, open(docs + "/seer_speed.json", "w"), indent=1)
with open(docs + "/seer_speed.md", "w") as md:
    md.write("# seer decode speed (gate included)\n\n")
    md.write(f"{device}, {date}, one layer 64q/8kv d128 bf16, page 64, block 64, d_gate 128 (random gate), "
             "90% sparsity (token_budget = context / 10); medians over the repetitions of "
             "`bench/results/seer_speed.sh` (each a median over 20 decode steps).\n\n")
    md.write("| ctx | batch | variant | step ms | dense ms | x dense | core ms | gate + append ms | attended |\n")
    md.write("|---|---|---|---|---|---|---|---|---|\n")
    for r in rows:
        md.write(f"| {r['context']} | {r['batch']} | {r['variant']} | {r['step_ms']:.4f} | {r['dense_step_ms']:.4f} | "
                 f"{r['speedup_vs_dense']:.2f}x | {r['core_ms']:.4f} | {r['selection_overhead_ms']:.4f} | "
                 f"{100 * r['attended_fraction']:.2f}% |\n")
    md.write("\nCommands:\n\n```\n" + "\n".join(sorted(set(commands))) + "\n```\n")
print(open(docs + "/seer_speed.md").read())
PY
