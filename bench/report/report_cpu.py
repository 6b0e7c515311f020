"""The report's "Speed on the CPU" section: the attention kernels against the ceilings measured
beside each sample (the CPU suite JSON bench/results/cpu_speed.sh writes, docs/bench/cpu-2core-*.json)
and the policy step (a `sieve_bench --policy --device cpu` JSON: the report's own run, or
docs/results/policy-step-cpu.json). `update_readme` rewrites only this section of a written report
from those files (`sieve_report.py --update-cpu`); no tool runs.
"""
import glob
import json
import os

import matplotlib.pyplot as plt

from report_util import SOURCE, caption, md_table

CPU_SECTION = "## Speed on the CPU"
SUITE_GLOB = os.path.join(SOURCE, "docs", "bench", "cpu-2core-*.json")
DEFAULT_POLICY_JSON = os.path.join(SOURCE, "docs", "results", "policy-step-cpu.json")


def newest_suite_json():
    """The newest CPU suite run committed under docs/bench (by the date in its name), or None."""
    found = sorted(glob.glob(SUITE_GLOB))
    return found[-1] if found else None


def ratio(x, ceilings, ceiling):
    """'58.2% (51.0–60.3)': a decode case's median fraction of memcpy ("copy") or of the read-only
    stream ("read") over its samples, each against the ceiling measured right before it, and the
    range; a suite JSON from before the adjacent ceilings: against the process-start ceiling."""
    adj = x.get("adjacent", {}).get(f"fraction_of_{ceiling}")
    if adj:
        return f"{100 * adj['median']:.1f}% ({100 * adj['min']:.1f}–{100 * adj['max']:.1f})"
    whole = ceilings.get("host_copy_gbs" if ceiling == "copy" else "host_read_gbs")
    return f"{100 * x['gbs'] / whole:.1f}% (process start)" if whole else "–"


def kernel_table(suite):
    """One row per CPU decode case of the suite, then the prefill cases against sgemm."""
    c = suite["ceilings"]
    rows = []
    for x in suite["cases"]:
        if not x.get("ok") or x.get("backend") != "cpu":
            continue
        if x["phase"] == "decode":
            copy = x.get("adjacent", {}).get("copy_gbs")
            beside = f"{copy['min']:.1f}–{copy['max']:.1f}" if copy else f"{c.get('host_copy_gbs', 0):.1f}"
            dense = x.get("speedup_vs_dense")
            rows.append([f"`{x['name'].split('/', 1)[1]}`", f"{1e3 * x['median_ms']:.0f}", f"{x['gbs']:.1f}",
                         ratio(x, c, "copy"), ratio(x, c, "read"), beside, f"{dense:.2f}×" if dense else None])
        elif c.get("host_sgemm_gflops"):
            rows.append([f"`{x['name'].split('/', 1)[1]}`", f"{1e3 * x['median_ms']:.0f}", f"{x['gbs']:.1f}",
                         f"{100 * 1e3 * x['tflops'] / c['host_sgemm_gflops']:.1f}% of sgemm", "–", "–", None])
    return md_table(["case", "median µs", "GB/s", "% memcpy (range)", "% read-only (range)",
                     "memcpy beside, GB/s", "× dense"], rows)


def policy_rows(pj, out_dir):
    """The policy step's table (every non-dense row) and speed_cpu.png (decode steps against the
    context, dense dashed)."""
    rows, pts = [], {}
    for r in pj.get("results", []):
        if not isinstance(r, dict) or r.get("chain") == "dense" or r.get("step_ms") is None:
            continue
        rows.append([r.get("phase", "decode"), f"`{r['chain']}`", r.get("context"), r.get("batch"), r.get("step_ms"),
                     r.get("dense_step_ms"), r.get("speedup_vs_dense"), r.get("core_ms"),
                     r.get("selection_overhead_ms"), r.get("attended_fraction")])
        if r.get("phase", "decode") == "decode":  # dense differs with the layer count of the run
            pts.setdefault((r["chain"], r.get("batch"), r.get("layers", 1)), []).append(
                (r.get("context"), r.get("dense_step_ms"), r.get("step_ms")))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    dense_done = set()
    for (label, batch, layers), p in sorted(pts.items(), key=lambda kv: str(kv[0])):
        p = sorted(p)
        if (batch, layers) not in dense_done:
            ax.plot([x[0] for x in p], [x[1] for x in p], "k--", marker="s", label=f"dense bs{batch}, {layers} layer(s)")
            dense_done.add((batch, layers))
        ax.plot([x[0] for x in p], [x[2] for x in p], marker="o", label=f"{label[:48]} bs{batch}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context tokens")
    ax.set_ylabel("decode step ms (append + policy + attention)")
    ax.set_title("CPU decode step, policies vs dense", fontsize=9)
    ax.legend(fontsize=6, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "speed_cpu.png"), dpi=110)
    plt.close(fig)
    return md_table(["phase", "chain", "ctx", "batch", "step ms", "dense ms", "speed-up", "core-only ms",
                     "selection overhead ms", "attended"], rows)


def stages_table(pj):
    """The selection micro-benchmarks policy_cpu.sh stores with the policy step (sieve_selection_bench
    medians: Quest's bounds and top-k, the dense call without / with DELTA's page-mass sweep)."""
    rows = [[f"`{b['run_name']}`", f"{b['real_time']:.1f} {b['time_unit']}", f"{b['cpu_time']:.1f} {b['time_unit']}"]
            for b in pj.get("selection_stages", [])]
    return md_table(["stage (context/batch[/page_mass])", "median wall", "median CPU"], rows) if rows else ""


def section(suite_path, policy_table, policy_caption, notes):
    """The section's text: the kernel suite's table (when a suite JSON is given) and the policy
    step's table and caption."""
    lines = [CPU_SECTION, ""]
    if suite_path and os.path.exists(suite_path):
        suite = json.load(open(suite_path))
        c = suite["ceilings"]
        rel = os.path.relpath(suite_path, SOURCE)
        beside = any(x.get("adjacent") for x in suite["cases"])
        how = ("Decode: each sample against a memcpy and a read-only stream run right before it on the same "
               "threads (median of the samples' ratios, their range in brackets), so a noisy neighbour moves "
               "both sides" if beside else
               "Decode: against the memcpy and read-only stream measured once at the start of the process (a "
               "suite JSON from before the ceilings were measured beside each sample)")
        lines += [f"Attention kernels (`sieve_bench --cpu-only`, `{rel}`, {suite.get('date', '?')}, CPU "
                  f"{c.get('host_cpu', 'not recorded')}, {c.get('host_threads', '?')} threads; command "
                  f"`{suite.get('command', '?')}`). {how}; K/V rotate through copies larger than the "
                  "last-level cache. Prefill: against OpenBLAS sgemm of the same process.", "",
                  kernel_table(suite), ""]
    else:
        notes.append("CPU speed: no CPU suite JSON (run bench/results/cpu_speed.sh): kernel table left out")
    lines += ["`sieve_bench --policy` on the CPU: a whole decode step (append + policy hooks + core attention), "
              "median over steps; dense = the same store with no chain.", "", "![CPU speed](speed_cpu.png)", "",
              policy_table, "", policy_caption]
    return "\n".join(lines)


def update_readme(out_dir, suite_path, policy_path):
    """Rewrite only this section (and speed_cpu.png) of the README in out_dir from the JSON files;
    the other sections keep their measurements. Returns the notes the section made."""
    readme = os.path.join(out_dir, "README.md")
    text = open(readme).read()
    notes = []
    pj = json.load(open(policy_path))
    commands = sorted({r["command"] for r in pj.get("results", []) if isinstance(r, dict) and r.get("command")})
    stages = stages_table(pj)
    policy = policy_rows(pj, out_dir) + (
        "\n\nThe selection stages alone (`sieve_selection_bench`, one layer, 8q/2kv d64 bf16):\n\n" + stages
        if stages else "")
    body = section(suite_path, policy,
                   caption(commands, f"CPU, {pj.get('device', '?')}", pj.get("date", "?"),
                           f"From `{os.path.relpath(policy_path, SOURCE)}`."), notes)
    body += ("\n*This section was rewritten alone by `python3 bench/report/sieve_report.py --update-cpu`; "
             "the other sections are those of the run named at the top.*\n")
    start = text.find(CPU_SECTION)
    if start < 0:
        raise RuntimeError(f"{readme} has no '{CPU_SECTION}' section")
    end = text.find("\n## ", start + 1)
    end = len(text) if end < 0 else end + 1
    with open(readme, "w") as f:
        f.write(text[:start] + body + "\n" + text[end:])
    return notes
