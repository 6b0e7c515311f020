#!/usr/bin/env bash
# Prints, from the transformers installed on the GPU machine, the exact signatures and sources the
# Python integration (python/sieve/transformers) builds on, so it is written against that version
# rather than a newer snapshot. Output: $OUT/introspect.txt (+ $OUT/introspect_env.txt).
set -u
OUT=${OUT:-$PWD/build-device-out}
mkdir -p "$OUT"
{ python3 -c 'import sys; print(sys.version)'; pip list 2>/dev/null | grep -iE "torch|transformers|numpy|accelerate|safetensors|tokenizers|pybind|pytest|huggingface"; nvidia-smi; } > "$OUT/introspect_env.txt" 2>&1
python3 - > "$OUT/introspect.txt" 2>&1 <<'PY'
import importlib, inspect, traceback
def show(label, getter, src=True):
    print("=" * 100); print("###", label)
    try:
        obj = getter()
    except Exception as e:
        print("MISSING:", type(e).__name__, e); return
    try: print("signature:", inspect.signature(obj))
    except Exception as e: print("signature: n/a", type(e).__name__, e)
    try: print("file:", inspect.getsourcefile(obj))
    except Exception: pass
    if src:
        try: print(inspect.getsource(obj))
        except Exception as e: print("source: n/a", type(e).__name__, e, "repr:", repr(obj)[:2000])
def mod(name): return importlib.import_module(name)
def attr(m, *names):
    def g():
        o = mod(m)
        for n in names: o = getattr(o, n)
        return o
    return g
import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())
try:
    import transformers; print("transformers", transformers.__version__, transformers.__file__)
except Exception: traceback.print_exc()
try:
    import numpy; print("numpy", numpy.__version__)
except Exception: traceback.print_exc()
print("torch.from_dlpack:", hasattr(torch, "from_dlpack"), "torch.utils.dlpack:", hasattr(torch.utils, "dlpack"))
try:
    t = torch.zeros(2, device="cuda"); print("__dlpack__ sig:", inspect.signature(t.__dlpack__)); print("__dlpack_device__:", t.__dlpack_device__())
except Exception: traceback.print_exc()
mu = "transformers.modeling_utils"
show("AttentionInterface", attr(mu, "AttentionInterface"))
try:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    print("ALL_ATTENTION_FUNCTIONS type", type(ALL_ATTENTION_FUNCTIONS), "keys", list(ALL_ATTENTION_FUNCTIONS.keys()))
except Exception: traceback.print_exc()
show("GeneralInterface", attr("transformers.utils.generic", "GeneralInterface"))
show("sdpa_attention_forward", attr("transformers.integrations.sdpa_attention", "sdpa_attention_forward"))
show("sdpa repeat_kv", attr("transformers.integrations.sdpa_attention", "repeat_kv"))
show("sdpa use_gqa_in_sdpa", attr("transformers.integrations.sdpa_attention", "use_gqa_in_sdpa"))
show("eager_attention_forward (llama)", attr("transformers.models.llama.modeling_llama", "eager_attention_forward"))
show("LlamaAttention", attr("transformers.models.llama.modeling_llama", "LlamaAttention"))
show("LlamaModel.forward", attr("transformers.models.llama.modeling_llama", "LlamaModel", "forward"))
show("LlamaDecoderLayer.forward", attr("transformers.models.llama.modeling_llama", "LlamaDecoderLayer", "forward"))
show("LlamaConfig.__init__", attr("transformers.models.llama.configuration_llama", "LlamaConfig", "__init__"), src=False)
show("Qwen2Attention", attr("transformers.models.qwen2.modeling_qwen2", "Qwen2Attention"))
show("Qwen2Model.forward", attr("transformers.models.qwen2.modeling_qwen2", "Qwen2Model", "forward"))
show("Qwen2Config.__init__", attr("transformers.models.qwen2.configuration_qwen2", "Qwen2Config", "__init__"), src=False)
show("PreTrainedModel.set_attn_implementation", attr(mu, "PreTrainedModel", "set_attn_implementation"))
show("PreTrainedModel._check_and_adjust_attn_implementation", attr(mu, "PreTrainedModel", "_check_and_adjust_attn_implementation"))
show("PreTrainedModel.get_correct_attn_implementation", attr(mu, "PreTrainedModel", "get_correct_attn_implementation"))
cu = "transformers.cache_utils"
try:
    m = mod(cu); print("cache_utils names:", [n for n in dir(m) if not n.startswith("_")])
except Exception: traceback.print_exc()
show("Cache", attr(cu, "Cache"))
show("DynamicCache", attr(cu, "DynamicCache"))
show("CacheLayerMixin", attr(cu, "CacheLayerMixin"))
show("DynamicLayer", attr(cu, "DynamicLayer"))
show("StaticCache", attr(cu, "StaticCache"), src=False)
mk = "transformers.masking_utils"
try:
    m = mod(mk); print("masking_utils names:", [n for n in dir(m) if not n.startswith("_")])
except Exception: traceback.print_exc()
show("AttentionMaskInterface", attr(mk, "AttentionMaskInterface"))
try:
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    print("ALL_MASK_ATTENTION_FUNCTIONS keys", list(ALL_MASK_ATTENTION_FUNCTIONS.keys()))
except Exception: traceback.print_exc()
show("create_causal_mask", attr(mk, "create_causal_mask"))
show("_preprocess_mask_arguments", attr(mk, "_preprocess_mask_arguments"))
show("sdpa_mask", attr(mk, "sdpa_mask"))
gu = "transformers.generation.utils"
show("GenerationMixin._prepare_cache_for_generation", attr(gu, "GenerationMixin", "_prepare_cache_for_generation"))
show("GenerationMixin._supports_default_dynamic_cache", attr(gu, "GenerationMixin", "_supports_default_dynamic_cache"))
show("GenerationMixin.prepare_inputs_for_generation", attr(gu, "GenerationMixin", "prepare_inputs_for_generation"))
show("GenerationMixin._cache_dependant_input_preparation", attr(gu, "GenerationMixin", "_cache_dependant_input_preparation"))
show("GenerationMixin._validate_generation_mode / _validate_model_kwargs", attr(gu, "GenerationMixin", "_validate_model_kwargs"))
show("GenerationMixin.generate", attr(gu, "GenerationMixin", "generate"), src=False)
show("GenerationMixin._sample", attr(gu, "GenerationMixin", "_sample"))
show("GenerationMixin._beam_search", attr(gu, "GenerationMixin", "_beam_search"), src=False)
show("GenerationMixin._prepare_special_tokens", attr(gu, "GenerationMixin", "_prepare_special_tokens"), src=False)
show("GenerationConfig.get_generation_mode", attr("transformers.generation.configuration_utils", "GenerationConfig", "get_generation_mode"))
show("ROPE init (llama rotary)", attr("transformers.models.llama.modeling_llama", "LlamaRotaryEmbedding"))
show("apply_rotary_pos_emb", attr("transformers.models.llama.modeling_llama", "apply_rotary_pos_emb"))
PY
echo "introspect rc=$? lines=$(wc -l < "$OUT/introspect.txt")"
head -5 "$OUT/introspect.txt"
