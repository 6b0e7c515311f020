#!/usr/bin/env python3
"""GPU diagnostic for gpu/h-py.sh: which part of a torch + Sieve process aborts or crashes
(binding_cost.py ended with "free(): invalid pointer", rc 134; python.pytest segfaulted in
sieve_session_create at the first delta chain). Each case runs in its own child process and prints
a flushed marker before every stage, so the last marker names the stage that died:

  dense         Runtime(), a CUDA dense session on torch's stream, the runtime destroyed right after
                the session is made (binding_cost.py's Runtime is a temporary), attend, destroy
                the session before exit (binding_cost.py's main returns)
  dense-ordered the same, the runtime destroyed after the session
  delta         dense-ordered with decode:*=delta(...) (the plugin that used to link libsieve_cli)
  delta+tools   delta with the delta tool module (libsieve_cli, libsieve_runtime) dlopened into
                the process first: the old plugin's dependencies, back in a torch process
  no-deepbind   dense, with the runtime loaded without RTLD_DEEPBIND

    h-py-teardown.py BUILD_DIR      (PYTHONPATH must name BUILD_DIR/python)
"""
import ctypes
import os
import subprocess
import sys

CASES = ["dense", "delta+tools", "delta", "no-deepbind", "dense-ordered"]  # most telling first


def mark(text):
    print("  stage:", text, flush=True)


def child(case, build):
    if case == "no-deepbind" and hasattr(os, "RTLD_DEEPBIND"):
        del os.RTLD_DEEPBIND  # sieve._capi reads it with getattr(os, "RTLD_DEEPBIND", 0)
    mark("import torch")
    import torch
    torch.zeros(1, device="cuda")
    if case == "delta+tools":
        mark("dlopen the delta tool module")
        ctypes.CDLL(os.path.join(build, "lib/sieve/tools/libsieve_delta_tools.so"), mode=ctypes.RTLD_LOCAL)
    mark("import sieve")
    import sieve
    mark("Runtime()")
    rt = sieve.Runtime(plugin_dirs=[os.path.join(build, "lib/sieve/plugins")], use_env=False, use_default_dirs=False)
    chain = "decode:*=delta(token_budget=48,recent=16)" if case.startswith("delta") else None
    mark("Session(chain=%s)" % chain)
    s = sieve.Session(rt, n_layers=4, n_q_heads=32, n_kv_heads=8, head_dim=64, max_seq_len=512, kv_dtype=torch.bfloat16,
                      device="cuda", chain=chain, cuda_stream=torch.cuda.current_stream())
    if case in ("dense", "no-deepbind"):
        mark("runtime destroy (session alive)")
        rt.close()
    seq = s.add_sequence()
    x = lambda rows, h: torch.randn(rows, h, 64, dtype=torch.bfloat16, device="cuda")  # noqa: E731
    for phase, rows in (("prefill", 200), ("decode", 1), ("decode", 1)):
        mark("attend %s" % phase)
        q = x(rows, 32)
        out = torch.empty_like(q)
        for layer in range(4):
            s.attend(layer, phase, q, x(rows, 8), x(rows, 8), out, seq)
        s.end_step(phase, seq)
    torch.cuda.synchronize()
    mark("session destroy")
    s.close()
    if rt._h:
        mark("runtime destroy")
        rt.close()
    mark("interpreter exit")


def main():
    if len(sys.argv) == 3:
        child(sys.argv[2], sys.argv[1])
        return 0
    build = os.path.abspath(sys.argv[1])
    for case in CASES:
        try:
            p = subprocess.run([sys.executable, "-X", "faulthandler", __file__, build, case], capture_output=True,
                               text=True, timeout=30)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            print("%-13s timed out after 30 s, last stage: %s" % (case, out.strip().splitlines()[-1:] or "-"))
            continue
        stages = [line for line in p.stdout.splitlines() if "stage:" in line]
        print("%-13s rc=%d, last stage: %s" % (case, p.returncode, stages[-1].split("stage:")[1] if stages else "-"))
        for line in (p.stderr.strip().splitlines() or [])[-6:]:
            print("    " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
