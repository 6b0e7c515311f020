#!/usr/bin/env python3
"""The markdown table of a transformers_step.py JSON (docs/results/transformers.md): per context
and batch, each method's decode step, as a multiple of sdpa's step, its attention time and the
attention's share of the step, under a line naming the device, versions, date and step counts.

    step_table.py transformers_step.json
"""
import json
import sys


def table(rows):
    lines = ["| context | batch | attention | step ms | × sdpa step | attention ms | attention share |",
             "|---|---|---|---|---|---|---|"]
    base = {(r["ctx"], r["batch"]): r["step_ms"] for r in rows if r["method"] == "sdpa"}
    for r in rows:
        ref = base.get((r["ctx"], r["batch"]))
        timed = r["attention_ms"] is not None
        lines.append("| %d | %d | %s | %.3f | %s | %s | %s |" % (
            r["ctx"], r["batch"], r["method"], r["step_ms"], "%.2f×" % (r["step_ms"] / ref) if ref else "-",
            "%.3f" % r["attention_ms"] if timed else "-", "%.0f%%" % (100 * r["attention_share"]) if timed else "-"))
    return "\n".join(lines) + "\n"


def main(path):
    with open(path) as f:
        data = json.load(f)
    m = data["meta"]
    print("%s, torch %s, transformers %s, %s: %s; median of %d steps after %d warm-up.\n"
          % (m["device"], m["torch"], m["transformers"], m["date"], m["model"], m["steps"], m["warmup"]))
    sys.stdout.write(table(data["rows"]))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: step_table.py transformers_step.json")
    main(sys.argv[1])
