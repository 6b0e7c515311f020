"""The report's GPU sections: kernel-suite and policy-benchmark JSON from the GPU machine
(`sieve_bench --json`), their speed plots and tables, and the issues' speed targets against them."""
import glob
import json
import os
import re

import matplotlib.pyplot as plt

from report_util import SOURCE, md_table


def policy_records(pj):
    """The per-(chain, context, batch) rows of a `sieve_bench --policy --json` file (skipped and
    failed rows left out)."""
    return [c for c in pj.get("results", []) if isinstance(c, dict) and "step_ms" in c]


def policy_runs(j):
    """Policy-benchmark runs in one JSON file: a single `sieve_bench --policy` file, or the
    {"kind": "policy-batch", "runs": [...]} file bench/device_all.sh writes."""
    if j.get("kind") == "policy-batch":
        return [r for r in j.get("runs", []) if isinstance(r, dict) and r.get("meta", {}).get("benchmark") == "policy_step"]
    return [j] if j.get("meta", {}).get("benchmark") == "policy_step" else []


def load_gpu_results(gpu_paths):
    """Kernel-suite and policy-benchmark JSON files among the given files and directories (other
    JSON files are ignored)."""
    suites, policies = [], []
    files = []
    for g in gpu_paths or []:
        files += sorted(glob.glob(os.path.join(g, "*.json"))) if os.path.isdir(g) else [g]
    for path in files:
        try:
            j = json.load(open(path))
        except (OSError, ValueError):
            continue
        if isinstance(j, dict) and "ceilings" in j and "cases" in j:
            suites.append((path, j))
        elif isinstance(j, dict):
            policies += [(path, run) for run in policy_runs(j) if policy_records(run)]
    return suites, policies


STANDARD_CASE = re.compile(r"^gpu/(decode|prefill)/[^/]+/bs\d+/ctx\d+/[a-z0-9]+/(dense|sparse[0-9.]+)$")


def speed_gpu(suites, policies, out_dir, notes):
    """One panel per (heads, batch): our dense and block-sparse kernels against context, PyTorch
    SDPA on the same shape, and the floor from the measured ceiling (dotted)."""
    text = []
    for phase, fname in (("decode", "speed_gpu_decode.png"), ("prefill", "speed_gpu_prefill.png")):
        panels = {}
        for path, j in suites:
            for c in j["cases"]:
                if (c.get("phase") != phase or not c.get("ok", True) or c.get("backend") != "cuda"
                        or not STANDARD_CASE.match(c["name"])):
                    continue
                if phase == "decode" and c["batch"] not in (1, 16):
                    continue
                key = (f"{c['n_q_heads']}q{c['n_kv_heads']}kv d{c['head_dim']} bs{c['batch']}")
                panels.setdefault(key, (j, {}))[1].setdefault(c["sparsity"], []).append(c)
        keys = sorted(panels)
        n = max(len(keys), 1)
        cols = min(n, 4)
        rows_n = (n + cols - 1) // cols
        fig, axes = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 3.6 * rows_n), squeeze=False)
        for ax in axes.flat[len(keys):]:
            ax.axis("off")
        for ax, key in zip(axes.flat, keys):
            j, by = panels[key]
            ceil = j["ceilings"]
            for sp, cs in sorted(by.items()):
                cs = sorted(cs, key=lambda c: c["context"])
                x = [c["context"] for c in cs]
                ax.plot(x, [c["median_ms"] for c in cs], marker="o",
                        label="ours dense" if sp == 0 else f"ours {100 * (1 - sp):.0f}% of blocks")
                if sp == 0:
                    if phase == "decode":
                        # The read-only stream where the suite measured it (decode reads, barely
                        # writes), else the older copy ceiling.
                        bw, what = (ceil["read_gbs"], "read") if ceil.get("read_gbs") else (ceil["copy_gbs"], "copy")
                        floor = [c["bytes"] / (bw * 1e9) * 1e3 for c in cs]
                        lab = f"bytes / {bw:.0f} GB/s ({what})"
                    else:
                        floor = [c["flops"] / (ceil["bf16_gemm_tflops"] * 1e12) * 1e3 for c in cs]
                        lab = f"flops / {ceil['bf16_gemm_tflops']:.0f} TFLOP/s"
                    ax.plot(x, floor, ":", color="gray", label=f"floor: {lab}")
                    sd = [(c["context"], j.get("sdpa", {}).get(c["shape"], {}).get("best_ms")) for c in cs]
                    sd = [q for q in sd if q[1]]
                    if sd:
                        ax.plot([q[0] for q in sd], [q[1] for q in sd], "kx--", label="PyTorch SDPA (best backend)")
            ax.set_title(f"{phase} {key} ({ceil.get('gpu', 'GPU')})", fontsize=8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("context tokens", fontsize=8)
            ax.set_ylabel("ms per call", fontsize=8)
            ax.legend(fontsize=5.5)
        if not keys:
            axes.flat[0].axis("on")
            axes.flat[0].text(0.5, 0.5, "no GPU results given (--gpu-results)", ha="center",
                              transform=axes.flat[0].transAxes)
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, fname), dpi=110)
        plt.close(fig)
    for path, j in suites:
        text.append(f"Kernel suite `{os.path.relpath(path, SOURCE)}`: device {j['ceilings'].get('gpu')}, date "
                    f"{j.get('date')}, command `{j.get('command')}`; measured ceilings: "
                    + (f"read {j['ceilings']['read_gbs']:.0f} GB/s, " if j['ceilings'].get('read_gbs') else "")
                    + f"copy {j['ceilings']['copy_gbs']:.0f} GB/s, cuBLAS bf16 {j['ceilings']['bf16_gemm_tflops']:.0f} TFLOP/s.\n")
        rows, failed = [], []
        for c in j["cases"]:
            if c.get("backend") != "cuda" or not c.get("tensor_cores", True):
                continue
            if not c.get("ok", True) or "median_ms" not in c:  # a case that failed has no timing
                failed.append(f"`{c['name']}`: {c.get('error', 'no timing')}")
                continue
            rows.append([c["name"].replace("gpu/", ""), c["median_ms"], c.get("gbs"), c.get("tflops"),
                         c.get("speedup_vs_sdpa")])
        text.append(md_table(["case", "median ms", "GB/s", "TFLOP/s", "vs SDPA (>1: faster)"], rows))
        text += [f"Failed in that run (no timing): {f}" for f in failed]
        text.append("")
    for path, j in policies:
        m = j["meta"]
        text.append(f"Policy benchmark `{os.path.relpath(path, SOURCE)}`: {m.get('device')}, {m.get('date')}, "
                    f"{m.get('layers')} layer(s) {m.get('n_q_heads')}q/{m.get('n_kv_heads')}kv d{m.get('head_dim')} "
                    f"{m.get('dtype')}, keys {m.get('keys')}; command `{m.get('command')}`.\n")
        rows = []
        for c in policy_records(j):
            rows.append([f"`{c['chain']}`", c.get("phase"), c.get("context"), c.get("batch"), c.get("step_ms"),
                         c.get("dense_step_ms"), c.get("speedup_vs_dense"), c.get("core_ms"),
                         c.get("selection_overhead_ms"), c.get("sdpa_ms"), c.get("speedup_vs_sdpa"),
                         c.get("attended_fraction")])
        text.append(md_table(["chain", "phase", "ctx", "batch", "step ms", "dense ms", "x dense",
                              "core-only ms", "selection ms", "SDPA ms", "x SDPA", "attended"], rows))
        text.append("")
    if not suites and not policies:
        notes.append("GPU speed: no GPU results were given (--gpu-results DIR with sieve_bench JSON files)")
    return "\n".join(text)


def targets(cfg, suites, policies):
    """The issues' speed targets (report_config.json "targets") checked against every matching
    policy-benchmark row; a target with no matching row is listed as not measured."""
    rows = []
    for t in cfg.get("targets", []):
        found = False
        for path, j in policies:
            m = j["meta"]
            if any(k in t and m.get(f) != t[k] for k, f in (("hq", "n_q_heads"), ("hkv", "n_kv_heads"),
                                                             ("layers", "layers"))):
                continue
            for c in policy_records(j):
                if (c.get("phase") != t["phase"] or not re.search(t["chain"], c["chain"])
                        or ("context" in t and c.get("context") != t["context"])
                        or ("context_min" in t and c.get("context", 0) < t["context_min"])
                        or ("batch" in t and c.get("batch") != t["batch"])):
                    continue
                found = True
                x = c.get("speedup_vs_dense")
                rows.append([f"#{t['issue']}", t["target"], f"`{c['chain']}` ctx {c['context']} bs {c['batch']}",
                             f"{x:.2f}x", "met" if x >= t["min"] else "**missed**", os.path.relpath(path, SOURCE)])
        if not found:
            rows.append([f"#{t['issue']}", t["target"], "-", "-", "not measured", "-"])
    for path, j in suites:
        for t in j.get("targets", []):
            rows.append(["kernels", t.get("target"), t.get("criterion"), t.get("measured"),
                         "met" if t.get("met") else ("**missed**" if t.get("evaluated", True) else "not measured"),
                         os.path.relpath(path, SOURCE)])
    return rows
