#!/usr/bin/env python3
"""Drive the Sieve runtime from Python with the installed `sieve` package (numpy tensors).

    PYTHONPATH=<prefix>/lib/sieve/python python3 sieve_host.py [--plugin-dir DIR] [--chain SPEC]

Lists the plugins with their parameters, builds a session for a small 1-layer geometry with the
chain, prefills one sequence of 20 random tokens and decodes 4 more, and checks every output
against a float64 softmax attention over the same keys (the dense chain must match it within
1e-4; any chain must be finite). Exit status 0 on success. Run by the SDK test (tests/sdk) against
the install, so the installed package and the library it finds are what is tested.
"""
import argparse
import math
import sys

import numpy as np

import sieve

HQ, HKV, D = 4, 2, 8


def reference(q, keys, values, base):
    """Causal attention of q's rows (positions base, base+1, ...) over keys/values, float64."""
    out = np.zeros(q.shape)
    for t in range(q.shape[0]):
        for h in range(HQ):
            kk, vv = keys[:base + t + 1, h // (HQ // HKV)], values[:base + t + 1, h // (HQ // HKV)]
            w = np.exp(kk @ q[t, h] / math.sqrt(D) - (kk @ q[t, h] / math.sqrt(D)).max())
            out[t, h] = w @ vv / w.sum()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugin-dir", action="append", default=[])
    ap.add_argument("--chain")
    a = ap.parse_args()
    rt = sieve.Runtime(plugin_dirs=a.plugin_dir)
    for p in rt.plugins():
        print("plugin %-18s ABI %d.%d, parameters: %s" % (p.name, p.abi[0], p.abi[1],
                                                         ", ".join(x.name for x in p.params) or "-"))
    s = sieve.Session(rt, n_layers=1, n_q_heads=HQ, n_kv_heads=HKV, head_dim=D, max_seq_len=64, chain=a.chain)
    print("chain", s.chain or "(dense)", "on KV store", s.kv_store)
    seq = s.add_sequence()
    rng = np.random.default_rng(5)
    keys, values = np.zeros((0, HKV, D)), np.zeros((0, HKV, D))
    worst = 0.0
    for step, n in enumerate([20, 1, 1, 1, 1]):
        q, k, v = (rng.uniform(-1, 1, (n, h, D)).astype(np.float32) for h in (HQ, HKV, HKV))
        out = np.full((n, HQ, D), np.nan, np.float32)
        phase = "prefill" if step == 0 else "decode"
        s.attend(0, phase, q, k, v, out, seq)
        s.end_step(phase, seq)
        base = len(keys)
        keys, values = np.concatenate([keys, k]), np.concatenate([values, v])
        if not np.isfinite(out).all():
            sys.exit("non-finite output at step %d" % step)
        worst = max(worst, float(np.abs(out - reference(q, keys, values, base)).max()))
    print("max |out - float64 reference| = %.3e over %d tokens" % (worst, len(keys)))
    if not a.chain and worst > 1e-4:
        sys.exit("dense attention differs from the reference")
    print("PASS")


if __name__ == "__main__":
    main()
