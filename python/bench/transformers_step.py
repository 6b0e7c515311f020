#!/usr/bin/env python3
"""Decode step time of a random-weight Llama 3.2 1B-geometry model in transformers: its `sdpa`
attention (DynamicCache) against Sieve dense and Sieve quest, with the attention's share of the
step. Context is filled without a model prefill (it would not be timed anyway): the sdpa cache
gets random K/V per layer, the Sieve cache gets the same through its prefill path with a cheap
prefill chain (streaming, window 64: the K/V appended are all of them, the decode chain is what
is timed).

    transformers_step.py --ctx 8192,32768 --batch 1,8 --json out.json --markdown out.md
    step_table.py out.json > table.md             the table again from the JSON

Step = model(next_token, past_key_values=cache) from launch to torch.cuda.synchronize(), median
of --steps after --warmup. Attention = the sum over layers of CUDA-event intervals around the
attention function (for sdpa: transformers' sdpa_attention_forward; for Sieve: the whole layer
call through the binding), median over the same steps.
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
# "sdpa (no timer)": transformers' own "sdpa" implementation, not the timed copy: its step time shows
# what the attention timer and the copy's registration cost (no attention time of its own).
METHODS = {"sdpa (no timer)": None, "sdpa": None, "sieve dense": PREFILL_FILL + "; decode:*=dense",
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
    """CUDA events around every attention call of a step."""

    def __init__(self):
        self.pairs = []

    def wrap(self, fn):
        def timed(*args, **kwargs):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            out = fn(*args, **kwargs)
            b.record()
            self.pairs.append((a, b))
            return out
        return timed

    def take_ms(self):
        ms = sum(a.elapsed_time(b) for a, b in self.pairs)
        self.pairs = []
        return ms


def fill(model, method, ctx, batch):
    cfg = model.config
    hkv, hq, d, layers = cfg.num_key_value_heads, cfg.num_attention_heads, 64, cfg.num_hidden_layers
    g = torch.Generator(device="cuda").manual_seed(1)
    rand = lambda h, n: torch.randn(batch, h, n, d, device="cuda", dtype=torch.bfloat16, generator=g)  # noqa: E731
    if method.startswith("sdpa"):
        cache = transformers.DynamicCache()
        for layer in range(layers):
            cache.update(rand(hkv, ctx), rand(hkv, ctx), layer)
        return cache
    cache = model.sieve.cache(ctx + 64)
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
    cache = fill(model, method, ctx, batch)
    torch.cuda.synchronize()
    token = torch.ones(batch, 1, dtype=torch.long, device="cuda")
    step_ms, attn_ms = [], []
    for i in range(warmup + steps):
        timer.take_ms()
        t0 = time.perf_counter()
        out = model(token, past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        t = (time.perf_counter() - t0) * 1e3
        a = timer.take_ms()
        if i >= warmup:
            step_ms.append(t), attn_ms.append(a)
        token = out.logits[:, -1:].argmax(-1)
    del cache, out
    torch.cuda.empty_cache()
    s, a = statistics.median(step_ms), statistics.median(attn_ms)
    if method == "sdpa (no timer)":
        return {"step_ms": s, "attention_ms": None, "attention_share": None}
    return {"step_ms": s, "attention_ms": a, "attention_share": a / s}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", default="8192,32768")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    a = ap.parse_args()
    model = llama_1b()
    timer = Timer()
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    AttentionInterface.register("sdpa_timed", timer.wrap(sdpa_attention_forward))
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionMaskInterface.register("sdpa_timed", sdpa_mask)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "transformers": transformers.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "model": "random-weight LlamaForCausalLM, Llama 3.2 1B geometry (16 layers, 32q/8kv heads, d64), bf16",
            "steps": a.steps, "warmup": a.warmup}
    rows = []
    for ctx in [int(x) for x in a.ctx.split(",")]:
        for batch in [int(x) for x in a.batch.split(",")]:
            for method, chain in METHODS.items():
                if chain is None:
                    model.set_attn_implementation("sdpa" if method == "sdpa (no timer)" else "sdpa_timed")
                else:
                    st.use(model, chain=chain)
                    AttentionInterface.register(_attention.NAME, timer.wrap(_attention.sieve_attention_forward))
                r = measure(model, method, ctx, batch, a.steps, a.warmup, timer)
                r.update(ctx=ctx, batch=batch, method=method)
                rows.append(r)
                print("ctx %6d batch %d %-32s step %.3f ms, attention %s ms" % (
                    ctx, batch, method, r["step_ms"], "-" if r["attention_ms"] is None else "%.3f" % r["attention_ms"]),
                    flush=True)
                if a.json:  # after every row: a run stopped by a time limit keeps what it measured
                    with open(a.json, "w") as f:
                        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if a.markdown:
        with open(a.markdown, "w") as f:
            f.write(table(rows))


if __name__ == "__main__":
    main()
