#!/usr/bin/env python3
"""Reads `ncu -i REPORT --page raw --csv` (one row per profiled launch) and prints, per launch:
   stalls    duration, speed of light, occupancy, issue rate and the top warp stall reasons
             (cycles per issued instruction), largest first;
   timeline  every launch in order with its duration, then the total per kernel;
   skip A B  how many launches of kernel B come before the first B launched after a kernel A
             (for ncu --launch-skip with -k B);
   source    reads `ncu -i REPORT --page source --csv --print-source sass` instead (a report with
             the SourceCounters section): the SASS instructions with the most warp-stall samples,
             each with its share and its top sampled reasons, and the samples summed per reason.
Names match as substrings of the kernel's function name."""
import csv
import re
import sys

STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
SHOWN = [  # label, metric
    ("duration us", "gpu__time_duration.sum"),
    ("SM throughput %", "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
    ("memory throughput %", "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"),
    ("DRAM throughput %", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    ("L2 hit %", "lts__t_sector_hit_rate.pct"),
    ("achieved occupancy %", "sm__warps_active.avg.pct_of_peak_sustained_active"),
    ("issue slots busy %", "smsp__issue_active.avg.pct_of_peak_sustained_active"),
    ("warp cycles per issued instruction", "smsp__average_warps_active_per_issue_active.ratio"),
    ("registers per thread", "launch__registers_per_thread"),
]


def number(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def launches(path):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    # ncu may print lines of its own before the table: the header is the row naming "Kernel Name".
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head, units = rows[start], rows[start + 1]
    out = []
    for r in rows[start + 2:]:
        rec = dict(zip(head, r))
        rec["_units"] = dict(zip(head, units))
        out.append(rec)
    return out


def short(name):
    name = name.replace("(anonymous namespace)", "")
    name = re.sub(r"\(.*", "", name)  # the parameter list
    return re.sub(r"^void ", "", name).split("::")[-1]


US_PER = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6, "second": 1e6}


def duration_us(rec):
    v = number(rec.get("gpu__time_duration.sum", ""))
    unit = rec["_units"].get("gpu__time_duration.sum", "ns")
    if v is None or unit not in US_PER:
        return None
    return v * US_PER[unit]


def stalls(path):
    for rec in launches(path):
        print(f"== {short(rec['Kernel Name'])}  grid {rec.get('Grid Size', '?')}  block {rec.get('Block Size', '?')}")
        for label, m in SHOWN:
            if m not in rec:
                continue
            v = duration_us(rec) if m == "gpu__time_duration.sum" else number(rec[m])
            if v is not None:
                print(f"   {label:36s} {v:12.2f}")
        found = []
        for m, v in rec.items():
            g = STALL.match(m) if isinstance(v, str) else None
            if g and number(v) is not None:
                found.append((number(v), g.group(1)))
        total = sum(v for v, _ in found)
        print("   top stall reasons (cycles per issued instruction, share of all stall cycles):")
        for v, why in sorted(found, reverse=True)[:8]:
            print(f"     {why:28s} {v:8.2f}  {100 * v / total if total else 0:5.1f}%")
        for m, v in sorted(rec.items()):
            if isinstance(v, str) and "pipe_tensor" in m and "pct" in m and number(v) is not None:
                print(f"   {m} {number(v):.2f}")


def timeline(path):
    per = {}
    for rec in launches(path):
        d = duration_us(rec)
        name = short(rec["Kernel Name"])
        print(f"{rec.get('ID', '?'):>5s}  {d if d is not None else float('nan'):12.1f} us  {name}  grid {rec.get('Grid Size', '?')}")
        n, t = per.get(name, (0, 0.0))
        per[name] = (n + 1, t + (d or 0.0))
    print("per kernel (launches, total us):")
    for name, (n, t) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t:12.1f} us  {n:5d} x  {name}")


def skip(path, after, kernel):
    seen, armed = 0, False
    for rec in launches(path):
        name = rec["Kernel Name"]
        if after in name:
            armed = True
        elif kernel in name:
            if armed:
                print(seen)
                return
            seen += 1
    sys.exit(f"no {kernel} launch after a {after} launch in {path}")


def source(path, top=45):
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    start = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
    head = [c.strip() for c in rows[start]]
    recs = [dict(zip(head, r)) for r in rows[start + 1:]]
    allc = next((c for c in head if c.startswith("Warp Stall Sampling (All")), None)
    if allc is None:
        sys.exit(f"no warp stall sampling column in {path}: {head}")
    # Per-reason sample columns, where this ncu prints them (names vary between versions).
    reasons = [c for c in head if c.startswith("stall_") or c.startswith("smsp__pcsamp_warps_issue_stalled")]
    total = sum(number(r.get(allc, "")) or 0 for r in recs)
    print(f"{len(recs)} instructions, {total:.0f} samples ({allc})")
    if reasons:
        sums = sorted(((sum(number(r.get(c, "")) or 0 for r in recs), c) for c in reasons), reverse=True)
        print("samples per reason:")
        for v, c in sums[:12]:
            print(f"  {c:60s} {v:10.0f} {100 * v / total if total else 0:5.1f}%")
    ranked = sorted(recs, key=lambda r: -(number(r.get(allc, "")) or 0))
    print(f"top {top} instructions:")
    for r in ranked[:top]:
        v = number(r.get(allc, "")) or 0
        why = sorted(((number(r.get(c, "")) or 0, c) for c in reasons), reverse=True)[:2]
        tag = " ".join(f"{c.replace('smsp__pcsamp_warps_issue_stalled_', '')}={x:.0f}" for x, c in why if x)
        print(f"{100 * v / total if total else 0:5.1f}%  {r.get('Address', ''):>6s}  {r.get('Source', '')[:70]:70s} {tag}")


if __name__ == "__main__":
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "stalls":
        stalls(path)
    elif mode == "timeline":
        timeline(path)
    elif mode == "source":
        source(path)
    elif mode == "skip":
        skip(path, sys.argv[3], sys.argv[4])
    else:
        sys.exit(__doc__)
