// The second model format: Hugging Face safetensors + config.json, Llama and Qwen2 architectures.
//
// Why safetensors rather than GGUF: it is what Llama/Qwen2 checkpoints are published in, its
// layout is a JSON header plus raw little-endian tensors (checked exactly, nothing implicit), and
// the tensors are unquantised f32/f16/bf16, which the f32 forward pass takes without a
// dequantiser. GGUF's value is its quantised types, which this engine does not run.
//
// What is read:
//  - `path` is a checkpoint directory, its config.json, or one of its .safetensors files. The
//    weights are model.safetensors, or the shards listed by model.safetensors.index.json.
//  - config.json: model_type "llama" or "qwen2"; hidden_size, intermediate_size,
//    num_hidden_layers, num_attention_heads, vocab_size (required); num_key_value_heads (default:
//    num_attention_heads), max_position_embeddings (default 2048), rope_theta (10000),
//    rms_norm_eps (1e-6), tie_word_embeddings (false), attention_bias (llama, default false;
//    qwen2 always has q/k/v biases). Refused: rope_scaling, a head_dim other than
//    hidden_size / num_attention_heads, hidden_act other than silu, qwen2's use_sliding_window.
//  - tensors model.embed_tokens, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj
//    (+ q/k/v .bias), post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head
//    (absent when tied), in F32, F16 or BF16 (converted to f32).
//  - RoPE layout: HF rotates (i, i + head_dim/2) and its q_proj/k_proj rows are permuted for that
//    (transformers' convert_llama_weights_to_hf `permute`); the loader applies the inverse, so
//    the model runs the llama2.c convention (consecutive pairs) with identical attention logits.
//    Consequence for policies: K and pre-RoPE K are in the interleaved channel order; a policy
//    whose learned weights index head channels in HF order must permute them the same way.
// Refused with one line naming the file: unreadable or truncated files, a header that is not
// JSON or points outside the file, unsupported dtypes, missing tensors, shapes that do not match
// config.json, impossible configs.
// The tokenizer (tokenizer.json) is not read: pair such a model with a llama2.c tokenizer file.
#pragma once
#include <string>

#include "sieve/model/model.hpp"

namespace sieve::model {

ModelWeights load_safetensors(const std::string& path);

// Row permutation between the two RoPE layouts, for one projection of n_heads heads of head_dim
// rows each: interleaved row 2i + c of a head <- HF row c * head_dim/2 + i. `rows` is
// [n_heads * head_dim, cols] (a bias: cols = 1). Returns the interleaved-layout matrix.
std::vector<float> unpermute_rope_rows(const std::vector<float>& hf, int32_t n_heads, int32_t head_dim,
                                       int64_t cols);

}  // namespace sieve::model
