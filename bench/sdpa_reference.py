#!/usr/bin/env python3
"""PyTorch SDPA on the shapes the Sieve attention benchmark asks for (bench/, `sieve bench --sdpa`).

Input (--cases FILE): a JSON list of {shape, phase, n_q_heads, n_kv_heads, head_dim, batch,
context, dtype, samples}. Decode is one query token per sequence over `context` cached keys;
prefill is a causal `context`-token prompt. K/V are contiguous [batch, n_kv_heads, context,
head_dim] (SDPA has no paged layout). Each shape is timed with every backend variant that runs:
GQA through enable_gqa=True (default dispatch without the math backend, and each fused backend
alone), and K/V repeated to n_q_heads outside the timed region (flash), when that fits in memory.
Timing: CUDA events over CUDA-graph replays (eager calls if capture fails) after warm-up, the
median of `samples`; random normal inputs, never zeros.

Output (stdout): {"meta": {...}, "results": {shape: {"variants": {name: {"ms": m} or
{"error": e}}}}}. Progress goes to stderr.
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

FUSED = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
MIN_SAMPLE_MS = 1.0
REPEAT_LIMIT_BYTES = 16 << 30  # repeated K/V larger than this is not tried


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def time_call(fn, samples):
    """Median ms of one call: graph replays of `reps` calls, timed with CUDA events."""
    fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    reps = max(1, min(256, math.ceil(MIN_SAMPLE_MS / max(start.elapsed_time(stop), 1e-3))))
    run = None
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(reps):
                fn()
        run = graph.replay
        mode = "graph"
    except Exception:  # some backends do not capture: time eager calls instead
        torch.cuda.synchronize()

        def run():
            for _ in range(reps):
                fn()

        mode = "eager"
    run()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / reps)
    times.sort()
    return times[len(times) // 2], mode, reps


def variants(case):
    """(name, backends, use enable_gqa, repeat K/V) to try for a case."""
    out = [("gqa:fused-default", FUSED, True, False)]
    for b in FUSED:
        out.append(("gqa:" + b.name.lower(), [b], True, False))
    out.append(("repeat-kv:flash_attention", [SDPBackend.FLASH_ATTENTION], False, True))
    return out


def run_case(case):
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[case["dtype"]]
    b, hq, hkv, d, ctx = case["batch"], case["n_q_heads"], case["n_kv_heads"], case["head_dim"], case["context"]
    prefill = case["phase"] == "prefill"
    nq = ctx if prefill else 1
    gen = torch.Generator(device="cuda").manual_seed(1234)
    q = torch.randn(b, hq, nq, d, device="cuda", dtype=dt, generator=gen)
    k = torch.randn(b, hkv, ctx, d, device="cuda", dtype=dt, generator=gen)
    v = torch.randn(b, hkv, ctx, d, device="cuda", dtype=dt, generator=gen)
    results = {}
    for name, backends, gqa, repeat in variants(case):
        kk, vv = k, v
        try:
            if repeat:
                if 2 * k.numel() * (hq // hkv) * k.element_size() > REPEAT_LIMIT_BYTES:
                    results[name] = {"error": "repeated K/V would exceed %d GiB" % (REPEAT_LIMIT_BYTES >> 30)}
                    continue
                kk = k.repeat_interleave(hq // hkv, dim=1)
                vv = v.repeat_interleave(hq // hkv, dim=1)

            def fn(kk=kk, vv=vv, backends=backends, gqa=gqa):
                with sdpa_kernel(backends):
                    return F.scaled_dot_product_attention(q, kk, vv, is_causal=prefill, enable_gqa=gqa)

            out = fn()
            if not torch.isfinite(out.float()).all():
                results[name] = {"error": "non-finite output"}
                continue
            ms, mode, reps = time_call(fn, case.get("samples", 10))
            results[name] = {"ms": ms, "timing": mode, "calls_per_sample": reps}
            log("  %-28s %10.1f us (%s)" % (name, ms * 1e3, mode))
        except Exception as e:  # a backend that does not take this shape
            msg = str(e).strip().splitlines()
            results[name] = {"error": msg[0][:300] if msg else type(e).__name__}
        finally:
            del kk, vv
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", required=True, help="JSON list of shapes (written by the benchmark)")
    args = ap.parse_args()
    with open(args.cases) as f:
        cases = json.load(f)
    if not torch.cuda.is_available():
        print(json.dumps({"meta": {"error": "torch sees no CUDA device"}, "results": {}}))
        return 1
    meta = {"torch": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
            "cudnn": torch.backends.cudnn.version()}
    results = {}
    for case in cases:
        log("sdpa %s" % case["shape"])
        results[case["shape"]] = {"variants": run_case(case)}
    print(json.dumps({"meta": meta, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
