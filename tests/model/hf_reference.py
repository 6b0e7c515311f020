#!/usr/bin/env python3
"""Writes tiny random Hugging Face checkpoints with transformers itself, and their logits, so the
safetensors loader and the forward pass can be checked against the real implementation
(Forward/HfReference in test_forward.cpp, run with SIEVE_HF_REFERENCE_DIR=<dir>).

usage: hf_reference.py DIR    (needs torch + transformers; CPU is enough)
Writes DIR/llama and DIR/qwen2 (Qwen2 has q/k/v biases), each with config.json,
model.safetensors and reference.json = {"tokens": [...], "logits": [[...] per position]}.
"""
import json
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def write(out, model):
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
            else:
                p.normal_(0.0, 0.3)
    model = model.float().eval()
    model.save_pretrained(out, safe_serialization=True)
    tokens = [1, 7, 23, 5, 9, 31, 2, 17, 3, 38, 11, 20]
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0]
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump({"tokens": tokens, "logits": logits.tolist()}, f)


def main():
    root = sys.argv[1]
    common = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(**common, attn_implementation="eager"))
    write(os.path.join(root, "llama"), llama)
    qwen = Qwen2ForCausalLM(Qwen2Config(**common, attn_implementation="eager"))
    write(os.path.join(root, "qwen2"), qwen)
    print("wrote", root)


if __name__ == "__main__":
    main()
