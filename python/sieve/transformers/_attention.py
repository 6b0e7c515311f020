"""The attention function and the mask function Sieve registers with transformers
(AttentionInterface / AttentionMaskInterface, under the name "sieve").

The model's attention modules compute q/k/v and RoPE as usual, hand k/v to the cache
(SieveCache.update, which keeps nothing and returns them) and then call this function, which
runs the layer through the cache's Sieve session. Causality is Sieve's (its prefill is causal
over each sequence); from the mask it takes only which query rows are real tokens (padding).
"""
from transformers.masking_utils import causal_mask_function

NAME = "sieve"


def sieve_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                            sliding_window=None, softcap=None, **kwargs):
    binding = getattr(module, "sieve_binding", None)
    if binding is None:
        raise RuntimeError("sieve.transformers: this attention module was not set up by sieve.transformers.use()")
    cache = binding.active
    if cache is None or not cache.is_pending(module.layer_idx, key):
        raise RuntimeError(
            "sieve.transformers: layer %d ran without a SieveCache (Sieve holds the KV cache): use model.generate, "
            "or pass past_key_values=model.sieve.cache(max_length) to the forward call" % module.layer_idx)
    if dropout:
        raise NotImplementedError("sieve.transformers: attention dropout (%g) is not supported: call model.eval()"
                                  % dropout)
    if sliding_window is not None or softcap is not None:
        raise NotImplementedError("sieve.transformers: sliding-window and soft-capped attention are not supported")
    if kwargs.get("output_attentions"):
        raise NotImplementedError("sieve.transformers: output_attentions is not supported (Sieve's kernels do not "
                                  "materialise attention weights)")
    d = query.shape[-1]
    if scaling is not None and abs(scaling * d ** 0.5 - 1) > 1e-6:
        raise NotImplementedError("sieve.transformers: attention scale %g is not 1/sqrt(head_dim) = %g"
                                  % (scaling, d ** -0.5))
    return cache.attend(module.layer_idx, query, key, value, attention_mask, kwargs.get("position_ids")), None


def sieve_mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=causal_mask_function,
               attention_mask=None, **kwargs):
    """Which query rows are real tokens: a bool [batch, q_length] tensor, or None when the model
    was given no padding mask.

    attention_mask is the 2D padding mask over the tokens seen so far and this forward's
    (transformers' create_causal_mask hands it as bool); the query rows are its columns from
    q_offset. Masks beyond causal + padding (packed sequences, block overlays, extra or/and mask
    functions) are refused rather than ignored."""
    if mask_function is not causal_mask_function:
        raise NotImplementedError("sieve.transformers: only causal attention with padding is supported, not a "
                                  "modified mask (%s: packed sequences, block overlays or extra mask functions)"
                                  % getattr(mask_function, "__name__", mask_function))
    if attention_mask is None:
        return None
    start = int(q_offset) - int(kv_offset)
    if attention_mask.ndim != 2 or attention_mask.shape[-1] < start + q_length:
        raise ValueError("sieve.transformers: the attention mask has shape %s, expected [batch, >= %d]"
                         % (tuple(attention_mask.shape), start + q_length))
    return attention_mask[:, start:start + q_length].bool()


def register():
    """Add "sieve" to transformers' attention and mask registries (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(NAME, sieve_attention_forward)
    AttentionMaskInterface.register(NAME, sieve_mask)
