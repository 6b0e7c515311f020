"""Shared pieces of the report generator (sieve_report.py and its section modules): running the
built tools with their commands remembered, number and table formatting, figure captions."""
import json
import os
import platform
import shlex
import subprocess
import sys
import time

import matplotlib

matplotlib.use("Agg")  # no display: write PNG files only

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(os.path.dirname(HERE))


class Runner:
    """Runs the built tools, remembering every command so each figure can name its own."""

    def __init__(self, build, verbose):
        self.build = os.path.abspath(build)
        self.sieve = os.path.join(self.build, "bin", "sieve")
        self.bench = os.path.join(self.build, "bin", "sieve_bench")
        self.verbose = verbose
        for tool in (self.sieve, self.bench):
            if not os.access(tool, os.X_OK):
                sys.exit(f"sieve_report: {tool} not found: build the project first (cmake --build {build})")

    def run(self, args, what, env=None):
        shown = " ".join(shlex.quote(a) for a in [os.path.relpath(args[0], SOURCE)] + args[1:])
        if env:
            shown = " ".join(f"{k}={v}" for k, v in env.items()) + " " + shown
        if self.verbose:
            print(f"  $ {shown}", file=sys.stderr)
        t0 = time.time()
        shown = shown.replace(SOURCE + "/", "")  # commands as run from the source tree
        p = subprocess.run(args, capture_output=True, text=True, cwd=SOURCE,
                           env=dict(os.environ, **env) if env else None)
        if p.returncode != 0:
            line = (p.stderr.strip() or p.stdout.strip()).splitlines()
            raise RuntimeError(f"{what}: `{shown}` exited {p.returncode}: {line[-1] if line else ''}")
        return p.stdout, shown, time.time() - t0

    def json(self, args, what):
        out, shown, _ = self.run(args, what)
        return json.loads(out), shown

    def plugins(self):
        data, _ = self.json([self.sieve, "plugins", "--json"], "listing plugins")
        return {p["name"] for p in data.get("plugins", [])}


def fmt(x, digits=4):
    if x is None:
        return "–"
    if isinstance(x, str):
        return x
    if isinstance(x, int):
        return str(x)
    if x != 0 and (abs(x) < 1e-3 or abs(x) >= 1e5):
        return f"{x:.2e}"
    return f"{x:.{digits}f}"


def md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    for r in rows:
        out.append("| " + " | ".join(fmt(c) for c in r) + " |")
    return "\n".join(out)


def caption(commands, device, date, extra=""):
    lines = [f"*Device: {device}; date: {date}.{(' ' + extra) if extra else ''} Produced by:*", "", "```"]
    lines += commands
    lines += ["```", ""]
    return "\n".join(lines)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"CPU {line.split(':', 1)[1].strip()} ({os.cpu_count()} threads)"
    except OSError:
        pass
    return f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} threads)"
