#!/usr/bin/env python3
"""Host time per layer call of sieve.transformers' decode path: SieveCache.update + attend (the
[B, H, 1, D] -> [B, H, D] views, the output buffer, the step plan, the binding) on torch tensors
laid out as transformers lays them out, with the C call real and stubbed out (the latter is the
Python side alone, steady where the CPU kernel's time is large and noisy). Median microseconds
per layer call over --steps decode steps of --layers layers, batch --batch.

    cache_host_cost.py [--device cpu] [--batch 8] [--steps 150]

Where transformers is not installed (CI, a CPU box) the three transformers names the package
imports (Cache, CacheLayerMixin, causal_mask_function) are stood in for by minimal ones (nothing else of transformers runs on this path); the
attention function's own checks and transformers' layer code around the call are not included.
"""
import argparse
import statistics
import sys
import time
import types


def stand_in_transformers():
    """Just what sieve.transformers._cache imports, when transformers is missing."""
    class CacheLayerMixin:
        def __init__(self):
            self.is_initialized = False

    class Cache:
        def __init__(self, layers):
            self.layers = layers

    tf = types.ModuleType("transformers")
    tf.__path__ = []  # a package, for the submodule imports
    tf.cache_utils = types.ModuleType("transformers.cache_utils")
    tf.cache_utils.Cache, tf.cache_utils.CacheLayerMixin = Cache, CacheLayerMixin
    tf.masking_utils = types.ModuleType("transformers.masking_utils")
    tf.masking_utils.causal_mask_function = lambda *args: None
    sys.modules.update({"transformers": tf, "transformers.cache_utils": tf.cache_utils,
                        "transformers.masking_utils": tf.masking_utils})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--layers", type=int, default=16)
    a = ap.parse_args()
    import torch
    try:
        import transformers  # noqa: F401  (the real one where installed)
    except ImportError:
        stand_in_transformers()
    import sieve
    from sieve.transformers._cache import SieveCache
    hq, hkv, d, b = 32, 8, 64, a.batch  # a 1B Llama layer
    geometry = dict(n_layers=a.layers, n_q_heads=hq, n_kv_heads=hkv, head_dim=d, rope_theta=1e4, rope_dim=d)
    binding = types.SimpleNamespace(runtime=sieve.Runtime(), chain=None, page_size=16, kv_store=None,
                                    check_outputs=False, active=None, geometry=geometry)
    cache = SieveCache(types.SimpleNamespace(sieve=binding), 2 * a.steps + 64)

    def new_tokens(h, s):  # transformers' [B, H, S, D] over a [B, S, H, D] buffer
        return torch.randn(b, s, h, d, device=a.device).transpose(1, 2)

    result = {}
    with torch.no_grad():
        q, k, v = new_tokens(hq, 4), new_tokens(hkv, 4), new_tokens(hkv, 4)
        for layer in range(a.layers):  # the prefill
            cache.update(k, v, layer)
            cache.attend(layer, q, k, v, None, None)
        q, k, v = new_tokens(hq, 1), new_tokens(hkv, 1), new_tokens(hkv, 1)
        real = cache.session._attend
        for name, fn in (("with the C call", real), ("C call stubbed", lambda *args: 0)):
            cache.session._attend = fn
            times = []
            for step in range(a.steps // 2):
                for layer in range(a.layers):
                    t0 = time.perf_counter_ns()
                    cache.update(k, v, layer)
                    cache.attend(layer, q, k, v, None, None)
                    times.append((time.perf_counter_ns() - t0) / 1e3)
            result[name] = round(statistics.median(times), 1)
        cache.session._attend = real
    print("per layer call, us (batch %d, %s, torch %s): %s" % (b, a.device, torch.__version__, result))


if __name__ == "__main__":
    main()
