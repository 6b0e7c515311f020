#!/usr/bin/env bash
# Regenerates docs/results/longctx_cpu.{json,md}: a first slice of issue 23's method table on the
# CPU — the long-context model (hosts/sieve/models/longctx) on the two tasks it learnt (passkey,
# copy) at 4096 tokens, 8 held-out instances (seed 1000), decode policies at token budgets of 1/8
# and 1/32 of the context: StreamingLLM (sink 16 + window), Quest (per query head, gqa_share),
# RaaS (default: the prompt pinned and attended whole; and prefill_policy=quest). `sieve eval --task ... --no-attention-metrics --json` each (task accuracy of dense and the
# chain, KL and top-1 against dense on the task's tokens, KV bytes). The full table (every
# policy, 4K-16K) belongs to the GPU machine.
#
#   bench/results/longctx_cpu.sh [BUILD_DIR]   (default: build; needs the sieve CLI + plugins)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build}"
SIEVE="$BUILD/bin/sieve"
M="$ROOT/hosts/sieve/models/longctx"
L=4096
OUTJ="$ROOT/docs/results/longctx_cpu.json"
[ -x "$SIEVE" ] || { echo "longctx_cpu.sh: $SIEVE not found (build the sieve target)" >&2; exit 1; }
: > "$OUTJ.tmp"
for task in passkey copy; do
  for K in $((L / 8)) $((L / 32)); do
    for entry in "streaming|decode:*=streaming(sink=16,window=$((K - 16)))" "quest|quest(token_budget=$K)" \
                 "quest gqa_share|quest(token_budget=$K,gqa_share=true)" "raas|raas(token_budget=$K)" \
                 "raas prefill_policy=quest|raas(token_budget=$K,prefill_policy=quest,prefill_budget=$K)"; do
      method="${entry%%|*}" chain="${entry#*|}"
      args=(eval --model hosts/sieve/models/longctx --task "$task" --length $L --instances 8 --seed 1000
            --chain "$chain" --no-attention-metrics --json)
      (cd "$ROOT" && "$SIEVE" "${args[@]}") > "$OUTJ.run" ||
        { echo "longctx_cpu.sh: sieve ${args[*]} failed" >&2; exit 1; }
      python3 -c 'import json, sys
j = json.load(open(sys.argv[1]))
print(json.dumps({"task": j["task"]["name"], "length": j["task"]["length"], "method": sys.argv[2],
                  "token_budget": int(sys.argv[3]), "chain": j["chain"], "dense": j["task"]["dense"],
                  "chain_score": j["task"]["chain"], "kl_mean": j["teacher_forced"]["kl_mean"],
                  "top1_agreement": j["teacher_forced"]["top1_agreement"], "kv_bytes": j["kv_bytes"],
                  "metrics": j["metrics"], "command": "sieve " + " ".join(sys.argv[4:])}))' \
        "$OUTJ.run" "$method" "$K" "${args[@]}" >> "$OUTJ.tmp"
      echo "$task $method K=$K done" >&2
    done
  done
done
rm -f "$OUTJ.run"
mv "$OUTJ.tmp" "$OUTJ"
python3 - "$OUTJ" "${ROOT}/docs/results/longctx_cpu.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = ["# Long-context tasks, decode policies (CPU slice)", "",
       "`bench/results/longctx_cpu.sh`: hosts/sieve/models/longctx, 4096 tokens, 8 held-out instances (seed 1000),",
       "CPU, f32 KV, page 16. accuracy = graded tokens right, exact = instances whose every graded token is right",
       "(teacher-forced: what greedy decoding gets right); KL and top-1 against dense on the task's tokens.",
       "RaaS pins the prompt's pages and, with its default prefill_policy=all, attends all of them: on a task",
       "whose evidence is in the prompt it is dense (KL 0) whatever its token_budget; prefill_policy=quest",
       "(prefill_budget = the budget) is the configuration that selects.", "",
       "| task | method | budget | dense acc / exact | chain acc / exact | KL mean | top-1 | KV bytes chain / dense |",
       "| --- | --- | --- | --- | --- | --- | --- | --- |"]
for r in rows:
    d, c = r["dense"], r["chain_score"]
    out.append(f"| {r['task']} | {r['method']} | {r['token_budget']} (1/{r['length'] // r['token_budget']}) | "
               f"{d['accuracy']:.3f} / {d['exact']:.3f} | {c['accuracy']:.3f} / {c['exact']:.3f} | "
               f"{r['kl_mean']:.3g} | {r['top1_agreement']:.3f} | {r['kv_bytes']['chain']} / {r['kv_bytes']['dense']} |")
open(sys.argv[2], "w").write("\n".join(out) + "\n")
PY
echo "wrote $OUTJ and docs/results/longctx_cpu.md"
