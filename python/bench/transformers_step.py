#!/usr/bin/env python3
"""Decode step time of a random-weight Llama 3.2 1B-geometry model in transformers: its `sdpa`
attention (DynamicCache) against Sieve dense and Sieve quest, with the attention's share of the
step and its host time. Context is filled without a model prefill (it would not be timed anyway):
the sdpa cache gets random K/V per layer, the Sieve cache gets the same through its prefill path
with a cheap prefill chain (streaming, window 64: the K/V appended are all of them, the decode
chain is what is timed).

    transformers_step.py --ctx 8192,32768 --batch 8,1 --json out.json --markdown out.md
    step_table.py out.json > table.md             the table again from the JSON

Step = model(next_token, past_key_values=cache) from launch to torch.cuda.synchronize(), median
of --steps after --warmup, in each of --passes passes. Attention = the sum over layers of
CUDA-event intervals around the attention function (for sdpa: transformers'
sdpa_attention_forward; for Sieve: the whole layer call through the binding); attention host =
the sum over layers of perf_counter() around the same call (what it costs the CPU to issue it:
the step is host-bound, so host time adds to the step directly).

Order: each configuration runs its methods in METHODS order, then (pass 2) in reverse order,
each on a freshly filled cache, so a method that pays for coming first (or after another) shows
it as a difference between its passes (the JSON keeps each pass's median; the table gives the
median over all passes and the two passes side by side). Each run starts a few tokens past the
previous one (context = ctx + up to ~1.5%), so no run decodes over key lengths an earlier one
did, except where METHODS says so. "sdpa (untimed)" is transformers' own "sdpa" implementation
with no timer: against the timed copy it shows what the timer costs.
"""
import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import AttentionInterface

import sieve.transformers as st
from sieve.transformers import _attention
from step_table import table

PREFILL_FILL = "prefill:*=streaming(sink=4,window=64)"
# name: the Sieve chain, or None for transformers' sdpa (DynamicCache). Every run decodes over
# context lengths no earlier run of the process decoded over (each starts a few tokens further),
# as one generate() does, except "sdpa (lengths seen)", which first runs the same lengths once,
# unmeasured: the pair shows what sdpa pays per new key length (a per-shape plan, e.g. cuDNN's,
# built on first sight); "sdpa (no cuDNN)" excludes cuDNN's SDPA backend to say whether that is it.
METHODS = {"sdpa (untimed)": None, "sdpa": None, "sdpa (lengths seen)": None, "sdpa (no cuDNN)": None,
           "sieve dense": PREFILL_FILL + "; decode:*=dense",
           "sieve quest(token_budget=2048)": PREFILL_FILL + "; decode:*=quest(token_budget=2048)"}


def llama_1b():
    c = transformers.LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                 num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                 max_position_embeddings=131072, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.LlamaForCausalLM(c)
    return model.to(torch.bfloat16).eval()


class Timer:
    """CUDA events and the host clock around every attention call of a step."""

    def __init__(self):
        self.pairs, self.host_s, self.calls = [], 0.0, 0

    def wrap(self, fn):
        clock = time.perf_counter

        def timed(*args, **kwargs):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            h0 = clock()  # inside the events: the host interval is the call's own
            out = fn(*args, **kwargs)
            self.host_s += clock() - h0
            b.record()
            self.pairs.append((a, b))
            self.calls += 1
            return out
        return timed

    def take(self):
        """(GPU ms, host ms, calls) since the last take."""
        gpu = sum(a.elapsed_time(b) for a, b in self.pairs)
        out = (gpu, self.host_s * 1e3, self.calls)
        self.pairs, self.host_s, self.calls = [], 0.0, 0
        return out


def fill(model, method, ctx, batch, max_length):
    cfg = model.config
    hkv, hq, d, layers = cfg.num_key_value_heads, cfg.num_attention_heads, 64, cfg.num_hidden_layers
    g = torch.Generator(device="cuda").manual_seed(1)
    rand = lambda h, n: torch.randn(batch, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    if method.startswith("sdpa"):
        cache = transformers.DynamicCache()
        for layer in range(layers):
            cache.update(rand(hkv, ctx), rand(hkv, ctx), layer)
        return cache
    cache = model.sieve.cache(max_length)
    # A chunked prefill: the prefill's scratch grows with rows x keys (one call of 8 x 32K rows
    # over 32K keys asked for 64 GiB on the GPU machine); 2^27 rows x keys per call stays near 1 GiB.
    chunk = max(2, min(ctx, 2 ** 27 // (ctx * batch)))
    for start in range(0, ctx, chunk):
        n = min(chunk, ctx - start)
        for layer in range(layers):
            cache.attend(layer, rand(hq, n), rand(hkv, n), rand(hkv, n), None, None)
    return cache


@torch.no_grad()
def measure(model, method, ctx, batch, steps, warmup, timer):
    """Step, attention (GPU) and attention host times of `steps` decode steps after `warmup`,
    decoding from context `ctx` on."""
    if method == "sdpa (lengths seen)":
        run(model, method, ctx, batch, steps, warmup, timer)
    if method == "sdpa (no cuDNN)":
        from torch.nn.attention import SDPBackend, sdpa_kernel
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            return run(model, method, ctx, batch, steps, warmup, timer)
    return run(model, method, ctx, batch, steps, warmup, timer)


def run(model, method, ctx, batch, steps, warmup, timer):
    cache = fill(model, method, ctx, batch, ctx + warmup + steps + 16)
    torch.cuda.synchronize()
    token = torch.ones(batch, 1, dtype=torch.long, device="cuda")
    step_ms, attn_ms, host_ms, calls = [], [], [], 0
    for i in range(warmup + steps):
        timer.take()
        t0 = time.perf_counter()
        out = model(token, past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        t = (time.perf_counter() - t0) * 1e3
        a, h, calls = timer.take()
        if i >= warmup:
            step_ms.append(t), attn_ms.append(a), host_ms.append(h)
        token = out.logits[:, -1:].argmax(-1)
    del cache, out
    if getattr(model, "sieve", None) is not None:
        model.sieve.active = None  # the binding's last SieveCache: its session's memory goes now
    torch.cuda.empty_cache()
    return step_ms, attn_ms, host_ms, calls


def select(model, method, chain, timer):
    if chain is None:
        model.set_attn_implementation("sdpa" if method == "sdpa (untimed)" else "sdpa_timed")
    else:
        st.use(model, chain=chain)
        AttentionInterface.register(_attention.NAME, timer.wrap(_attention.sieve_attention_forward))


def summarise(ctx, batch, method, passes):
    """One table row from each pass's (step, attention, host, calls) lists."""
    step = [t for p in passes for t in p[0]]
    r = {"ctx": ctx, "batch": batch, "method": method, "step_ms": statistics.median(step),
         "step_ms_by_pass": [statistics.median(p[0]) for p in passes],
         "attention_ms": None, "attention_share": None, "attention_host_ms": None, "host_us_per_call": None}
    if method != "sdpa (untimed)":
        attn = statistics.median([a for p in passes for a in p[1]])
        host = statistics.median([h for p in passes for h in p[2]])
        calls = passes[0][3]
        r.update(attention_ms=attn, attention_share=attn / r["step_ms"], attention_host_ms=host,
                 host_us_per_call=1e3 * host / calls if calls else None)
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="8192,32768")
    ap.add_argument("--batch", default="8,1")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2, help="1: METHODS order only; 2: then reversed")
    ap.add_argument("--methods", default=",".join(METHODS), help="a comma-separated subset of: " + ", ".join(METHODS))
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    order = [m.strip() for m in a.methods.split(",")]
    unknown = [m for m in order if m not in METHODS]
    if unknown:
        ap.error("unknown method(s) %s; choose from: %s" % (", ".join(map(repr, unknown)), ", ".join(METHODS)))
    model = llama_1b()
    timer = Timer()
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    AttentionInterface.register("sdpa_timed", timer.wrap(sdpa_attention_forward))
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionMaskInterface.register("sdpa_timed", sdpa_mask)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "model": "random-weight LlamaForCausalLM, Llama 3.2 1B geometry (16 layers, 32q/8kv heads, d64), bf16",
            "steps": a.steps, "warmup": a.warmup, "passes": a.passes,
            "sdpa_backends": {name: getattr(torch.backends.cuda, name + "_sdp_enabled")()
                              for name in ("flash", "mem_efficient", "cudnn", "math")}}
    rows = []
    for ctx in [int(x) for x in a.ctx.split(",")]:
        for batch in [int(x) for x in a.batch.split(",")]:
            runs = {m: [] for m in order}
            n = 0
            for p in range(a.passes):
                for method in (order if p % 2 == 0 else order[::-1]):
                    select(model, method, METHODS[method], timer)
                    n += 1  # a few tokens further each run: lengths no earlier run decoded over
                    start = ctx + n * (a.warmup + a.steps + 1)
                    runs[method].append(measure(model, method, start, batch, a.steps, a.warmup, timer))
                    print("ctx %6d batch %d pass %d %-32s step %.3f ms" % (
                        ctx, batch, p + 1, method, statistics.median(runs[method][-1][0])), flush=True)
            for method in order:
                rows.append(summarise(ctx, batch, method, runs[method]))
            if a.json:  # after every configuration: a run stopped by a time limit keeps what it measured
                with open(a.json, "w") as f:
                    json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table(rows))


if __name__ == "__main__":
    main()
