"""A standard Llama decoder in plain torch (RMSNorm, RoPE, SwiGLU, GQA), with the Hugging Face
parameter names and RoPE convention ("rotate_half"), saved as config.json + model.safetensors
that Sieve's model host loads (core/model/src/safetensors.cpp). Runs on torch 1.13 (CPU, no
scaled_dot_product_attention) and torch 2.x (CUDA, fused attention).
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


class Config:
    def __init__(self, vocab_size=256, dim=256, n_layers=4, n_heads=4, n_kv_heads=2, hidden_dim=None,
                 max_len=8192, rope_theta=10000.0, norm_eps=1e-5):
        self.vocab_size, self.dim, self.n_layers = vocab_size, dim, n_layers
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        # SwiGLU at 8/3 of the width, rounded up to 64 (Llama's rule).
        self.hidden_dim = hidden_dim or 64 * math.ceil(8 * dim / 3 / 64)
        self.max_len, self.rope_theta, self.norm_eps = max_len, rope_theta, norm_eps
        if dim % n_heads or n_heads % n_kv_heads or (dim // n_heads) % 2:
            raise ValueError(f"bad shape: dim {dim}, heads {n_heads}/{n_kv_heads}")

    @property
    def head_dim(self):
        return self.dim // self.n_heads

    def to_dict(self):
        return dict(self.__dict__)

    def hf_config(self):
        return {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": self.vocab_size,
            "hidden_size": self.dim, "intermediate_size": self.hidden_dim, "num_hidden_layers": self.n_layers,
            "num_attention_heads": self.n_heads, "num_key_value_heads": self.n_kv_heads,
            "head_dim": self.head_dim, "max_position_embeddings": self.max_len, "rope_theta": self.rope_theta,
            "rms_norm_eps": self.norm_eps, "hidden_act": "silu", "tie_word_embeddings": False,
            "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "torch_dtype": "float32",
        }


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        return (self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps))).to(x.dtype)


def rope_tables(cfg, length, device):
    """cos, sin [length, head_dim] as transformers' LlamaRotaryEmbedding builds them (f32)."""
    hd = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64, device=device).float() / hd))
    freqs = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def attend(q, k, v):
    """Causal attention, q [B, H, T, hd], k/v [B, Hkv, T, hd]; query head h reads kv head h // group."""
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T = q.shape[2]
    s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    return torch.softmax(s.masked_fill(mask, float("-inf")).float(), dim=-1).to(v.dtype) @ v


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        hd = cfg.head_dim
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * hd, cfg.dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        hd = self.cfg.head_dim
        q = self.q_proj(x).view(B, T, self.cfg.n_heads, hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.cfg.n_kv_heads, hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.cfg.n_kv_heads, hd).transpose(1, 2)
        cos, sin = cos[:T].to(q.dtype), sin[:T].to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = attend(q, k, v).transpose(1, 2).reshape(B, T, -1)
        return self.o_proj(o)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self._rope = None
        # GPT-2's init: N(0, 0.02), the residual outputs scaled down by sqrt(2 n_layers).
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * cfg.n_layers) if name.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def rope(self, length, device):
        if self._rope is None or self._rope[0].shape[0] < length or self._rope[0].device != device:
            self._rope = rope_tables(self.cfg, max(length, 256), device)
        return self._rope

    def hidden(self, tokens):
        """The final normed hidden states [B, T, dim]."""
        cos, sin = self.rope(tokens.shape[1], tokens.device)
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)

    def forward(self, tokens):
        return self.lm_head(self.hidden(tokens))

    def hf_state_dict(self):
        """Parameters under transformers' LlamaForCausalLM names, f32 on the CPU."""
        return {("lm_head.weight" if k == "lm_head.weight" else "model." + k): v.detach().float().cpu().contiguous()
                for k, v in self.state_dict().items()}


def write_safetensors(path, tensors, metadata=None):
    """The safetensors format: u64 LE header length, JSON header (offsets into the data, padded to
    8 bytes with spaces), then the raw little-endian tensors (F32)."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype != torch.float32:
            raise ValueError(f"{name}: only F32 is written, got {t.dtype}")
        blob = t.numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def save_for_sieve(model, out_dir, metadata=None):
    """config.json + model.safetensors, what `sieve run/eval --model out_dir` loads."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(model.cfg.hf_config(), f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(out_dir, "model.safetensors"), model.hf_state_dict(), metadata)
