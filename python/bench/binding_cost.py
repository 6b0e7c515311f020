#!/usr/bin/env python3
"""The Python binding's own cost per layer call: Session.attend() against the bare
sieve_session_attend call on the same prebuilt inputs, interleaved on one session so both see the
same contexts (one decode token of a 1-layer geometry per call: the kernel is small, the host side
dominates). binding = median(attend) - median(bare), in microseconds of host time per call.
"attend" is the default path (on CUDA: tensors exported for the session's stream, one stream
synchronisation per call), "attend_ready" passes ready=True (no synchronisation).
python_side = attend() with the C call replaced by a no-op (the binding's own work alone: where
the bare call's time is large and noisy, e.g. the CPU kernel over a growing context, this is the
steadier figure); on CUDA also for a session on its own stream (the synchronisation is then an
event torch records and the session's stream waits for, once per call).

    binding_cost.py [--device cuda] [--calls 2000] [--json out.json] [--limit-us 50]

Exit status 1 when the binding's cost is over --limit-us.
"""
import argparse
import ctypes as C
import json
import statistics
import sys
import time

import sieve
from sieve import _capi, _dlpack


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json")
    ap.add_argument("--limit-us", type=float, default=50.0)
    a = ap.parse_args()
    import torch
    hq, hkv, d = 32, 8, 64  # a 1B Llama layer
    stream = torch.cuda.current_stream() if a.device.startswith("cuda") else None
    s_runtime = sieve.Runtime()
    s = sieve.Session(s_runtime, n_layers=1, n_q_heads=hq, n_kv_heads=hkv, head_dim=d,
                      max_seq_len=2 * a.calls + 64, kv_dtype=torch.bfloat16, device=a.device, cuda_stream=stream,
                      check_outputs=False)
    seq = s.add_sequence()
    x = lambda rows, h: torch.randn(rows, h, d, dtype=torch.bfloat16, device=a.device)  # noqa: E731
    q, k, v = x(32, hq), x(32, hkv), x(32, hkv)
    out = torch.empty_like(q)
    s.attend(0, "prefill", q, k, v, out, seq)
    q1, k1, v1, o1 = x(1, hq), x(1, hkv), x(1, hkv), torch.empty(1, hq, d, dtype=torch.bfloat16, device=a.device)
    # The bare call: inputs built once, capsules kept alive.
    keep = [_dlpack.export(t, -1 if stream is not None else None) for t in (q1, k1, v1, o1)]
    ids, qo = (C.c_int32 * 1)(seq), (C.c_int32 * 2)(0, 1)
    bare_in = _capi.new(_capi.LayerInputs, layer=0, phase=_capi.PHASE_DECODE, batch=1, seq_ids=ids, qo_indptr=qo,
                        q=keep[0][1], k=keep[1][1], v=keep[2][1])
    out_ptr, attend, h = keep[3][1], _capi.lib.sieve_session_attend, s._h
    timings = {"attend": [], "attend_ready": [], "bare": []}
    clock = time.perf_counter_ns
    for i in range(a.calls // 3):
        for name in timings:
            t0 = clock()
            if name == "bare":
                st = attend(h, C.byref(bare_in), out_ptr)
            else:
                s.attend(0, "decode", q1, k1, v1, o1, seq, ready=(name == "attend_ready"))
                st = 0
            timings[name].append((clock() - t0) / 1000.0)
            assert st == 0, _capi.lib.sieve_session_last_error(h)
            s.end_step("decode", seq)
    s.synchronize()
    stub = lambda *args: 0  # noqa: E731  the binding's own work: everything but the C call
    s._attend = stub
    sessions = {"attend": (s, False), "attend_ready": (s, True)}
    if stream is not None:  # a session on its own stream: torch records an event and the session's stream waits
        own = sieve.Session(s_runtime, n_layers=1, n_q_heads=hq, n_kv_heads=hkv, head_dim=d, max_seq_len=64,
                            kv_dtype=torch.bfloat16, device=a.device, check_outputs=False)
        own._attend = stub
        sessions["attend_own_stream"] = (own, False)
    python_side = {name: [] for name in sessions}
    for i in range(a.calls // 2):
        for name, (session, ready) in sessions.items():
            t0 = clock()
            session.attend(0, "decode", q1, k1, v1, o1, seq, ready=ready)
            python_side[name].append((clock() - t0) / 1000.0)
    med = {name: statistics.median(t) for name, t in timings.items()}
    result = {"device": a.device, "calls_each": len(timings["bare"]), "median_us": med,
              "binding_us": med["attend"] - med["bare"], "binding_ready_us": med["attend_ready"] - med["bare"],
              "python_side_us": {name: statistics.median(t) for name, t in python_side.items()},
              "torch": torch.__version__, "python": sys.version.split()[0]}
    if stream is not None:
        result["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(result, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    worst = max(result["binding_us"], result["binding_ready_us"])
    if worst > a.limit_us:
        print("binding cost %.1f us per call is over %.0f us" % (worst, a.limit_us))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
