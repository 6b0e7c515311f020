#!/usr/bin/env python3
"""Issue 23's method table: every decode and prefill policy on the long-context model's tasks.

For each (task, context length, method, budget) one `sieve eval --task ... --json` run (dense and
the chain on the same held-out instances): task accuracy (graded tokens right) and exact (instances
all right) of both, with a Wilson 95% interval, and the fidelity metrics sieve eval reports without
its f64 per-call measurement (teacher-forced KL(dense||chain) and top-1 agreement on the task's
tokens, KV bytes, the chain's own metrics: density, kv_reduction, ...). Budgets are fractions
1/F of the context (token_budget, window, packing reduction); the mass-cover prefill (dpxa, deltax)
has no budget knob: it runs at τ calibrated for target recalls, its density is what it reports.

Before the cells: the calibrations the methods need, on instances of another seed than the
table's (calib_seed; never the training seed): `sieve calibrate delta` (Δ-layers),
`sieve calibrate dpxa` (τ per estimator and target), `sieve distill-gate` (the seer gate, CPU).
Cells run --jobs at a time; none starts after --deadline seconds (those left are listed as
skipped in the JSON), so a device call stays in its time.

  method_table.py --sieve build/bin/sieve --out table.json [--device cuda] [--lengths 4096,8192]
                  [--tasks passkey,copy] [--instances 16] [--fractions 4,8,16,32] [--methods a,b]
"""
import argparse
import concurrent.futures as cf
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))

MODEL = "hosts/sieve/models/longctx"
DPXA_TARGETS = (0.5, 0.8, 0.9, 0.95)
DPXA_ESTIMATORS = ("dpxa", "xattn", "stride")
SEER_BLOCK = 64
SINK = 16


RUNNING = set()  # the cells' sieve processes, ended with the table (SIGTERM from a time limit)
RUNNING_LOCK = threading.Lock()
CALIBRATION_PROCS = []  # the calibration tools' processes (Calibration.run)


def run_tracked(cmd):
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with RUNNING_LOCK:
        RUNNING.add(p)
    out, err = p.communicate()
    with RUNNING_LOCK:
        RUNNING.discard(p)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def end_running(signum, frame):
    """SIGTERM (`timeout`): end every sieve process still running and exit; the JSON holds every
    cell done so far (it is rewritten after each)."""
    with RUNNING_LOCK:
        for p in RUNNING:
            p.kill()
    for p in CALIBRATION_PROCS:
        if p.poll() is None:
            p.kill()
    os._exit(124)


def wilson(k, n, z=1.96):
    """95% Wilson score interval of a binomial proportion k/n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, c - h), min(1.0, c + h)]


class Calibration:
    """Files and settings the chains refer to, per context length."""

    def __init__(self, a):
        self.a = a
        self.dir = a.calib_dir or os.path.join(a.work, "calib")
        self.log = []
        self.procs = CALIBRATION_PROCS
        self.delta = {}  # length -> (dense_layers, select_layers)
        self.tau = {}  # (length, estimator, target) -> thresholds file
        self.gate = os.path.join(self.dir, "seer_gate.safetensors")
        self.tau_length = None

    def run(self, cmd, out=None):
        t0 = time.time()
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.procs.append(p)  # stop() ends it if the table is done first
        stdout, stderr = p.communicate()
        self.log.append({"command": " ".join(cmd), "rc": p.returncode, "seconds": round(time.time() - t0, 2),
                         "stderr_tail": stderr[-400:]})
        if p.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {stderr.strip()[-400:]}")
        if out:
            with open(out, "w") as f:
                f.write(stdout)
        return stdout

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()

    def prompts(self, length):
        # Instances 16 tokens short of the length: calibrate delta decodes 16 steps after them.
        return os.path.join(self.dir, f"prompts_{length - 16}.txt")

    def prepare(self, lengths, need):
        a = self.a
        os.makedirs(self.dir, exist_ok=True)
        self.tau_length = a.tau_length
        for L in sorted(set(lengths) | {self.tau_length}):
            if not os.path.exists(self.prompts(L)):
                subprocess.run([sys.executable, os.path.join(HERE, "task_text.py"), "--sieve", a.sieve, "--out-dir",
                                self.dir, "--tasks", a.tasks, "--length", str(L - 16), "--instances",
                                str(a.calib_instances), "--seed", str(a.calib_seed)], check=True, capture_output=True)
        tok = os.path.join(self.dir, "tok256.bin")
        jobs = []
        if "delta" in need:
            for L in lengths:
                jobs.append(("delta", L, None, None))
        if need & {"dpxa", "deltax"}:
            # τ is a share of each row's estimated mass: calibrated at one length (--tau-length: its
            # f64 exact masses cost a quarter of twice the length's), used at every length.
            for e in DPXA_ESTIMATORS:
                for r in DPXA_TARGETS:
                    jobs.append(("dpxa", self.tau_length, e, r))

        def one(job):
            kind, L, e, r = job
            if kind == "delta":
                done = os.path.join(self.dir, f"delta_{L}.json")
                if os.path.exists(done):  # a committed calibration (--calib-dir): used as it is
                    return job, json.load(open(done))
                js = self.run([a.sieve, "calibrate", "delta", "--model", MODEL, "--tokenizer", tok, "--prompts",
                               self.prompts(L), "--steps", "16", "--dense", "1", "--select", "2", "--device", a.device,
                               "--json"],
                              os.path.join(self.dir, f"delta_{L}.json"))
                return job, json.loads(js)
            if kind == "dpxa":
                f = os.path.join(self.dir, f"tau_{e}_r{int(round(r * 100))}_{L}.txt")
                if os.path.exists(f):
                    return job, f
                self.run([a.sieve, "calibrate", "dpxa", "--model", MODEL, "--tokenizer", tok, "--prompts",
                          self.prompts(L), "--estimator", e, "--target", str(r), "--device", a.device,
                          "--out", f])
                return job, f

        with cf.ThreadPoolExecutor(max_workers=a.jobs) as ex:
            for job, res in ex.map(one, jobs):
                kind, L, e, r = job
                if kind == "delta":
                    self.delta[L] = (res["dense_layers"], res["select_layers"])
                else:
                    for length in lengths:
                        self.tau[(length, e, r)] = res

    def make_gate(self):
        """The seer gate (`sieve distill-gate`, CPU) unless the file is there: run beside the other
        cells, the seer cells wait for it."""
        a = self.a
        if not os.path.exists(self.gate):
            os.makedirs(self.dir, exist_ok=True)
            self.run([a.sieve, "distill-gate", "--model", MODEL, "--out", self.gate, "--block", str(SEER_BLOCK),
                      "--tokens", str(a.gate_tokens), "--sequences", str(a.gate_sequences), "--held-out", "4",
                      "--steps", str(a.gate_steps)], os.path.join(self.dir, "seer_gate.log"))


def plugin_schema(sieve, name):
    """{parameter: (type, enum choices or None)} from `sieve plugins NAME`."""
    r = subprocess.run([sieve, "plugins", name], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    params, inside = {}, False
    for line in r.stdout.splitlines():
        if line.startswith("  parameters"):
            inside = True
        elif inside and line.startswith("    ") and not line.strip().startswith("("):
            f = line.split()
            m = re.search(r"\{([a-z0-9_|]+)\}", line)
            params[f[0]] = (f[1], m.group(1).split("|") if m and f[1] == "enum" else None)
        elif inside and not line.startswith("    "):
            inside = False
    return params


def chain_problems(sieve, chains):
    """Every policy and parameter name of the chains against the plugins' schemas, and every enum
    value against its choices: the problems, one line each (none: all chains are well-formed)."""
    schemas, problems = {}, []
    for chain in sorted(set(chains)):
        for rule in chain.split(";"):
            body = rule.split("=", 1)[1] if re.match(r"^\s*(\w+:)?[*0-9,-]+=", rule) else rule
            for item in re.findall(r"([a-z0-9_]+)(?:@\w+)?(?:\(([^()]*)\))?", body):
                name, args = item
                if name not in schemas:
                    schemas[name] = plugin_schema(sieve, name)
                if schemas[name] is None:
                    problems.append(f"{chain}: no plugin '{name}'")
                    continue
                for kv in re.findall(r"([a-z_0-9]+)=(\[[^\]]*\]|[^,]+)", args):
                    key, value = kv
                    if key not in schemas[name]:
                        problems.append(f"{chain}: {name} has no parameter '{key}' "
                                        f"(has {', '.join(sorted(schemas[name]))})")
                    elif schemas[name][key][1] and value not in schemas[name][key][1]:
                        problems.append(f"{chain}: {name}.{key}={value} is not one of {schemas[name][key][1]}")
    return problems


def tau_summary(path):
    """Mean calibrated recall and density over a thresholds file's (layer, head) comments."""
    rec, den = [], []
    for line in open(path):
        m = re.search(r"recall ([0-9.]+) density ([0-9.]+)", line)
        if m:
            rec.append(float(m.group(1)))
            den.append(float(m.group(2)))
    return {"recall": sum(rec) / len(rec), "density": sum(den) / len(den)} if rec else None


def int_list(xs):
    return "[" + ",".join(str(int(x)) for x in xs) + "]"


def decode_cells(L, F, cal, methods):
    """(method, budget label, chain, device override) of the decode policies at budget L/F."""
    K = L // F
    out = [("streaming", f"decode:*=streaming(sink={SINK},window={K - SINK})"),
           ("quest", f"decode:*=quest(token_budget={K})"),
           ("quest gqa_share", f"decode:*=quest(token_budget={K},gqa_share=true)"),
           ("raas", f"*=raas(token_budget={K})"),
           ("raas prefill_policy=quest", f"*=raas(token_budget={K},prefill_policy=quest,prefill_budget={K})")]
    if "delta" in methods:
        dl, sl = cal.delta[L]
        out.append(("delta", f"decode:*=delta(token_budget={K},dense_layers={int_list(dl)},"
                             f"select_layers={int_list(sl)})"))
        # The sparsest DELTA: layer 0 the only full-attention (Δ) layer, its selection reused by the rest.
        out.append(("delta select_layers=[0]", f"decode:*=delta(token_budget={K},dense_layers=[],select_layers=[0])"))
    if "seer" in methods:
        out.append(("seer", f"decode:*=seer(weights={cal.gate},block={SEER_BLOCK},token_budget={K})"))
    out.append(("seer oracle", f"decode:*=seer(mode=oracle,block={SEER_BLOCK},token_budget={K})"))
    return [(m, "decode", F, c) for m, c in out]


def prefill_cells(L, F, cal, methods):
    K = L // F
    red = 1 - 1 / F
    out = [("streaming prefill", f"prefill:*=streaming(sink={SINK},window={K - SINK})"),
           ("streaming prefill + delta_correction",
            f"prefill:*=streaming(sink={SINK},window={K - SINK})>delta_correction(gamma=64)"),
           ("deltakv periodic", f"prefill:*=deltakv(packing=periodic,reduction={red},report=on)"),
           ("deltakv random", f"prefill:*=deltakv(packing=random,reduction={red},report=on)")]
    return [(m, "prefill", F, c) for m, c in out]


def unbudgeted_cells(L, cal, methods):
    """Prefill methods without a budget knob: dpxa / deltax at calibrated τ, Delta-KV and its ablations."""
    out = []
    if methods & {"dpxa", "deltax"}:
        for e in DPXA_ESTIMATORS:
            for r in DPXA_TARGETS:
                out.append((f"dpxa {e}", f"r={r}", f"prefill:*=dpxa(estimator={e},thresholds={cal.tau[(L, e, r)]})"))
        for r in DPXA_TARGETS:
            out.append(("deltax", f"r={r}", f"prefill:*=dpxa(mode=deltax,thresholds={cal.tau[(L, 'dpxa', r)]})"))
    kv = "prefill:*=deltakv(report=on{})"
    out += [("deltakv", "default", kv.format("")),
            ("deltakv phase2=off", "default", kv.format(",phase2=off")),
            ("deltakv phase2=only", "default", kv.format(",phase2=only")),
            ("deltakv count_weighting=false", "default", kv.format(",count_weighting=false"))]
    return [(m, "prefill", b, c) for m, b, c in out]


def matched_cells(reduction):
    red = round(reduction, 4)
    return [(f"deltakv {k} matched", "prefill", f"reduction={red}",
             f"prefill:*=deltakv(packing={k},reduction={red},report=on)") for k in ("periodic", "random")]


def cell_device(a, method):
    return "cpu" if method == "seer oracle" else a.device  # the oracle is CPU only (seer's validate)


def wanted(method, methods):
    return method.split(" ")[0] in methods or method in methods


def run_cell(a, task, L, method, phase, budget, chain):
    device = cell_device(a, method)
    n = a.oracle_instances if method == "seer oracle" and a.oracle_instances else a.instances
    cmd = [a.sieve, "eval", "--model", MODEL, "--task", task, "--length", str(L), "--instances", str(n),
           "--seed", str(a.seed), "--device", device, "--no-attention-metrics", "--json", "--chain", chain]
    t0 = time.time()
    r = run_tracked(cmd)
    row = {"task": task, "length": L, "method": method, "phase": phase, "chain": chain, "device": device,
           "command": "sieve " + " ".join(cmd[1:]), "seconds": round(time.time() - t0, 2)}
    if isinstance(budget, int):
        row.update({"fraction": budget, "token_budget": L // budget})
    else:
        row["setting"] = budget
    if r.returncode != 0:
        row["error"] = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"rc {r.returncode}"
        return row
    j = json.loads(r.stdout)
    d, c = j["task"]["dense"], j["task"]["chain"]
    row.update({
        "dense": d, "chain_score": c,
        "chain_accuracy_ci95": wilson(c["accuracy"] * c["graded"], c["graded"]),
        "chain_exact_ci95": wilson(c["exact"] * c["instances"], c["instances"]),
        "kl_mean": j["teacher_forced"]["kl_mean"], "kl_max": j["teacher_forced"]["kl_max"],
        "top1_agreement": j["teacher_forced"]["top1_agreement"], "kv_bytes": j["kv_bytes"],
        "metrics": {k: v.get("mean") for k, v in (j.get("metrics") or {}).items()},
        "resident_fraction": [l["resident_fraction"] for l in j["layers"]],
    })
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sieve", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--lengths", default="4096,8192")
    ap.add_argument("--tasks", default="passkey,copy")
    ap.add_argument("--instances", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1000)
    ap.add_argument("--calib-seed", type=int, default=2000)
    ap.add_argument("--calib-instances", type=int, default=2, help="per task")
    ap.add_argument("--fractions", default="4,8,16,32")
    ap.add_argument("--methods", default="streaming,quest,raas,delta,seer,dpxa,deltax,deltakv",
                    help="first words of the methods to run (e.g. 'quest,seer')")
    ap.add_argument("--tau-length", type=int, default=4096, help="context length the dpxa τ are calibrated at")
    ap.add_argument("--gate-tokens", type=int, default=2048)
    ap.add_argument("--gate-sequences", type=int, default=16)
    ap.add_argument("--gate-steps", type=int, default=300)
    ap.add_argument("--jobs", type=int, default=1, help="cells at once on --device")
    ap.add_argument("--cpu-jobs", type=int, default=1, help="CPU-only cells (seer oracle) at once beside them")
    ap.add_argument("--oracle-instances", type=int, default=0, help="instances of the CPU oracle (0: --instances)")
    ap.add_argument("--deadline", type=float, default=1e9, help="seconds after which no cell starts")
    ap.add_argument("--calib-dir", default="",
                    help="calibration files: those present are used as they are, the others made there "
                         "(default: WORK/calib)")
    ap.add_argument("--calibrate-only", action="store_true", help="make the calibrations and stop")
    ap.add_argument("--check-chains", action="store_true",
                    help="only check every cell's chain string against the plugins' schemas (a syntax check, run by ctest: calibrated values are stand-ins, no cell runs)")
    ap.add_argument("--stop", type=float, default=0,
                    help="seconds after which a calibration still running (the seer gate) is ended "
                         "(0: when the last cell is done)")
    ap.add_argument("--require-ok", action="store_true", help="exit 1 when a cell failed or was skipped (CI)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, end_running)
    t0 = time.time()
    a.work = a.work or os.path.dirname(os.path.abspath(a.out))
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    lengths = [int(x) for x in a.lengths.split(",")]
    fractions = [int(x) for x in a.fractions.split(",")]
    methods = set(a.methods.split(","))
    cal = Calibration(a)
    if a.check_chains:
        cal.delta = {L: ([0], [1]) for L in lengths}
        cal.tau = {(L, e, r): f"tau_{e}_{r}.txt" for L in lengths for e in DPXA_ESTIMATORS for r in DPXA_TARGETS}
        cal.gate = "gate.safetensors"
    else:
        cal.prepare(lengths, methods)
        if a.calibrate_only:
            if "seer" in methods:
                cal.make_gate()
            json.dump(cal.log, open(os.path.join(cal.dir, "calibration_log.json"), "w"), indent=1)
            print(f"calibrations in {cal.dir} ({time.time() - t0:.0f} s)")
            return
    t_cal = time.time() - t0
    cells = []
    for L in sorted(lengths, reverse=True):  # the training length first
        for task in a.tasks.split(","):
            for F in fractions:
                if L // F < 32:
                    continue
                cells += [(task, L) + c for c in decode_cells(L, F, cal, methods) + prefill_cells(L, F, cal, methods)]
            cells += [(task, L) + c for c in unbudgeted_cells(L, cal, methods)]
    cells = [c for c in cells if wanted(c[2], methods)]
    problems = chain_problems(a.sieve, [c[5] for c in cells])
    if problems:
        sys.exit("method_table.py: chains that do not match the plugins' schemas:\n  " + "\n  ".join(problems))
    if a.check_chains:
        print(f"{len(cells)} cells, {len(set(c[5] for c in cells))} chains: every name and enum value is in the schemas")
        return
    rows, skipped = [], []
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    device_name = platform.processor() or platform.machine()
    if a.device.startswith("cuda"):
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True) if shutil.which("nvidia-smi") else None
        device_name = smi.stdout.strip().splitlines()[0] if smi and smi.returncode == 0 and smi.stdout.strip() else "?"
    # The CPU-only oracle gets its own pool beside the device's, so both run at once; the cells that
    # wait for something (the seer gate, Delta-KV's measured reduction) get a third, so they do not
    # queue behind every other cell.
    pools = {"device": cf.ThreadPoolExecutor(max_workers=a.jobs),
             "cpu": cf.ThreadPoolExecutor(max_workers=a.cpu_jobs),
             "later": cf.ThreadPoolExecutor(max_workers=2)}
    lock = threading.RLock()
    pending = []
    seer = [c for c in cells if c[2] == "seer"]
    seer_launched = []

    def save():
        """The JSON as it stands (after every cell: a device call's time limit keeps what was done)."""
        out = {"model": MODEL, "device": a.device, "device_name": device_name, "date": date, "instances": a.instances,
               "oracle_instances": a.oracle_instances or a.instances, "seed": a.seed,
               "calib_seed": a.calib_seed, "lengths": lengths, "fractions": fractions,
               "command": " ".join(sys.argv), "calibration": {
                   "seconds": round(t_cal, 1), "delta_layers": {str(L): v for L, v in cal.delta.items()},
                   "dpxa_thresholds": {f"{L} {e} {r}": os.path.basename(f) for (L, e, r), f in cal.tau.items()},
                   "seer_gate": cal.gate and os.path.basename(cal.gate), "runs": cal.log},
               "seconds": round(time.time() - t0, 1), "rows": rows, "skipped": skipped}
        with open(a.out + ".tmp", "w") as f:
            json.dump(out, f, indent=1)
        os.replace(a.out + ".tmp", a.out)

    def record(c, r):
        with lock:
            if r is None:
                skipped.append({"task": c[0], "length": c[1], "method": c[2], "chain": c[5]})
                return
            # The mass-cover prefill reports its density on the CPU only: the calibration's stands beside it.
            for f in cal.tau.values():
                if f in r["chain"]:
                    r["calibrated"] = dict(tau_summary(f) or {}, length=cal.tau_length)
            rows.append(r)
            save()
            print(f"[{time.time() - t0:6.1f} s] {r['task']} {r['length']} {r['method']} "
                  f"{r.get('fraction', r.get('setting'))}: "
                  + (f"error {r['error']}" if "error" in r else
                     f"acc {r['chain_score']['accuracy']:.3f} exact {r['chain_score']['exact']:.3f} "
                     f"(dense {r['dense']['accuracy']:.3f}) KL {r['kl_mean']:.3g} {r['seconds']} s"), flush=True)
            # Periodic and random packing at the reduction Delta-KV's threshold reached on the same instances.
            if r["method"] == "deltakv" and "error" not in r and r["metrics"].get("kv_reduction") is not None:
                launch([(r["task"], r["length"]) + m for m in matched_cells(r["metrics"]["kv_reduction"])], "later")

    def task(c):
        record(c, run_cell(a, *c) if time.time() - t0 < a.deadline else None)

    def launch(batch, pool=None):
        with lock:
            for c in batch:
                name = pool or ("cpu" if cell_device(a, c[2]) == "cpu" and a.device != "cpu" else "device")
                pending.append(pools[name].submit(task, c))

    def gate_job():
        try:
            cal.make_gate()
        except RuntimeError as e:  # its command and stderr are in calibration.runs
            print(f"seer gate: {e}", flush=True)
            return
        if time.time() - t0 < a.deadline:
            seer_launched.append(True)
            launch(seer, "later")

    save()  # a JSON from the start, even if the time limit ends the run before the first cell
    gate = threading.Thread(target=gate_job, daemon=True)
    if seer:
        gate.start()
    launch([c for c in cells if c[2] != "seer"])
    while True:  # until no cell is pending and none can come (the gate done, or the deadline passed)
        with lock:
            fs = list(pending)
        cf.wait(fs)
        if gate.is_alive():
            gate.join(timeout=max(0.0, a.deadline - (time.time() - t0)))
        with lock:
            if len(pending) == len(fs) and (not gate.is_alive() or time.time() - t0 >= a.deadline):
                break
    for p in pools.values():
        p.shutdown()
    if seer and gate.is_alive():  # let the gate finish for the next run (calib dir) until --stop
        gate.join(timeout=max(0.0, a.stop - (time.time() - t0)))
    if seer and not seer_launched:
        rows.extend(dict(task=c[0], length=c[1], method=c[2], phase=c[3], chain=c[5],
                         error="no seer gate before the deadline (calibration.runs)") for c in seer)
    cal.stop()  # a gate still distilling past --stop
    save()
    print(f"{len(rows)} rows ({sum('error' in r for r in rows)} errors), {len(skipped)} skipped, "
          f"{time.time() - t0:.0f} s -> {a.out}")
    if a.require_ok and (skipped or any("error" in r for r in rows)):
        sys.exit("method_table.py: " + "; ".join(r["error"] for r in rows if "error" in r) + f" ({len(skipped)} skipped)")


if __name__ == "__main__":
    main()
