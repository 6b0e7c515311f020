"""The report's long-context section: task accuracy against budget, per method and context length,
from the method table bench/longctx/method_table.py wrote on the GPU machine (committed as
docs/results/longctx.json). Run alone it prints that JSON's full table in Markdown, or with
--claims the papers' claims as pairs of methods on the same cells:

    python3 bench/report/report_longctx.py docs/results/longctx.json [--claims]
"""
import json
import os
import sys

import matplotlib.pyplot as plt

from report_util import SOURCE, md_table

LONGCTX_SECTION = "## Long-context tasks: accuracy against budget"
LONGCTX_FIGURES = ["longctx_decode.png", "longctx_prefill.png"]
DEFAULT_JSON = os.path.join(SOURCE, "docs", "results", "longctx.json")
MARKERS = "osD^v<>px*h+"


def kept(row):
    """The share of the context a row's method keeps: 1/F for a budget of 1/F, the calibrated
    density for the mass-cover prefill (dpxa, deltax), 1 - kv_reduction for Delta-KV's packing;
    None when the run reported none. (The calibrated density is that of the calibration's length,
    j["calibration"]; at another length the same τ keeps another share.)"""
    if "fraction" in row:
        return 1 / row["fraction"]
    if row.get("calibrated", {}).get("density") is not None:
        return row["calibrated"]["density"]
    red = row.get("metrics", {}).get("kv_reduction")
    return None if red is None else 1 - red


def ok_rows(j):
    return [r for r in j["rows"] if "error" not in r]


def plot(j, phase, path):
    rows = [r for r in ok_rows(j) if r["phase"] == phase]
    tasks = sorted({r["task"] for r in rows}) or ["-"]
    lengths = sorted({r["length"] for r in rows}) or [0]
    fig, axes = plt.subplots(len(tasks), len(lengths), figsize=(5.2 * len(lengths), 3.9 * len(tasks)),
                             squeeze=False)
    for ti, task in enumerate(tasks):
        for li, L in enumerate(lengths):
            ax = axes[ti][li]
            cell = [r for r in rows if r["task"] == task and r["length"] == L]
            by = {}
            for r in cell:
                if kept(r) is not None:
                    by.setdefault(r["method"], []).append((kept(r), r["chain_score"]["accuracy"]))
            # Methods often coincide (several at 1.0): markers and sizes that differ keep each visible.
            for i, (m, pts) in enumerate(sorted(by.items())):
                pts.sort()
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=MARKERS[i % len(MARKERS)],
                        ms=9 - 5 * i / max(len(by) - 1, 1), mfc="none", lw=1, ls=("-", "--", ":")[i % 3], label=m)
            if cell:
                ax.axhline(cell[0]["dense"]["accuracy"], color="black", ls="--", lw=0.8, label="dense")
            ax.set_xscale("log", base=2)
            ax.set_ylim(-0.03, 1.03)
            ax.set_title(f"{phase}: {task}, {L} tokens ({j['instances']} instances)", fontsize=8)
            ax.set_xlabel("kept share of the context (budget / context, or density)", fontsize=7)
            ax.set_ylabel("task accuracy (graded tokens right)", fontsize=7)
            ax.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def budget_table(j, phase):
    """One row per (method, task, length): accuracy at each budget fraction; dense beside."""
    fr = j["fractions"]
    rows = {}
    for r in ok_rows(j):
        if r["phase"] == phase and "fraction" in r:
            key = (r["method"], r["task"], r["length"])
            rows.setdefault(key, {"dense": r["dense"]["accuracy"]})[r["fraction"]] = r["chain_score"]["accuracy"]
    out = [[m, t, L, v["dense"]] + [v.get(f) for f in fr] for (m, t, L), v in sorted(rows.items())]
    return md_table(["method", "task", "ctx", "dense"] + [f"1/{f}" for f in fr], out)


def full_table(j):
    """Every row of the JSON: accuracy and exact of dense and the chain, the exact CI, KL, top-1."""
    out = []
    for r in j["rows"]:
        budget = f"{r['token_budget']} (1/{r['fraction']})" if "fraction" in r else r.get("setting", "")
        if "error" in r:
            out.append([r["task"], r["length"], r["method"], budget, "error: " + r["error"]] + [""] * 5)
            continue
        d, c = r["dense"], r["chain_score"]
        lo, hi = r["chain_exact_ci95"]
        k = kept(r)
        out.append([r["task"], r["length"], r["method"], budget, f"{d['accuracy']:.3f} / {d['exact']:.3f}",
                    f"{c['accuracy']:.3f} / {c['exact']:.3f}", f"[{lo:.2f}, {hi:.2f}]", r["kl_mean"],
                    r["top1_agreement"], "–" if k is None else f"{k:.3f}"])
    return md_table(["task", "ctx", "method", "budget", "dense acc / exact", "chain acc / exact",
                     "exact 95% CI", "KL mean", "top-1", "kept"], out)


# The papers' claims (issue 23) as pairs of methods on the same cells: (claim, method A, method B).
CLAIMS = [
    ("DELTA at least as accurate as Quest at equal budget", "delta", "quest"),
    ("DELTA at least as accurate as Quest at equal budget (sparsest DELTA: layer 0 the only Δ-layer)",
     "delta select_layers=[0]", "quest"),
    ("SeerAttention-R above Quest", "seer", "quest"),
    ("SeerAttention-R close to its oracle", "seer", "seer oracle"),
    ("RaaS near Quest (RaaS selecting in the prompt too)", "raas prefill_policy=quest", "quest"),
    ("DPXA above XAttention at matched density (same calibrated target r)", "dpxa dpxa", "dpxa xattn"),
    ("DPXA above the naive stride estimator (same target r)", "dpxa dpxa", "dpxa stride"),
    ("Delta-KV above periodic compression (same reduction)", "deltakv", "deltakv periodic matched"),
    ("Delta-KV above random compression (same reduction)", "deltakv", "deltakv random matched"),
    ("Δ-correction pulls a streaming prefill toward dense", "streaming prefill + delta_correction",
     "streaming prefill"),
]


def claims(j):
    """Per claim: A and B on every cell both ran (task, length, budget or setting), the accuracy
    difference, and the count of cells where A is above / level with / below B."""
    cells = {}
    for r in ok_rows(j):
        point = r.get("fraction", r.get("setting"))
        if r["method"].endswith(" matched"):
            point = "default"  # matched to the default Delta-KV run of the same cell
        cells[(r["method"], r["task"], r["length"], point)] = r
    out = []
    for claim, a, b in CLAIMS:
        rows, above, level, below = [], 0, 0, 0
        for (m, task, L, point), ra in sorted(cells.items(), key=lambda kv: str(kv[0])):
            rb = cells.get((b, task, L, point))
            if m != a or rb is None:
                continue
            x, y = ra["chain_score"]["accuracy"], rb["chain_score"]["accuracy"]
            above, level, below = above + (x > y), level + (x == y), below + (x < y)
            rows.append([task, L, f"1/{point}" if isinstance(point, int) else point, ra["dense"]["accuracy"], x, y,
                         f"{x - y:+.3f}", ra["kl_mean"], rb["kl_mean"]])
        out += [f"**{claim}**: `{a}` against `{b}` — above in {above}, level in {level}, below in {below} of "
                f"{len(rows)} cells.", ""]
        if rows:
            out += [md_table(["task", "ctx", "budget", "dense", "A acc", "B acc", "A − B", "A KL", "B KL"], rows), ""]
    return "\n".join(out)


def longctx_section(path, out_dir, notes):
    """The section's Markdown (its heading included); its two figures written into out_dir."""
    j = json.load(open(path)) if path and os.path.exists(path) else None
    if j is None or not ok_rows(j):
        for f in LONGCTX_FIGURES:
            fig, ax = plt.subplots(figsize=(4, 2))
            ax.axis("off")
            ax.text(0.5, 0.5, "no long-context method table", ha="center")
            fig.savefig(os.path.join(out_dir, f), dpi=80)
            plt.close(fig)
        notes.append(f"long-context tasks: no method table at {path} (bench/longctx/method_table.py)")
        return "\n".join([LONGCTX_SECTION, "", "No method table was found.", ""] +
                         [f"![{f}]({f})" for f in LONGCTX_FIGURES]) + "\n"
    for phase, f in zip(("decode", "prefill"), LONGCTX_FIGURES):
        plot(j, phase, os.path.join(out_dir, f))
    rel = os.path.relpath(path, SOURCE)
    own = [[r["method"], r["task"], r["length"], r.get("setting"), kept(r), r["dense"]["accuracy"],
            r["chain_score"]["accuracy"]] for r in ok_rows(j) if "setting" in r]
    n_err = sum("error" in r for r in j["rows"])
    if n_err or j.get("skipped"):
        notes.append(f"long-context tasks: {n_err} cells failed and {len(j.get('skipped', []))} were skipped "
                     f"in {rel}")
    return "\n".join([
        LONGCTX_SECTION, "",
        f"The long-context model (`{j['model']}`: 4 layers, 4 q / 2 KV heads of 64, trained at 8192 tokens on "
        f"synthetic retrieval tasks) on held-out task instances (seed {j['seed']}, {j['instances']} per cell), "
        f"every policy against dense on the same instances; device `{j['device']}`, from `{rel}` "
        f"(`{j['command']}`, {j['seconds']} s). Accuracy = graded tokens right, teacher-forced. The mass-cover "
        "prefill (dpxa, deltax) and Delta-KV have no budget knob: they stand at their calibrated density (that of "
        "the calibration's length, the same τ at every length) or measured kept share. Claims and findings: `docs/results/longctx.md`.", "",
        f"![long-context decode]({LONGCTX_FIGURES[0]})", "", budget_table(j, "decode"), "",
        f"![long-context prefill]({LONGCTX_FIGURES[1]})", "", budget_table(j, "prefill"), "",
        "Prefill methods at their own operating point:", "",
        md_table(["method", "task", "ctx", "setting", "kept", "dense", "accuracy"], own) if own else "none",
        ""])


def update_readme(out_dir, path, before):
    """Rewrite only this section (and its figures) of the README in out_dir from the JSON at path; the
    other sections keep their measurements. Without the section yet, it goes before the heading
    `before`. Returns the notes the section made."""
    readme = os.path.join(out_dir, "README.md")
    text = open(readme).read()
    notes = []
    section = longctx_section(path, out_dir, notes)
    section += ("\n*This section was rewritten alone by `python3 bench/report/sieve_report.py --update-longctx`; "
                "the other sections are those of the run named at the top.*\n")
    start = text.find(LONGCTX_SECTION)
    if start < 0:
        start = end = text.find(before)
        if start < 0:
            raise RuntimeError(f"{readme} has neither '{LONGCTX_SECTION}' nor '{before}'")
    else:
        end = min(i for i in (text.find("\n## ", start + 1), text.find("\n### ", start + 1), len(text)) if i >= 0)
        end += 1 if end < len(text) else 0
    with open(readme, "w") as f:
        f.write(text[:start] + section + "\n" + text[end:])
    return notes


if __name__ == "__main__":
    data = json.load(open(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_JSON))
    print(claims(data) if "--claims" in sys.argv else full_table(data))
