#!/usr/bin/env bash
# Regenerates docs/results/delta_correction.json (and prints the tables of
# docs/results/delta_correction.md): the Δ-correction on the real model (stories260K, CPU) —
# sparse prefill then dense decode against all-dense (sieve eval), the paper's per-layer
# output-cosine / attention-row Spearman diagnostic (sieve delta-diag, model and synthetic long
# context). GPU timings come from bench/results/delta_correction_gpu.sh; its JSON (default: the stored
# H100 run, bench/results/delta_correction_h100_policy_prefill.json; or $GPU_JSON) is merged in.
#   bench/results/delta_correction.sh [BUILD_DIR]      (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-build}
SIEVE=$B/bin/sieve
P=bench/results/delta_correction_prompts.txt
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
STEPS=48  # the longest prompt is 461 tokens; the model has 512 positions

chains=(
  'prefill:*=streaming(sink=4,window=32)'
  'prefill:*=streaming(sink=4,window=32)>delta_correction(gamma=8,tail=16,mode=recompute)'
  'prefill:*=streaming(sink=4,window=32)>delta_correction(gamma=8,tail=16)'
  'prefill:*=streaming(sink=4,window=32)>delta_correction(gamma=8,tail=16,interpolate=true)'
  'prefill:*=streaming(sink=4,window=32)>delta_correction(gamma=4,tail=16)'
  'prefill:*=streaming(sink=4,window=32)>delta_correction(gamma=8,tail=128,mode=recompute)'
  'prefill:*=streaming(sink=4,window=32)>delta_correction(gamma=8,tail=128)'
  'prefill:*=streaming(sink=4,window=64)'
  'prefill:*=streaming(sink=4,window=64)>delta_correction(gamma=16,tail=32,mode=recompute)'
  'prefill:*=streaming(sink=4,window=64)>delta_correction(gamma=16,tail=32)'
  'prefill:*=streaming(sink=4,window=32)>delta_correction(gamma=1,tail=0)'
  'prefill:*=dense>delta_correction(gamma=8,tail=16)'
)
# Compositions with the other prefill methods, when their plugins are built.
for extra in 'prefill:*=dpxa' 'prefill:*=deltakv'; do
  name=${extra#prefill:\*=}
  if [ -e "$B/lib/sieve/plugins/libsieve_$name.so" ]; then
    chains+=("$extra" "$extra>delta_correction(gamma=8,tail=16)")
  fi
done

i=0
for c in "${chains[@]}"; do
  i=$((i + 1))
  echo "sieve eval --chain '$c' --prompts $P --steps $STEPS" >&2
  # (some plugins log to stdout: keep the JSON document only)
  "$SIEVE" eval --chain "$c" --prompts "$P" --steps $STEPS --json 2>/dev/null | sed -n '/^{/,$p' > "$T/eval_$i.json"
done
"$SIEVE" delta-diag --prompts "$P" --window 32 --gamma 8 --tail 16 --json "$T/diag_model_16.json"
"$SIEVE" delta-diag --prompts "$P" --window 32 --gamma 8 --tail 128 --json "$T/diag_model_128.json"
"$SIEVE" delta-diag --synthetic 4096 --window 256 --gamma 16 --tail 128 --json "$T/diag_syn.json"

python3 - "$T" "${GPU_JSON:-bench/results/delta_correction_h100_policy_prefill.json}" > docs/results/delta_correction.json <<'PY'
import glob, json, os, sys
t, gpu = sys.argv[1], sys.argv[2]
rows = []
def method(chain):
    if 'delta_correction' not in chain: return 'sparse'
    return 'recompute' if 'mode=recompute' in chain else 'delta_correction'
for f in sorted(glob.glob(os.path.join(t, 'eval_*.json')), key=lambda p: int(p.split('_')[-1][:-5])):
    j = json.load(open(f))
    rows.append({'source': 'sieve eval', 'method': method(j['chain']), 'chain': j['chain'], 'model': j['model'],
                 'device': j['device'], 'prompts': j['prompts'], 'steps': j['steps'],
                 'kl_mean': j['teacher_forced']['kl_mean'], 'kl_max': j['teacher_forced']['kl_max'],
                 'top1_agreement': j['teacher_forced']['top1_agreement'],
                 'token_agreement': j['free_running']['token_agreement'],
                 'prefill_output_rel_err': j['attention']['prefill']['output_rel_err'],
                 'prefill_recall': j['attention']['prefill']['recall']})
for name in ('diag_model_16', 'diag_model_128', 'diag_syn'):
    j = json.load(open(os.path.join(t, name + '.json')))
    for c in j['chains']:
        for l in c['layers']:
            r = {'source': 'sieve delta-diag', 'mode': j['mode'], 'method': method(c['chain']), 'chain': c['chain'],
                 'layer': l['layer'], 'rows': j['last'], 'cos_mean': l['cos']['mean'], 'cos_p10': l['cos']['p10']}
            if 'spearman' in l: r.update(spearman_mean=l['spearman']['mean'], spearman_p10=l['spearman']['p10'])
            if 'cos_last' in l: r['cos_last_mean'] = l['cos_last']['mean']
            if j['mode'] == 'synthetic': r['synthetic'] = j['synthetic']
            rows.append(r)
if gpu and os.path.exists(gpu):  # the GPU timings (bench/results/delta_correction_gpu.sh), rows as they are
    g = json.load(open(gpu))
    for r in g['results']:
        r = dict(r)
        r.update(source='sieve_bench --policy', method=method(r['chain']) if r['chain'] != 'dense' else 'dense',
                 command=g['meta'].get('command', ''))
        rows.append(r)
json.dump({'topic': 'delta_correction', 'date': '2026-11-22', 'results': rows}, sys.stdout, indent=1)
PY
echo "wrote docs/results/delta_correction.json" >&2
