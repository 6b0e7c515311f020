// Test helpers: random tiny Llama weights and writers for the two model formats, written here
// independently of the loaders (the safetensors writer applies transformers' own `permute` to
// wq/wk, so the loader's inverse is checked against the real convention, not against itself).
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "sieve/model/llama2c.hpp"
#include "sieve/model/model.hpp"
#include "sieve/util/half.hpp"

namespace sieve::test {

inline std::string default_model_path() {
  return std::string(SIEVE_SOURCE_DIR) + "/hosts/sieve/models/stories260K/stories260K.bin";
}
inline std::string default_tokenizer_path() {
  return std::string(SIEVE_SOURCE_DIR) + "/hosts/sieve/models/stories260K/tok512.bin";
}
// The stories260K weights from the source tree, loaded once per test binary.
inline const model::ModelWeights& stories() {
  static const model::ModelWeights w = model::load_llama2c(default_model_path());
  return w;
}

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "sieve_model_XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data()) ? tmpl : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline model::ModelConfig tiny_config(bool shared_classifier = true) {
  model::ModelConfig c;
  c.dim = 32;
  c.hidden_dim = 48;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;  // head_dim 8, GQA group 2
  c.vocab_size = 40;
  c.seq_len = 64;
  c.shared_classifier = shared_classifier;
  return c;
}

// Random weights: N(0, 1/in) projections (so activations stay O(1)), norms around 1.
inline model::ModelWeights random_weights(const model::ModelConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto fill = [&](int64_t n, double stddev, double mean = 0) {
    std::normal_distribution<float> d{float(mean), float(stddev)};
    std::vector<float> v(static_cast<size_t>(n));
    for (auto& x : v) x = d(rng);
    return v;
  };
  const int64_t D = c.dim, F = c.hidden_dim, KV = c.kv_dim(), V = c.vocab_size;
  model::ModelWeights w;
  w.config = c;
  w.source = "random";
  w.token_embedding = fill(V * D, 1.0);
  for (int32_t l = 0; l < c.n_layers; ++l) {
    model::LayerWeights L;
    L.rms_att = fill(D, 0.1, 1.0);
    L.wq = fill(D * D, 1.0 / std::sqrt(double(D)));
    L.wk = fill(KV * D, 1.0 / std::sqrt(double(D)));
    L.wv = fill(KV * D, 1.0 / std::sqrt(double(D)));
    if (c.qkv_bias) {
      L.bq = fill(D, 0.2);
      L.bk = fill(KV, 0.2);
      L.bv = fill(KV, 0.2);
    }
    L.wo = fill(D * D, 1.0 / std::sqrt(double(D)));
    L.rms_ffn = fill(D, 0.1, 1.0);
    L.w1 = fill(F * D, 1.0 / std::sqrt(double(D)));
    L.w2 = fill(D * F, 1.0 / std::sqrt(double(F)));
    L.w3 = fill(F * D, 1.0 / std::sqrt(double(D)));
    w.layers.push_back(std::move(L));
  }
  w.rms_final = fill(D, 0.1, 1.0);
  if (!c.shared_classifier) w.classifier = fill(V * D, 1.0 / std::sqrt(double(D)));
  return w;
}

// ---- llama2.c ------------------------------------------------------------------------------
inline std::vector<std::byte> llama2c_bytes(const model::ModelWeights& w) {
  const auto& c = w.config;
  std::vector<std::byte> out;
  auto put = [&](const void* p, size_t n) {
    const auto* b = static_cast<const std::byte*>(p);
    out.insert(out.end(), b, b + n);
  };
  const int32_t h[7] = {c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads,
                        c.shared_classifier ? c.vocab_size : -c.vocab_size, c.seq_len};
  put(h, sizeof h);
  auto vec = [&](const std::vector<float>& v) { put(v.data(), v.size() * 4); };
  vec(w.token_embedding);
  for (const auto& l : w.layers) vec(l.rms_att);
  for (const auto& l : w.layers) vec(l.wq);
  for (const auto& l : w.layers) vec(l.wk);
  for (const auto& l : w.layers) vec(l.wv);
  for (const auto& l : w.layers) vec(l.wo);
  for (const auto& l : w.layers) vec(l.rms_ffn);
  for (const auto& l : w.layers) vec(l.w1);
  for (const auto& l : w.layers) vec(l.w2);
  for (const auto& l : w.layers) vec(l.w3);
  vec(w.rms_final);
  // The legacy RoPE tables hold NaN here: a loader that used them would poison the output.
  vec(std::vector<float>(size_t(c.seq_len) * c.head_dim(), std::nanf("")));
  if (!c.shared_classifier) vec(w.classifier);
  return out;
}

inline void write_bytes(const std::string& path, const std::vector<std::byte>& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
}

// ---- safetensors + config.json (HF Llama / Qwen2 layout) -----------------------------------
// transformers' convert_llama_weights_to_hf permute:
//   w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)
inline std::vector<float> hf_permute(const std::vector<float>& w, int32_t n_heads, int64_t rows, int64_t cols) {
  const int64_t per = rows / n_heads, half = per / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t two = 0; two < 2; ++two) {
        const int64_t src = h * per + i * 2 + two;  // view index [h, i, two]
        const int64_t dst = h * per + two * half + i;  // after transpose(1, 2): [h, two, i]
        std::memcpy(out.data() + dst * cols, w.data() + src * cols, size_t(cols) * 4);
      }
  return out;
}

struct SafetensorsTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> data;
};

// dtype "F32", "F16" or "BF16".
inline void write_safetensors_file(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                                   const std::string& dtype) {
  nlohmann::json h = nlohmann::json::object();
  std::vector<unsigned char> data;
  for (const auto& t : tensors) {
    const size_t begin = data.size();
    for (float v : t.data) {
      if (dtype == "F32") {
        unsigned char b[4];
        std::memcpy(b, &v, 4);
        data.insert(data.end(), b, b + 4);
      } else {
        const uint16_t x = dtype == "F16" ? f32_to_f16(v) : f32_to_bf16(v);
        data.push_back(uint8_t(x & 0xff));
        data.push_back(uint8_t(x >> 8));
      }
    }
    h[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  h["__metadata__"] = {{"format", "pt"}};
  std::string header = h.dump();
  while (header.size() % 8) header += ' ';
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(char((n >> (8 * i)) & 0xff));
  f.write(header.data(), std::streamsize(header.size()));
  f.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

inline nlohmann::json hf_config(const model::ModelConfig& c, const std::string& model_type = "llama") {
  return {{"architectures", {model_type == "qwen2" ? "Qwen2ForCausalLM" : "LlamaForCausalLM"}},
          {"model_type", model_type},
          {"hidden_size", c.dim},
          {"intermediate_size", c.hidden_dim},
          {"num_hidden_layers", c.n_layers},
          {"num_attention_heads", c.n_heads},
          {"num_key_value_heads", c.n_kv_heads},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.seq_len},
          {"rope_theta", c.rope_theta},
          {"rms_norm_eps", c.norm_eps},
          {"hidden_act", "silu"},
          {"tie_word_embeddings", c.shared_classifier},
          {"torch_dtype", "float32"}};
}

inline std::vector<SafetensorsTensor> hf_tensors(const model::ModelWeights& w) {
  const auto& c = w.config;
  const int64_t D = c.dim, F = c.hidden_dim, KV = c.kv_dim(), V = c.vocab_size;
  std::vector<SafetensorsTensor> t;
  t.push_back({"model.embed_tokens.weight", {V, D}, w.token_embedding});
  for (int32_t i = 0; i < c.n_layers; ++i) {
    const auto& l = w.layers[size_t(i)];
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t.push_back({p + "input_layernorm.weight", {D}, l.rms_att});
    t.push_back({p + "self_attn.q_proj.weight", {D, D}, hf_permute(l.wq, c.n_heads, D, D)});
    t.push_back({p + "self_attn.k_proj.weight", {KV, D}, hf_permute(l.wk, c.n_kv_heads, KV, D)});
    t.push_back({p + "self_attn.v_proj.weight", {KV, D}, l.wv});
    if (c.qkv_bias) {
      t.push_back({p + "self_attn.q_proj.bias", {D}, hf_permute(l.bq, c.n_heads, D, 1)});
      t.push_back({p + "self_attn.k_proj.bias", {KV}, hf_permute(l.bk, c.n_kv_heads, KV, 1)});
      t.push_back({p + "self_attn.v_proj.bias", {KV}, l.bv});
    }
    t.push_back({p + "self_attn.o_proj.weight", {D, D}, l.wo});
    t.push_back({p + "post_attention_layernorm.weight", {D}, l.rms_ffn});
    t.push_back({p + "mlp.gate_proj.weight", {F, D}, l.w1});
    t.push_back({p + "mlp.up_proj.weight", {F, D}, l.w3});
    t.push_back({p + "mlp.down_proj.weight", {D, F}, l.w2});
  }
  t.push_back({"model.norm.weight", {D}, w.rms_final});
  if (!c.shared_classifier) t.push_back({"lm_head.weight", {V, D}, w.classifier});
  return t;
}

// A checkpoint directory: config.json + model.safetensors.
inline void write_hf_checkpoint(const std::string& dir, const model::ModelWeights& w, const std::string& dtype = "F32",
                                const std::string& model_type = "llama") {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << hf_config(w.config, model_type).dump(2);
  write_safetensors_file(dir + "/model.safetensors", hf_tensors(w), dtype);
}

// Values as the f16 / bf16 round trip leaves them (what a half-precision checkpoint holds).
inline model::ModelWeights rounded(model::ModelWeights w, const std::string& dtype) {
  auto r = [&](std::vector<float>& v) {
    for (float& x : v) x = dtype == "F16" ? f16_to_f32(f32_to_f16(x)) : bf16_to_f32(f32_to_bf16(x));
  };
  r(w.token_embedding);
  r(w.rms_final);
  r(w.classifier);
  for (auto& l : w.layers)
    for (auto* v : {&l.rms_att, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.wo, &l.rms_ffn, &l.w1, &l.w2, &l.w3}) r(*v);
  return w;
}

}  // namespace sieve::test
