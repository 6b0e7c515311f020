#!/usr/bin/env bash
# Regenerates docs/results/quest_raas.{json,md} and docs/results/memory.{json,md} on stories260K
# (CPU, f32 KV, page 16):
#  - fidelity: `sieve eval` (4 built-in prompts, STEPS positions each) for Quest (layers 0-1 dense,
#    and all layers sparse; per query head and gqa_share), RaaS (all layers, and layers 0-1 dense)
#    and StreamingLLM (sink 4 + window K-4) at equal token budgets K = 64, 128, 256;
#  - memory: `sieve run --ignore-eos --steps 511 --kv-trace` (resident KV bytes after every step)
#    for dense, Quest and RaaS at K = 64.
#
#   bench/results/quest_raas.sh [BUILD_DIR]   (default: build; needs the sieve CLI + plugins)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
SIEVE="$BUILD/bin/sieve"
STEPS="${STEPS:-384}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
[ -x "$SIEVE" ] || { echo "quest_raas.sh: $SIEVE not found (build the sieve target)" >&2; exit 1; }

n=0
evaluate() {  # evaluate METHOD VARIANT K CHAIN [PROMPTS_FILE STEPS]
  n=$((n + 1))
  local f="$TMP/eval_$(printf '%03d' $n)" steps="${6:-$STEPS}" extra="" set="built-in"
  local args=(eval --chain "$4" --steps "$steps" --json)
  if [ -n "${5:-}" ]; then
    args+=(--prompts "$ROOT/$5"); extra=" --prompts $5"; set="long"
  fi
  "$SIEVE" "${args[@]}" > "$f.json" 2> "$TMP/err" ||
    { echo "quest_raas.sh: sieve ${args[*]} failed:" >&2; cat "$TMP/err" >&2; exit 1; }
  printf '{"method":"%s","variant":"%s","token_budget":%s,"prompt_set":"%s","chain":"%s","command":"sieve eval --chain '"'"'%s'"'"'%s --steps %s --json"}\n' \
    "$1" "$2" "$3" "$set" "$4" "$4" "$extra" "$steps" > "$f.meta"
}
for K in 64 128 256; do
  evaluate quest "layers 0-1 dense" "$K" "0-1=dense; 2-=quest(token_budget=$K)"
  evaluate quest "all layers" "$K" "*=quest(token_budget=$K)"
  evaluate quest "layers 0-1 dense, gqa_share" "$K" "0-1=dense; 2-=quest(token_budget=$K,gqa_share=true)"
  evaluate raas "all layers" "$K" "*=raas(token_budget=$K)"
  evaluate raas "layers 0-1 dense" "$K" "0-1=dense; 2-=raas(token_budget=$K)"
  evaluate raas "all layers, top_ratio 0.1" "$K" "*=raas(token_budget=$K,top_ratio=0.1)"
  evaluate streaming "layers 0-1 dense" "$K" "decode:0-1=dense; decode:2-=streaming(sink=4,window=$((K - 4)))"
  evaluate streaming "all layers" "$K" "decode:*=streaming(sink=4,window=$((K - 4)))"
done
# Long prompts (220-276 tokens, longer than the budget): the paper's case for Quest on the prompt
# pages and RaaS on the decode pages. Equal attended budget: 256 tokens per row.
LONG=bench/results/quest_raas_long_prompts.txt
evaluate raas "long prompts" 256 "*=raas(token_budget=256)" "$LONG" 192
evaluate raas "long prompts, prefill_policy=quest (128 prompt + 128 decode)" 256 \
  "*=raas(token_budget=128,prefill_policy=quest,prefill_budget=128)" "$LONG" 192
evaluate quest "long prompts" 256 "*=quest(token_budget=256)" "$LONG" 192
evaluate streaming "long prompts" 256 "decode:*=streaming(sink=4,window=252)" "$LONG" 192

m=0
trace() {  # trace METHOD K CHAIN
  m=$((m + 1))
  local f="$TMP/trace_$(printf '%03d' $m)"
  local args=(run --steps 511 --ignore-eos --kv-trace "$f.csv")
  [ -n "$3" ] && args+=(--chain "$3")
  "$SIEVE" "${args[@]}" > /dev/null 2> "$TMP/err" ||
    { echo "quest_raas.sh: sieve ${args[*]} failed:" >&2; cat "$TMP/err" >&2; exit 1; }
  local cmd="sieve run --steps 511 --ignore-eos --kv-trace FILE"
  [ -n "$3" ] && cmd="$cmd --chain '$3'"
  printf '{"method":"%s","token_budget":%s,"chain":"%s","command":"%s"}\n' "$1" "$2" "${3:-dense}" "$cmd" > "$f.meta"
}
trace dense 0 ""
trace quest 64 "0-1=dense; 2-=quest(token_budget=64)"
trace raas 64 "*=raas(token_budget=64)"
trace raas 64 "0-1=dense; 2-=raas(token_budget=64)"
trace streaming 64 "decode:*=streaming(sink=4,window=60)"

python3 - "$TMP" "$ROOT/docs/results" "$STEPS" <<'PY'
import csv, glob, json, sys
tmp, out, steps = sys.argv[1:4]
DATE = "2026-11-22"

# ---- fidelity ----------------------------------------------------------------------------------
rows = []
for meta in sorted(glob.glob(tmp + "/eval_*.meta")):
    m = json.load(open(meta))
    e = json.load(open(meta[:-5] + ".json"))
    r = dict(m)
    r.update({
        "model": "stories260K", "device": e["device"], "prompts": e["prompts"], "steps": e["steps"],
        "page_size": 16, "kv_dtype": "f32", "date": DATE,
        "kl_mean": e["teacher_forced"]["kl_mean"], "kl_max": e["teacher_forced"]["kl_max"],
        "top1_agreement": e["teacher_forced"]["top1_agreement"],
        "token_agreement": e["free_running"]["token_agreement"],
        "decode_recall": e["attention"]["decode"]["recall"],
        "decode_min_recall": e["attention"]["decode"]["min_recall"],
        "decode_output_rel_err": e["attention"]["decode"]["output_rel_err"],
        "decode_attended_fraction": e["attention"]["decode"]["attended_fraction"],
        "kv_bytes_chain": e["kv_bytes"]["chain"], "kv_bytes_dense": e["kv_bytes"]["dense"],
        "resident_fraction": sum(l["resident_fraction"] for l in e["layers"]) / len(e["layers"]),
    })
    rows.append(r)
json.dump({"topic": "quest_raas", "model": "stories260K", "device": "cpu", "date": DATE,
           "script": "bench/results/quest_raas.sh", "results": rows},
          open(out + "/quest_raas.json", "w"), indent=1)

md = ["# Quest, RaaS and StreamingLLM on stories260K at equal token budgets\n",
      "Generated by `bench/results/quest_raas.sh` (device: cpu, date %s, %s decode positions per "
      "prompt, the 4 built-in prompts, page size 16, f32 KV). Every number comes from `sieve eval` "
      "(docs/model.md) against dense attention; each row's exact command is in "
      "`docs/results/quest_raas.json` (`command`).\n" % (DATE, steps),
      "K is the token budget: Quest attends the last page + the best K/16 - 1 pages per query head "
      "(or per KV head with gqa_share); RaaS keeps at most K resident tokens per layer and sequence "
      "(prompt pages pinned; evicted pages are freed) and attends them all; StreamingLLM attends "
      "4 sink tokens + a K - 4 window. The contexts grow to ~%d tokens.\n" % (int(steps) + 10),
      "| method | variant | K | token agreement | top-1 (teacher-forced) | KL mean | KL max | "
      "decode recall | min recall | attended | resident | KV bytes vs dense |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"]
def line(r):
    return "| %s | %s | %d | %.3f | %.4f | %.2e | %.2e | %.4f | %.3f | %.3f | %.3f | %.3f |" % (
        r["method"], r["variant"], r["token_budget"], r["token_agreement"], r["top1_agreement"],
        r["kl_mean"], r["kl_max"], r["decode_recall"], r["decode_min_recall"],
        r["decode_attended_fraction"], r["resident_fraction"], r["kv_bytes_chain"] / r["kv_bytes_dense"])
for r in sorted((r for r in rows if r["prompt_set"] == "built-in"),
                key=lambda r: (r["token_budget"], r["method"], r["variant"])):
    md.append(line(r))
md.append("\n## Long prompts: Quest on the prompt, RaaS on the decode pages\n")
md.append("The 4 prompts of `bench/results/quest_raas_long_prompts.txt` (220-276 tokens each, longer than "
          "the budget), 192 decode positions each; every method attends at most 256 tokens per row. "
          "RaaS alone pins the whole prompt, which fills its budget, so its decode pages are evicted "
          "as they age out of the last page; `prefill_policy=quest` attends 128 prompt tokens chosen "
          "by the Quest bound + up to 128 resident decode tokens (docs/methods/raas.md).\n")
md.append(md[3])
md.append(md[4])
for r in (r for r in rows if r["prompt_set"] == "long"):
    md.append(line(r))
md.append("\nColumns: free-running greedy token agreement and teacher-forced top-1 agreement / "
          "KL(dense || chain) over all positions; decode recall = attention mass (of the dense "
          "softmax) the chain attended, mean and worst row, all layers; attended = keys attended / "
          "causal keys; resident = tokens resident / tokens fed, mean over layers (below 1 only for "
          "RaaS, which evicts: its recall and output error are relative to what is resident, so "
          "eviction's cost shows in KL / agreement); KV bytes = the store's bytes_in_use at the end "
          "(sidecars included).\n")
open(out + "/quest_raas.md", "w").write("\n".join(md) + "\n")

# ---- memory --------------------------------------------------------------------------------------
mem = []
series = []
for meta in sorted(glob.glob(tmp + "/trace_*.meta")):
    m = json.load(open(meta))
    pts = [(int(r["step"]), int(r["tokens"]), int(r["kv_bytes"])) for r in csv.DictReader(open(meta[:-5] + ".csv"))]
    series.append((m, pts))
    for step, tokens, b in pts:
        if tokens % 16 == 0 or step == pts[-1][0]:
            mem.append({"method": m["method"], "chain": m["chain"], "token_budget": m["token_budget"],
                        "tokens": tokens, "kv_bytes": b, "command": m["command"]})
json.dump({"topic": "memory", "model": "stories260K", "device": "cpu", "date": DATE, "page_size": 16,
           "kv_dtype": "f32", "metric": "kv_bytes (store bytes_in_use, all 5 layers, sidecars included)",
           "x": "tokens", "y": "kv_bytes", "series_key": "chain",
           "script": "bench/results/quest_raas.sh", "results": mem},
          open(out + "/memory.json", "w"), indent=1)
marks = [16, 64, 128, 192, 256, 320, 384, 448, 511]
md = ["# Resident KV bytes per decode step: dense, Quest, RaaS, StreamingLLM (stories260K)\n",
      "Generated by `bench/results/quest_raas.sh` (device: cpu, date %s, page size 16, f32 KV, "
      "prompt = BOS, greedy, `--ignore-eos` so every run reaches 511 tokens). Each series is one "
      "`sieve run --steps 511 --ignore-eos --kv-trace FILE --chain ...`: the store's "
      "bytes_in_use (all 5 layers, sidecars included) after every step. The full series (every 16 "
      "tokens) are in `docs/results/memory.json`.\n" % DATE,
      "| chain | " + " | ".join("%d tok" % t for t in marks) + " |",
      "|---|" + "---|" * len(marks)]
for m, pts in series:
    by_tokens = {t: b for _, t, b in pts}
    md.append("| `%s` | " % m["chain"] + " | ".join("%d" % by_tokens[t] if t in by_tokens else "-" for t in marks) + " |")
md.append("\nDense and Quest grow linearly with the length (Quest keeps every page and adds its min/max "
          "sidecar, 2 x head_dim values per page and KV head: +6% here); StreamingLLM only selects, so "
          "it keeps every page too. RaaS evicts the oldest-stamped pages beyond its budget at the end "
          "of every step and the store frees them: its bytes stop growing once the budget (64 tokens = "
          "4 pages per layer) is reached.\n")
open(out + "/memory.md", "w").write("\n".join(md) + "\n")
PY
echo "wrote docs/results/quest_raas.{json,md} and docs/results/memory.{json,md}"
