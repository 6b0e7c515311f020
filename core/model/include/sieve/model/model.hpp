// A Llama-family decoder held in host memory as f32: the shape (ModelConfig) and the weights
// (ModelWeights), whatever file format they came from (llama2c.hpp, safetensors.hpp).
//
// Conventions every loader converts to, so the forward pass (engine.hpp) has one definition:
//  - every projection is row-major [out, in] (y = W x), as llama2.c and PyTorch store them;
//  - RoPE rotates CONSECUTIVE channel pairs (2i, 2i+1) of each head with frequency
//    theta^(-2i/head_dim) (llama2.c / Meta). Hugging Face checkpoints rotate (i, i + head_dim/2)
//    ("rotate_half") and store wq/wk rows permuted accordingly; the safetensors loader undoes that
//    permutation, which gives the same attention logits (q·k is invariant under a permutation
//    applied to both), so K (and the pre-RoPE K a policy sees) is in the interleaved channel order;
//  - the classifier is the token embedding when `shared_classifier` (tied), else its own matrix.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sieve::model {

struct ModelConfig {
  int32_t dim = 0;         // model width
  int32_t hidden_dim = 0;  // FFN width
  int32_t n_layers = 0;
  int32_t n_heads = 0;     // query heads
  int32_t n_kv_heads = 0;  // n_heads % n_kv_heads == 0 (GQA group n_heads / n_kv_heads)
  int32_t vocab_size = 0;
  int32_t seq_len = 0;     // longest sequence the model was trained for (prompt + generation)
  float rope_theta = 10000.f;
  float norm_eps = 1e-5f;  // RMSNorm epsilon
  bool shared_classifier = true;
  bool qkv_bias = false;   // q/k/v projections carry a bias (Qwen2)

  int32_t head_dim() const { return n_heads > 0 ? dim / n_heads : 0; }
  int32_t kv_dim() const { return head_dim() * n_kv_heads; }
  // Why this shape cannot be a model ("" when it can): non-positive sizes, dim % n_heads,
  // n_heads % n_kv_heads, an odd head_dim (RoPE rotates pairs).
  std::string problem() const;
};

struct LayerWeights {
  std::vector<float> rms_att;  // [dim]
  std::vector<float> wq;       // [dim, dim]
  std::vector<float> wk;       // [kv_dim, dim]
  std::vector<float> wv;       // [kv_dim, dim]
  std::vector<float> bq, bk, bv;  // [dim], [kv_dim], [kv_dim] when config.qkv_bias, else empty
  std::vector<float> wo;       // [dim, dim]
  std::vector<float> rms_ffn;  // [dim]
  std::vector<float> w1;       // [hidden, dim]  gate
  std::vector<float> w2;       // [dim, hidden]  down
  std::vector<float> w3;       // [hidden, dim]  up
};

struct ModelWeights {
  ModelConfig config;
  std::vector<float> token_embedding;  // [vocab, dim]
  std::vector<LayerWeights> layers;    // [n_layers]
  std::vector<float> rms_final;        // [dim]
  std::vector<float> classifier;       // [vocab, dim]; empty when config.shared_classifier
  std::string source;                  // where it was loaded from (for messages)
  std::string format;                  // "llama2.c" or "safetensors"

  const std::vector<float>& output_matrix() const {
    return config.shared_classifier ? token_embedding : classifier;
  }
  // Parameters (floats) held, for reports.
  int64_t parameter_count() const;
};

// Load a model file, choosing the format from what `path` is: a directory, a `.safetensors`
// file or a `.json` (config.json) → safetensors (safetensors.hpp); anything else → a llama2.c
// checkpoint (llama2c.hpp). Throws sieve::Error with one line naming the file and the problem.
ModelWeights load_model(const std::string& path);

}  // namespace sieve::model
