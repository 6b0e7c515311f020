"""Run a Hugging Face transformers model's attention through Sieve.

    import sieve.transformers
    sieve.transformers.use(model, chain="2-=quest(token_budget=1024)")
    model.generate(input_ids, attention_mask=mask, max_new_tokens=64)

use() registers Sieve with transformers' own extension points — an attention function and a mask
function under attn_implementation "sieve" (AttentionInterface, AttentionMaskInterface) and a
Cache subclass (SieveCache) whose KV lives in a Sieve session — and makes generate() create a
SieveCache. Supported: transformers 5.x (written and tested against 5.17: Cache(layers=...),
get_mask_sizes(query_length, layer_idx), mask functions taking q_length / q_offset), the Llama and
Qwen2 families (GQA, q/k/v biases), greedy and sampled generation, batches with padding, on CPU and
CUDA. Refused, each with one line: beam search, assisted/speculative decoding, static or other
caches, sliding-window layers, other model families, attention dropout, output_attentions.
"""
import inspect

import sieve

from . import _attention, _model
from ._cache import SieveCache

__all__ = ["use", "SieveCache", "Binding"]


class Binding:
    """What use() attaches to the model (model.sieve): the runtime, the chain, the geometry."""

    def __init__(self, model, chain, runtime, page_size, kv_store, check_outputs):
        self.runtime = runtime
        self.chain = runtime.chain(chain).text if chain else None  # None: dense everywhere
        self.geometry = _model.geometry(model.config)
        self.page_size, self.kv_store, self.check_outputs = page_size, kv_store, check_outputs
        self.active = None  # the SieveCache whose update() ran last

    def cache(self, max_length):
        """A SieveCache for direct forward calls: model(ids, past_key_values=model.sieve.cache(n))."""
        return SieveCache(self._model, max_length)


_MODES = ("greedy_search", "sample")  # GenerationMode values Sieve runs


def _generation_problems(generation_config, extra):
    out = []
    mode = getattr(extra.get("generation_mode"), "value", extra.get("generation_mode"))
    if getattr(generation_config, "num_beams", 1) > 1 or (mode and "beam" in str(mode)):
        out.append("beam search (num_beams=%d) is not supported: Sieve's policies keep one KV history per "
                   "sequence; use greedy or sampling" % generation_config.num_beams)
    elif mode == "assisted_generation" or getattr(generation_config, "prompt_lookup_num_tokens", None):
        out.append("assisted / speculative decoding is not supported: it crops the cache, evicting policies "
                   "cannot give tokens back")
    elif mode is not None and mode not in _MODES:
        out.append("generation mode %r is not supported (greedy and sampling are)" % mode)
    impl = getattr(generation_config, "cache_implementation", None)
    if impl not in (None, "dynamic"):
        out.append("cache_implementation=%r is not supported: the KV cache is Sieve's (SieveCache)" % impl)
    if getattr(generation_config, "use_cache", True) is False:
        out.append("use_cache=False is not supported: Sieve holds the KV cache")
    return out


def _hook_generate(model):
    """generate() asks _prepare_cache_for_generation for its cache (transformers 5.17: with
    generation_config, model_kwargs, generation_mode, batch_size, max_cache_length): answer with
    a SieveCache sized to the generation's length, after refusing what Sieve cannot do."""
    original = type(model)._prepare_cache_for_generation
    signature = inspect.signature(original)

    def prepare(generation_config, model_kwargs, *args, **kwargs):
        try:
            extra = signature.bind(model, generation_config, model_kwargs, *args, **kwargs).arguments
        except TypeError:
            extra = {}
        problems = _generation_problems(generation_config, extra)
        if problems:
            raise NotImplementedError("sieve.transformers: " + "; ".join(problems))
        given = model_kwargs.get("past_key_values")
        if given is None:
            length = max(int(generation_config.max_length or 0), int(extra.get("max_cache_length") or 0))
            # + a page: generate's deferred stop check may run one forward past the last kept token.
            model_kwargs["past_key_values"] = SieveCache(model, length + model.sieve.page_size)
        elif not isinstance(given, SieveCache):
            raise ValueError("sieve.transformers: past_key_values is a %s; Sieve holds the KV cache: pass a "
                             "SieveCache or none" % type(given).__name__)

    model._prepare_cache_for_generation = prepare


def use(model, chain=None, *, plugin_dirs=(), runtime=None, page_size=16, kv_store=None, check_outputs=False):
    """Make `model` (a Llama or Qwen2 PreTrainedModel) attend through Sieve with `chain` (None: dense;
    "decode:2-=quest(token_budget=1024)"; docs/chains.md). Returns the model.

    plugin_dirs: searched before the default plugin directories (your own policies).
    check_outputs: the runtime checks every selection and output (slower; names a broken plugin).
    """
    import transformers
    if int(transformers.__version__.split(".")[0]) < 5:
        raise NotImplementedError("sieve.transformers: transformers %s is not supported (5.x is: written against "
                                  "5.17's Cache and mask interfaces)" % transformers.__version__)
    problems = _model.problems(model)
    if problems:
        raise NotImplementedError("sieve.transformers: " + "; ".join(problems))
    runtime = runtime or sieve.Runtime(plugin_dirs=plugin_dirs)
    binding = Binding(model, chain, runtime, page_size, kv_store, check_outputs)
    binding._model = model
    _attention.register()
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(_attention.NAME)
    else:
        model.config._attn_implementation = _attention.NAME
    n = 0
    for module in model.modules():
        if hasattr(module, "layer_idx") and hasattr(module, "o_proj"):
            module.sieve_binding = binding
            n += 1
    if n != binding.geometry["n_layers"]:
        raise NotImplementedError("sieve.transformers: found %d attention modules, the config has %d layers"
                                  % (n, binding.geometry["n_layers"]))
    model.sieve = binding
    _hook_generate(model)
    return model
