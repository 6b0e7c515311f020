#!/usr/bin/env python3
"""Writes issue 24's measured CPU section of docs/bench/README.md from one cpu_speed.sh run.

    cpu_section.py SUITE_JSON POLICY_JSON README RUN_INFO

SUITE_JSON is sieve_bench's CPU suite (each decode sample against the memcpy and read-only stream
measured right before it, prefill against OpenBLAS sgemm), POLICY_JSON docs/results/policy-step-cpu.json, RUN_INFO one line of the
run's facts (date and time, machine, threads, load before and after, seconds). The tables replace
what lies between README's two cpu_speed.sh markers; the prose around them is written by hand.
"""
import json
import os
import re
import sys

BEGIN = "<!-- cpu_speed.sh:begin -->"
END = "<!-- cpu_speed.sh:end -->"


def fraction(x, c, ceiling="copy"):
    """(median, min, max) of a decode case's fraction of memcpy ("copy") or of the read-only stream
    ("read"): per sample against the ceiling measured right before it; a JSON from before those
    existed, against the process-start ceiling (min = max = median)."""
    adj = x.get("adjacent", {}).get(f"fraction_of_{ceiling}")
    if adj:
        return adj["median"], adj["min"], adj["max"]
    whole = c.get("host_copy_gbs" if ceiling == "copy" else "host_read_gbs")
    f = x["gbs"] / whole if whole else 0
    return f, f, f


def pct(x, c, ceiling="copy", bold=False):
    """'58.2% (51.0–60.3)': the median and the spread over the samples."""
    m, lo, hi = (100 * v for v in fraction(x, c, ceiling))
    med = f"**{m:.1f}%**" if bold else f"{m:.1f}%"
    return med if lo == hi else f"{med} ({lo:.1f}–{hi:.1f})"


def decode_rows(cases, c):
    """One row per (dtype, batch, context): dense, its portable baseline, 90% sparse."""
    by = {x["name"]: x for x in cases if x.get("ok") and x["phase"] == "decode"}
    out = ["| dtype | batch | context | dense µs | GB/s | % memcpy (spread) | % read-only (spread) "
           "| % paged read-only | portable µs (% memcpy) | × portable | 90% sparse µs (% memcpy) | × dense |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, x in sorted(by.items(), key=lambda kv: (kv[1]["dtype"], kv[1]["batch"], kv[1]["context"])):
        if not name.endswith("/dense"):
            continue
        port, sparse = by.get(name + "/portable"), by.get(name[: -len("dense")] + "sparse0.90")
        row = [x["dtype"], str(x["batch"]), f"{x['context'] // 1024}K", f"{1e3 * x['median_ms']:.0f}",
               f"{x['gbs']:.1f}", pct(x, c, bold=True),
               pct(x, c, "read") if x.get("adjacent") or c.get("host_read_gbs") else "-",
               f"{100 * x['gbs'] / c['host_paged_read_gbs']:.0f}%" if c.get("host_paged_read_gbs") else "-",
               f"{1e3 * port['median_ms']:.0f} ({100 * fraction(port, c)[0]:.1f}%)" if port else "-",
               f"{port['median_ms'] / x['median_ms']:.2f}×" if port else "-",
               f"{1e3 * sparse['median_ms']:.0f} ({100 * fraction(sparse, c)[0]:.1f}%)" if sparse else "-",
               f"{x['median_ms'] / sparse['median_ms']:.2f}×" if sparse else "-"]
        out.append("| " + " | ".join(row) + " |")
    return out


def prefill_rows(cases, c):
    out = ["| case | ms | GFLOP/s | % of sgemm |", "|---|---|---|---|"]
    for x in cases:
        if x.get("ok") and x["phase"] == "prefill":
            g = 1e3 * x["tflops"]
            share = f"{100 * g / c['host_sgemm_gflops']:.1f}%" if c.get("host_sgemm_gflops") else "-"
            out.append(f"| `{x['name']}` | {x['median_ms']:.1f} | {g:.1f} | {share} |")
    return out


def target_rows(targets):
    out = ["| target (issue 24, same process) | case | measured | |", "|---|---|---|---|"]
    for t in targets:
        if "CPU" not in t["target"] or t["criterion"] == "report":
            continue
        state = "met" if t["met"] else "**not met**"
        out.append(f"| {t['target']} ({t['criterion']}) | `{t['case'].split('/', 1)[1]}` | {t['measured']} | {state} |")
    return out


def policy_rows(policy):
    """The selecting policies' rows: their own CPU work (step - core) against the attention."""
    out = ["| policy (8q/2kv d64 bf16) | select ms | core ms | × dense |", "|---|---|---|---|"]
    for r in policy["results"]:
        decode = r["phase"] == "decode" and r["method"] in ("quest", "seer", "delta") \
            and r["context"] == 16384 and r["batch"] == 4
        prefill = r["phase"] == "prefill" and r["method"] == "dpxa" and r["context"] == 4096
        if not (decode or prefill):
            continue
        label = re.sub(r"weights=[^,]*,", "", r["chain"].split("=", 1)[-1])  # Seer's temporary gate
        where = f"bs {r['batch']}, {r['context'] // 1024}K" + (" (3 layers)" if decode else " prefill")
        out.append(f"| `{label}`, {where} | {r['step_ms'] - r['core_ms']:.3f} | {r['core_ms']:.3f} "
                   f"| {r['speedup_vs_dense']:.2f}× |")
    return out


SUMMARY = "| CPU decode, 2 cores (issue 24) |"


def summary_row(cases, c, when):
    """README's row in the targets table at the top: the ranges of this run."""
    dec = [x for x in cases if x.get("ok") and x["phase"] == "decode" and "portable" not in x["name"]]
    dense = {x["name"]: x for x in dec if x["sparsity"] == 0}
    pct = {dt: [100 * fraction(x, c)[0] for x in dense.values() if x["dtype"] == dt]
           for dt in ("f32", "bf16")}
    speed = [dense[x["name"][: -len("sparse0.90")] + "dense"]["median_ms"] / x["median_ms"]
             for x in dec if x["name"].endswith("sparse0.90")]
    if not (pct["f32"] and pct["bf16"] and speed):
        sys.exit("cpu_section.py: the suite JSON lacks dense f32 / bf16 or 90% sparse decode cases "
                 "(a --quick or filtered run?): run bench/results/cpu_speed.sh")
    met = [min(pct["f32"]) >= 60, min(pct["bf16"]) >= 50, min(speed) >= 8]
    state = "met" if all(met) else "**" + ", ".join(
        n for n, ok in zip(("dense f32", "dense bf16", "sparse"), met) if not ok) + " not met**"
    return (f"{SUMMARY} dense ≥ 60% (f32) / ≥ 50% (bf16) of the memcpy measured beside each sample; "
            "90% sparse ≥ 8× dense | "
            f"{when}: dense f32 {min(pct['f32']):.1f}–{max(pct['f32']):.1f}%, bf16 "
            f"{min(pct['bf16']):.1f}–{max(pct['bf16']):.1f}%; sparse {min(speed):.2f}–{max(speed):.2f}× "
            f"([below](#cpu-attention-on-the-2-core-machine-issue-24)) | {state} |")


def main():
    suite_path, policy_path, readme_path, info = sys.argv[1:5]
    suite, policy = json.load(open(suite_path)), json.load(open(policy_path))
    c = suite["ceilings"]
    rel = os.path.relpath(suite_path, os.path.dirname(readme_path))
    reads = (f"read-only {c['host_read_gbs']:.1f} GB/s sequential and {c['host_paged_read_gbs']:.1f} "
             "GB/s over 4 KiB K/V slabs of scattered pages" if c.get("host_read_gbs")
             else "no read-only ceilings (sieve_bench before they were added)")
    beside = [x["adjacent"] for x in suite["cases"] if x.get("adjacent")]
    if beside:
        lo = min(a["copy_gbs"]["min"] for a in beside)
        hi = max(a["copy_gbs"]["max"] for a in beside)
        adjacent = (f" Each decode sample is measured against a memcpy and a read-only stream of 256 MiB run "
                    f"right before it on the same threads (the memcpy beside the samples ranged {lo:.1f}–{hi:.1f} "
                    "GB/s in this run); the tables give the median of the samples' ratios and, in brackets, "
                    "their range.")
    else:
        adjacent = " Decode ratios are against the process-start memcpy (a JSON from before the adjacent ceilings)."
    lines = [BEGIN, "",
             f"{info}. CPU: {c.get('host_cpu', 'not recorded')}.{adjacent} Ceilings at the start of the process, "
             f"same threads: memcpy {c['host_copy_gbs']:.1f} GB/s (read + write), {reads}, OpenBLAS sgemm "
             f"{c.get('host_sgemm_gflops', 0):.1f} GFLOP/s. Raw: [{os.path.basename(rel)}]({rel}), "
             f"[.txt]({rel[:-len('.json')]}.txt), "
             f"[policy-step-cpu.md](../results/policy-step-cpu.md).", "",
             "Decode, 32q/8kv, head dim 128, page 16:", ""]
    lines += decode_rows(suite["cases"], c) + ["", "Prefill, one causal 4K prompt:", ""]
    lines += prefill_rows(suite["cases"], c) + [""]
    lines += target_rows(suite["targets"]) + ["", "The policies' own CPU work, same run:", ""]
    lines += policy_rows(policy) + ["", END]
    text = open(readme_path).read()
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        sys.exit(f"cpu_section.py: {readme_path} must hold one '{BEGIN}' and one '{END}'")
    head, rest = text.split(BEGIN)
    text = head + "\n".join(lines) + rest.split(END, 1)[1]
    when = re.search(r"\*\*(.*?) UTC\*\*", info)
    row = summary_row(suite["cases"], c, (when.group(1) + " UTC") if when else suite["date"])
    text = "\n".join(row if l.startswith(SUMMARY) else l for l in text.split("\n"))
    open(readme_path, "w").write(text)
    print("\n".join(lines[1:-1]))


if __name__ == "__main__":
    main()
