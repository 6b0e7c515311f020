"""What sieve.transformers reads off a model: its family, attention geometry, and the features it
refuses (each with one line saying why), so nothing unsupported runs silently wrong."""

SUPPORTED_MODEL_TYPES = ("llama", "qwen2")


def rope_theta(config):
    """RoPE base: config.rope_theta (transformers 4.x) or config.rope_parameters["rope_theta"] (5.x)."""
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        params = getattr(config, "rope_parameters", None) or {}
        theta = params.get("rope_theta") if isinstance(params, dict) else None
    return float(theta if theta is not None else 10000.0)


def geometry(config):
    """The Session arguments of a decoder config (heads, head_dim, layers, RoPE)."""
    hq = config.num_attention_heads
    d = getattr(config, "head_dim", None) or config.hidden_size // hq
    rotary = getattr(config, "partial_rotary_factor", 1.0) or 1.0
    return dict(n_layers=config.num_hidden_layers, n_q_heads=hq,
                n_kv_heads=getattr(config, "num_key_value_heads", None) or hq, head_dim=d,
                rope_theta=rope_theta(config), rope_dim=int(d * rotary))


def problems(model):
    """Every reason `model` cannot run through Sieve (empty: it can)."""
    config = model.config
    out = []
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        out.append("model type %r is not supported (the Llama and Qwen2 families are: %s)"
                   % (kind, ", ".join(SUPPORTED_MODEL_TYPES)))
    layer_types = getattr(config, "layer_types", None) or []
    sliding = [i for i, t in enumerate(layer_types) if t != "full_attention"]
    if sliding or getattr(config, "use_sliding_window", False):
        out.append("sliding-window layers (%s) are not supported: Sieve attends over each sequence's whole "
                   "resident cache; a window is a policy (streaming) here, not a layer type"
                   % ("layers %s" % sliding[:8] if sliding else "config.use_sliding_window=True"))
    if getattr(config, "is_encoder_decoder", False):
        out.append("encoder-decoder models are not supported (decoder-only causal attention)")
    return out
