#!/bin/bash
# Issue 23, after the trained model is committed at hosts/sieve/models/longctx: its task accuracy
# on CUDA (dense, and two decode policies at 1/8 of the context), to set beside the CPU's. Builds
# Sieve (bench/device_all.sh, no tests), then `sieve eval --task ... --device cuda
# --no-attention-metrics --json` for each task at 4096 and 8192 tokens, 16 held-out instances.
# Comes back in $OUT: build.log (device_all's), eval.jsonl (one compact JSON object a run, with
# the command), eval.log.
set -uo pipefail
: "${OUT:?OUT must name the output folder}"
M=${MODEL:-hosts/sieve/models/longctx}
[ -f "$M/config.json" ] || { echo "no model at $M"; exit 1; }
bash bench/device_all.sh --fresh --no-build-tests || exit 1
export LD_LIBRARY_PATH="$PWD/.devdeps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
S=build-device-all/bin/sieve
: > "$OUT/eval.jsonl"
for len in 4096 8192; do
  for task in passkey mqar copy; do
    for chain in "" "decode:*=streaming(sink=16,window=$((len / 8 - 16)))" "quest(token_budget=$((len / 8)))"; do
      cmd=("$S" eval --model "$M" --task "$task" --length "$len" --instances 16 --device cuda --no-attention-metrics
           --json ${chain:+--chain "$chain"})
      echo "== ${cmd[*]}" >> "$OUT/eval.log"
      "${cmd[@]}" > "$OUT/run.json" 2>> "$OUT/eval.log" || { echo "failed: ${cmd[*]}"; continue; }
      python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); j["command"] = sys.argv[2]; print(json.dumps(j))' \
        "$OUT/run.json" "${cmd[*]}" >> "$OUT/eval.jsonl"
      python3 -c 'import json, sys; t = json.load(open(sys.argv[1]))["task"]; print(sys.argv[2], t["dense"]["exact"], t["chain"]["exact"])' \
        "$OUT/run.json" "$task@$len ${chain:-dense}"
    done
  done
done
rm -f "$OUT/run.json"
