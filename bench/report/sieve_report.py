#!/usr/bin/env python3
"""Sieve's evaluation report: fidelity, memory and speed of every policy, in tables and plots.
Sections of their own: report_gpu.py (GPU speed, targets), report_longctx.py (long-context tasks);
shared helpers: report_util.py.

    python3 bench/report/sieve_report.py [--build build] [--out docs/report]
                                         [--gpu-results PATH...] [--profile full|quick]

It runs the CPU measurements itself with the built tools (`sieve eval`, `sieve attn`, `sieve run`,
`sieve_bench`), folds in the JSON a GPU-machine run left behind (`sieve_bench --json`: the kernel
suite's and the policy benchmark's files, found in --gpu-results), and writes README.md plus PNG
plots into --out. What it measures is in bench/report/report_config.json; a policy whose plugin
is not in the build is skipped and the report says so. Every figure names the commands, the
device and the date that produced it. `--check DIR` verifies a written report (the CI test).
"""
import argparse
import csv
import datetime
import json
import os
import shlex
import sys
import tempfile
import time

import matplotlib.pyplot as plt

from report_util import HERE, SOURCE, Runner, caption, cpu_name, fmt, md_table
from report_gpu import load_gpu_results, policy_records, speed_gpu, targets
from report_cpu import CPU_SECTION, DEFAULT_POLICY_JSON, newest_suite_json, policy_rows
from report_cpu import section as cpu_section
from report_cpu import update_readme as update_cpu_readme
from report_longctx import DEFAULT_JSON, LONGCTX_FIGURES, LONGCTX_SECTION, longctx_section, update_readme

# Sections the README always has, in order (the CI check looks for each).
SECTIONS = [
    "## Decode policies on the real model",
    "## Prefill policies on the real model",
    "## Prefill policies on synthetic long contexts",
    "## Memory: resident KV bytes against decode length",
    CPU_SECTION,
    "## Speed on the GPU machine",
    "## Targets and where we fall short",
    LONGCTX_SECTION,
]
FIGURES = ["decode_fidelity.png", "prefill_real.png", "prefill_synthetic.png", "memory.png",
           "speed_cpu.png", "speed_gpu_decode.png", "speed_gpu_prefill.png"] + LONGCTX_FIGURES


# ---- Decode fidelity on the real model ----------------------------------------------------------

def decode_fidelity(r, cfg, prof, available, out_dir, notes):
    budgets, steps = prof["budgets"], prof["decode_steps"]
    rows, series, commands = [], {}, []
    for pol in cfg["decode_policies"]:
        if pol["plugin"] not in available:
            notes.append(f"decode: `{pol['policy']}` skipped: plugin `{pol['plugin']}` is not in this build")
            continue
        for b in budgets:
            chain = pol["chain"].format(B=b, W=b - 4, SOURCE=SOURCE)
            try:
                j, cmd = r.json([r.sieve, "eval", "--chain", chain, "--steps", str(steps), "--json"],
                                f"decode eval of {pol['policy']}")
            except RuntimeError as e:
                notes.append(f"decode: `{pol['policy']}` at budget {b} failed: {e}")
                continue
            commands.append(cmd)
            a, tf, fr = j["attention"]["decode"], j["teacher_forced"], j["free_running"]
            resident = j["kv_bytes"]["chain"] / max(j["kv_bytes"]["dense"], 1)
            rows.append([pol["policy"], b, a["recall"], a["min_recall"], a["output_rel_err"], tf["kl_mean"],
                         tf["top1_agreement"], fr["token_agreement"], a["attended_fraction"], resident])
            series.setdefault(pol["policy"], []).append((b, a["recall"], tf["kl_mean"], tf["top1_agreement"],
                                                         fr["token_agreement"]))
    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    for name, pts in series.items():
        xs = [p[0] for p in pts]
        for k, ax in enumerate(axes):
            ax.plot(xs, [p[k + 1] for p in pts], marker="o", label=name)
    for ax, t in zip(axes, ["decode attention recall", "KL(dense || policy), teacher-forced",
                            "top-1 agreement, teacher-forced", "greedy token agreement, free-running"]):
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("token budget")
        ax.set_xscale("log", base=2)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "decode_fidelity.png"), dpi=110)
    plt.close(fig)
    table = md_table(["policy", "budget", "recall", "min recall", "out rel err", "KL mean", "top-1", "greedy agr.",
                      "attended", "resident KV"], rows)
    return table, commands, rows


# ---- Prefill fidelity: real model and synthetic -------------------------------------------------

def kept_fraction(attended, metrics):
    """The x axis of the prefill plots: attended / causal keys, or for a policy that compresses the
    keys instead of skipping them (Delta-KV reports kv_reduction) the fraction of keys it keeps."""
    if "kv_reduction" in metrics:
        return 1.0 - metrics["kv_reduction"]["mean"]
    if "deltax_kv_reduction" in metrics:  # DeltaXAttention: its kept tiles, some of them packed
        return attended * (1.0 - metrics["deltax_kv_reduction"]["mean"])
    return attended


def prefill_real(r, cfg, prof, available, out_dir, notes):
    prompts = os.path.join(HERE, "long_prompts.txt")
    rows, series, commands = [], {}, []
    for pol in cfg["prefill_policies"]:
        if pol["plugin"] not in available or ("dpxa" in pol["policy"] and "dpxa" not in available):
            notes.append(f"prefill (real model): `{pol['policy']}` skipped: plugin `{pol['plugin']}` is not in this build")
            continue
        for chain in pol["sweep"]:
            try:
                j, cmd = r.json([r.sieve, "eval", "--chain", chain, "--prompts", prompts, "--steps",
                                 str(prof["prefill_steps"]), "--json"], f"prefill eval of {pol['policy']}")
            except RuntimeError as e:
                notes.append(f"prefill (real model): `{chain}` failed: {e}")
                continue
            commands.append(cmd)
            a, tf, fr = j["attention"]["prefill"], j["teacher_forced"], j["free_running"]
            density = kept_fraction(a["attended_fraction"], j.get("metrics", {}))
            rows.append([pol["policy"], f"`{chain}`", density, a["recall"], a["output_rel_err"],
                         tf["kl_mean"], tf["top1_agreement"], fr["token_agreement"]])
            series.setdefault(pol["policy"], []).append((density, a["recall"], a["output_rel_err"], tf["kl_mean"]))
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for name, pts in series.items():
        pts = sorted(pts)
        for k, ax in enumerate(axes):
            ax.plot([p[0] for p in pts], [p[k + 1] for p in pts], marker="o", label=name)
    for ax, t in zip(axes, ["prefill attention recall", "prefill output rel. error",
                            "KL of the decode that follows"]):
        ax.set_title(t, fontsize=9)
        ax.set_xlabel("attended fraction of causal keys (Delta-KV, deltax: keys loaded)")
    axes[1].set_yscale("log")
    axes[2].set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "prefill_real.png"), dpi=110)
    plt.close(fig)
    table = md_table(["policy", "chain", "density or keys kept", "recall", "out rel err", "KL (decode after)", "top-1",
                      "greedy agr."], rows)
    return table, commands


def prefill_synthetic(r, cfg, prof, available, out_dir, notes, keys_option):
    s = prof["synthetic"]
    rows, series, commands = [], {}, []
    base = [r.sieve, "attn", "--phase", "prefill", "--context", str(s["context"]), "--new-tokens",
            str(s["new_tokens"]), "--q-heads", str(s["q_heads"]), "--kv-heads", str(s["kv_heads"]),
            "--head-dim", str(s["head_dim"]), "--page-size", str(s["page_size"]), "--json"] + keys_option
    for pol in cfg["prefill_policies"]:
        if pol["plugin"] not in available:
            notes.append(f"prefill (synthetic): `{pol['policy']}` skipped: plugin `{pol['plugin']}` is not in this build")
            continue
        for chain in pol["sweep"]:
            # the model's windows are for 512 tokens: scale them to the synthetic context
            scaled = chain.replace("window=32", f"window={s['context'] // 16}") \
                          .replace("window=64", f"window={s['context'] // 8}") \
                          .replace("window=128", f"window={s['context'] // 4}") \
                          .replace("gamma=8,tail=16", "gamma=64,tail=128")
            try:
                j, cmd = r.json(base + ["--chain", scaled], f"synthetic prefill of {pol['policy']}")
            except RuntimeError as e:
                notes.append(f"prefill (synthetic): `{scaled}` failed: {e}")
                continue
            commands.append(cmd)
            res = j["results"][0] if "results" in j else j
            density = kept_fraction(res["attended_fraction"], res.get("metrics", {}))
            rows.append([pol["policy"], f"`{scaled}`", density, res["recall"], res["output_rel_err"]])
            series.setdefault(pol["policy"], []).append((density, res["recall"], res["output_rel_err"]))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, pts in series.items():
        pts = sorted(pts)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        axes[1].plot([p[0] for p in pts], [max(p[2], 1e-12) for p in pts], marker="o", label=name)
    axes[0].set_title("attention recall (true softmax mass kept)", fontsize=9)
    axes[1].set_title("output rel. error vs f64 dense", fontsize=9)
    axes[1].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("attended fraction of causal keys (Delta-KV, deltax: keys loaded)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "prefill_synthetic.png"), dpi=110)
    plt.close(fig)
    return md_table(["policy", "chain", "density or keys kept", "recall", "out rel err"], rows), commands


# ---- Memory ----------------------------------------------------------------------------------------

def memory(r, cfg, prof, available, out_dir, notes):
    """Resident KV bytes after every decode step: one `sieve run --ignore-eos --kv-trace` per policy
    (the runtime's own byte count of the store, written after each step); the table samples it at
    the profile's lengths."""
    series, rows, commands = {}, [], []
    longest = max(prof["memory_steps"])
    for pol in cfg["memory_policies"]:
        if pol["plugin"] not in available:
            notes.append(f"memory: `{pol['policy']}` skipped: plugin `{pol['plugin']}` is not in this build")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            trace = os.path.join(tmp, "kv.csv")
            args = [r.sieve, "run", "--steps", str(longest), "--ignore-eos", "--prompt", "Once upon a time",
                    "--kv-trace", trace]
            if pol["chain"]:
                args += ["--chain", pol["chain"]]
            try:
                _, cmd, _ = r.run(args, f"memory run of {pol['policy']}")
            except RuntimeError as e:
                notes.append(f"memory: {e}")
                continue
            with open(trace) as f:
                pts = [(int(row["tokens"]), int(row["kv_bytes"])) for row in csv.DictReader(f)]
        commands.append(cmd.replace(trace, pol["policy"].replace(" ", "_") + ".csv"))
        if not pts:
            notes.append(f"memory: `{cmd}` wrote an empty trace")
            continue
        series[pol["policy"]] = pts
        by_tokens = dict(pts)
        for n in prof["memory_steps"]:
            near = min(by_tokens, key=lambda t: abs(t - n))
            rows.append([pol["policy"], near, by_tokens[near]])
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, pts in series.items():
        ax.plot([p[0] for p in pts], [p[1] / 1024 for p in pts], label=name)
    ax.set_xlabel("tokens in the sequence (prompt + generated)")
    ax.set_ylabel("resident KV KiB (all layers)")
    ax.set_title("resident KV bytes against length (stories260K, page 16)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "memory.png"), dpi=110)
    plt.close(fig)
    return md_table(["policy", "tokens", "resident KV bytes"], rows), commands


# ---- Speed ----------------------------------------------------------------------------------------

def speed_cpu(r, cfg, prof, available, out_dir, notes):
    """Runs the CPU policy benchmark; returns its table (report_cpu.policy_rows) and commands."""
    b = prof["cpu_bench"]
    chains = []
    for pol in cfg["cpu_speed_policies"]:
        if pol["plugin"] in available:
            chains += ["--chain", pol["chain"]]
        else:
            notes.append(f"CPU speed: `{pol['policy']}` skipped: plugin `{pol['plugin']}` is not in this build")
    policy_json = os.path.join(out_dir, "cpu_policy_bench.json")
    args = [r.bench, "--policy", "--device", "cpu", "--phase", "decode", "--layers", str(b["layers"]),
            "--hq", str(b["hq"]), "--hkv", str(b["hkv"]), "--d", str(b["d"]), "--page", "16", "--dtype", "f32",
            "--ctx", b["ctx"], "--batch", b["batch"], f"--json={policy_json}"] + chains
    pj, commands = {}, []
    try:
        # One thread: timings of a shared 2-core machine stay comparable (no OpenMP barrier waiting
        # on a descheduled thread), as docs/results/policy-step-cpu.md measures.
        _, cmd, _ = r.run(args, "CPU policy benchmark", env={"OMP_NUM_THREADS": "1"})
        commands.append(cmd)
        pj = json.load(open(policy_json))
    except (RuntimeError, OSError, ValueError) as e:
        notes.append(f"CPU speed: policy benchmark failed: {e}")
    finally:
        if os.path.exists(policy_json):
            os.remove(policy_json)  # the numbers are in the README table
    return policy_rows(pj, out_dir), commands


# ---- Assemble -------------------------------------------------------------------------------------

def write_report(a):
    cfg = json.load(open(os.path.join(HERE, "report_config.json")))
    prof = cfg["profiles"][a.profile]
    r = Runner(a.build, a.verbose)
    os.makedirs(a.out, exist_ok=True)
    available = r.plugins()
    date = datetime.date.today().isoformat()
    device = cpu_name()
    notes = []
    t0 = time.time()
    print("decode fidelity ...", file=sys.stderr)
    dec_table, dec_cmds, _ = decode_fidelity(r, cfg, prof, available, a.out, notes)
    print("prefill fidelity (real model) ...", file=sys.stderr)
    pre_table, pre_cmds = prefill_real(r, cfg, prof, available, a.out, notes)
    print("prefill fidelity (synthetic) ...", file=sys.stderr)
    syn_table, syn_cmds = prefill_synthetic(r, cfg, prof, available, a.out, notes, a.synthetic_keys.split())
    longctx_text = longctx_section(a.longctx_json, a.out, notes)
    print("memory ...", file=sys.stderr)
    mem_table, mem_cmds = memory(r, cfg, prof, available, a.out, notes)
    print("CPU speed ...", file=sys.stderr)
    cpu_table, cpu_cmds = speed_cpu(r, cfg, prof, available, a.out, notes)
    suites, policies = load_gpu_results(a.gpu_results)
    gpu_text = speed_gpu(suites, policies, a.out, notes)
    target_rows = targets(cfg, suites, policies)
    findings_path = os.path.join(HERE, "findings.md")
    findings = open(findings_path).read().strip() if os.path.exists(findings_path) else ""

    cmdline = "python3 bench/report/sieve_report.py " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    doc = [
        "# Sieve evaluation report",
        "",
        f"Generated {date} by `{cmdline}` in {time.time() - t0:.0f} s. CPU measurements ran on {device}; "
        "GPU figures come from the JSON files named in their section, with their own device, date and command. "
        f"Model: stories260K (embedded; 5 layers, 8 q / 4 KV heads, head dim 8). Profile `{a.profile}` of "
        "`bench/report/report_config.json`. Plugins found: " + ", ".join(f"`{p}`" for p in sorted(available)) + ".",
        "",
        "Metrics (as `sieve eval` defines them): *recall* = f64 dense softmax mass on the keys the policy attends; "
        "*out rel err* = |o − o_dense| / |o_dense|; *KL* = KL(dense ‖ policy) of the next-token distribution, "
        "teacher-forced on the dense tokens; *top-1* = agreement of the argmax, teacher-forced; *greedy agr.* = "
        "fraction of free-running greedy tokens equal to the dense run's; *attended* = attended / causal keys; "
        "*resident KV* = the policy's resident KV bytes / dense's. Two caveats: recall is measured over the "
        "keys still resident, so for RaaS (which evicts) it reads 1 and the loss shows in KL and agreement; "
        "Delta-KV replaces the attention instead of selecting keys, so its recall/attended read 1 and its x "
        "value is the fraction of keys it keeps (1 − kv_reduction); its output error is the real measure. "
        "DPXA `mode=deltax` attends its kept tiles, some over packed keys: its x value is attended × "
        "(1 − deltax_kv_reduction), the keys it loads.",
        "",
        SECTIONS[0], "",
        f"Decode with every layer's decode chain as listed (prefill dense), {prof['decode_steps']} positions per "
        "prompt from the four built-in prompts, page 16.",
        "", "![decode fidelity](decode_fidelity.png)", "", dec_table, "",
        caption(dec_cmds, device, date),
        SECTIONS[1], "",
        "Prefill of the long prompts in `bench/report/long_prompts.txt` (~350 tokens, stories the model wrote) "
        "through the prefill chain, then dense decode; KL and agreement are those of the decode that follows.",
        "", "![prefill real](prefill_real.png)", "", pre_table, "",
        caption(pre_cmds, device, date),
        SECTIONS[2], "",
        f"`sieve attn --phase prefill` on a synthetic {prof['synthetic']['context']}-token context "
        f"({prof['synthetic']['q_heads']} q / {prof['synthetic']['kv_heads']} KV heads, head dim "
        f"{prof['synthetic']['head_dim']}); keys option: `{a.synthetic_keys or 'default workload'}`.",
        "", "![prefill synthetic](prefill_synthetic.png)", "", syn_table, "",
        caption(syn_cmds, device, date),
        longctx_text,
        SECTIONS[3], "",
        "One `sieve run --ignore-eos --kv-trace` per policy (greedy, the store's bytes in use after every step, "
        "all 5 layers); the table samples the trace.",
        "", "![memory](memory.png)", "", mem_table, "",
        caption(mem_cmds, device, date),
        cpu_section(a.cpu_suite_json, cpu_table, caption(cpu_cmds, device, date), notes),
        SECTIONS[5], "",
        "![GPU decode](speed_gpu_decode.png)", "", "![GPU prefill](speed_gpu_prefill.png)", "",
        gpu_text or "No GPU results were given.", "",
        SECTIONS[6], "",
        "Every speed target of the issues (`targets` in report_config.json) against every matching row of the "
        "GPU policy benchmarks given (x dense = dense step time / policy step time, same run):", "",
        md_table(["issue", "target", "row", "measured", "status", "source"], target_rows) if target_rows
        else "No GPU target was evaluated in this run.",
        "",
        findings,
        "",
        "### What this run skipped or could not measure",
        "",
    ]
    doc += [f"- {n}" for n in notes] or ["- nothing"]
    with open(os.path.join(a.out, "README.md"), "w") as f:
        f.write("\n".join(doc) + "\n")
    print(f"wrote {os.path.join(a.out, 'README.md')} ({len(notes)} notes)", file=sys.stderr)
    return 0


def check(out_dir):
    """The report has every section and every figure, each a real PNG file."""
    problems = []
    readme = os.path.join(out_dir, "README.md")
    text = open(readme).read() if os.path.exists(readme) else ""
    if not text:
        problems.append(f"{readme} is missing or empty")
    for s in SECTIONS:
        if s not in text:
            problems.append(f"README.md lacks the section '{s}'")
    for f in FIGURES:
        p = os.path.join(out_dir, f)
        if not os.path.exists(p):
            problems.append(f"{f} is missing")
        elif open(p, "rb").read(8) != b"\x89PNG\r\n\x1a\n":
            problems.append(f"{f} is not a PNG file")
        elif f"({f})" not in text:
            problems.append(f"README.md does not show {f}")
    if "| dense |" not in text:
        problems.append("the decode table has no dense row")
    for p in problems:
        print(f"sieve_report --check: {p}", file=sys.stderr)
    return 1 if problems else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(SOURCE, "build"), help="the build directory (default: build)")
    ap.add_argument("--out", default=os.path.join(SOURCE, "docs", "report"), help="where README.md and the plots go")
    ap.add_argument("--gpu-results", nargs="+", default=None, metavar="PATH",
                    help="files or directories with sieve_bench JSON files from the GPU machine")
    ap.add_argument("--profile", default="full", choices=["full", "quick"], help="measurement sizes (quick: CI)")
    ap.add_argument("--synthetic-keys", default="--keys similar",
                    help="`sieve attn` options for the synthetic prefill keys (default: realistic adjacent-key "
                         "similarity, core/reference/long_context.hpp)")
    ap.add_argument("--longctx-json", default=DEFAULT_JSON,
                    help="the long-context method table (bench/longctx/method_table.py; "
                         "default: docs/results/longctx.json)")
    ap.add_argument("--update-longctx", action="store_true",
                    help="only rewrite the long-context section of the README in --out from --longctx-json "
                         "(the other sections keep their measurements; no tool runs)")
    ap.add_argument("--cpu-suite-json", default=newest_suite_json(),
                    help="the CPU kernel suite bench/results/cpu_speed.sh wrote (default: the newest "
                         "docs/bench/cpu-2core-*.json)")
    ap.add_argument("--cpu-policy-json", default=DEFAULT_POLICY_JSON,
                    help="with --update-cpu: the CPU policy step (default: docs/results/policy-step-cpu.json, "
                         "bench/results/policy_cpu.sh)")
    ap.add_argument("--update-cpu", action="store_true",
                    help="only rewrite the CPU speed section of the README in --out (and speed_cpu.png) from "
                         "--cpu-suite-json and --cpu-policy-json (the other sections keep their measurements; "
                         "no tool runs)")
    ap.add_argument("--check", metavar="DIR", help="only verify a written report in DIR")
    ap.add_argument("--verbose", action="store_true", help="print each command")
    a = ap.parse_args()
    if a.check:
        return check(a.check)
    if a.update_longctx:
        for n in update_readme(a.out, a.longctx_json, SECTIONS[3]):
            print(f"sieve_report: {n}", file=sys.stderr)
        return 0
    if a.update_cpu:
        try:
            for n in update_cpu_readme(a.out, a.cpu_suite_json, a.cpu_policy_json):
                print(f"sieve_report: {n}", file=sys.stderr)
        except (RuntimeError, OSError, ValueError, KeyError) as e:
            print(f"sieve_report: --update-cpu: {e}", file=sys.stderr)
            return 1
        return 0
    try:
        return write_report(a)
    except RuntimeError as e:
        print(f"sieve_report: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
