#!/usr/bin/env python3
"""The markdown table of a transformers_step.py JSON (docs/results/transformers.md): per context
and batch, each method's decode step (median over all passes, and each pass's median: METHODS
order, then reversed), as a multiple of the fastest sdpa row's step, its attention's GPU time, host time (per
step, and per layer call) and share of the step, under a line naming the device, versions, date
and step counts.

    step_table.py transformers_step.json
"""
import json
import sys


def _ms(x):
    return "-" if x is None else "%.3f" % x


def table(rows):
    lines = ["| context | batch | attention | step ms | × fastest sdpa step | step ms by pass | attention GPU ms "
             "| attention host ms (µs/call) | attention share |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = {}  # per configuration the fastest of the sdpa rows: the comparison least kind to Sieve
    for r in rows:
        if r["method"].startswith("sdpa"):
            key = (r["ctx"], r["batch"])
            base[key] = min(base.get(key, r["step_ms"]), r["step_ms"])
    for r in rows:
        ref = base.get((r["ctx"], r["batch"]))
        host = r.get("attention_host_ms")
        lines.append("| %d | %d | %s | %.3f | %s | %s | %s | %s | %s |" % (
            r["ctx"], r["batch"], r["method"], r["step_ms"], "%.2f×" % (r["step_ms"] / ref) if ref else "-",
            " / ".join("%.3f" % t for t in r.get("step_ms_by_pass", [])) or "-", _ms(r["attention_ms"]),
            "-" if host is None else "%.3f (%.0f)" % (host, r["host_us_per_call"]),
            "-" if r["attention_share"] is None else "%.0f%%" % (100 * r["attention_share"])))
    return "\n".join(lines) + "\n"


def main(path):
    with open(path) as f:
        data = json.load(f)
    m = data["meta"]
    print("%s, torch %s, transformers %s, %s: %s; median of %d steps after %d warm-up in each of %d passes.\n"
          % (m["device"], m["torch"], m["transformers"], m["date"], m["model"], m["steps"], m["warmup"],
             m.get("passes", 1)))
    sys.stdout.write(table(data["rows"]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: step_table.py transformers_step.json")
    main(sys.argv[1])
