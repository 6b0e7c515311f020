#include "sieve/model/model.hpp"

#include <filesystem>

#include "sieve/model/llama2c.hpp"
#include "sieve/model/safetensors.hpp"

namespace sieve::model {

std::string ModelConfig::problem() const {
  auto positive = [](const char* what, int32_t v) -> std::string {
    return v > 0 ? "" : std::string(what) + " = " + std::to_string(v) + " must be positive";
  };
  for (auto [what, v] : {std::pair{"dim", dim}, {"hidden_dim", hidden_dim}, {"n_layers", n_layers},
                         {"n_heads", n_heads}, {"n_kv_heads", n_kv_heads}, {"vocab_size", vocab_size},
                         {"seq_len", seq_len}}) {
    std::string p = positive(what, v);
    if (!p.empty()) return p;
  }
  if (dim % n_heads != 0)
    return "dim = " + std::to_string(dim) + " is not a multiple of n_heads = " + std::to_string(n_heads);
  if (n_heads % n_kv_heads != 0)
    return "n_heads = " + std::to_string(n_heads) + " is not a multiple of n_kv_heads = " +
           std::to_string(n_kv_heads);
  if (head_dim() % 2 != 0)
    return "head_dim = " + std::to_string(head_dim()) + " is odd (RoPE rotates channel pairs)";
  if (!(rope_theta > 0.f)) return "rope_theta = " + std::to_string(rope_theta) + " must be positive";
  if (!(norm_eps > 0.f)) return "norm_eps = " + std::to_string(norm_eps) + " must be positive";
  return {};
}

int64_t ModelWeights::parameter_count() const {
  int64_t n = int64_t(token_embedding.size() + rms_final.size() + classifier.size());
  for (const auto& l : layers)
    for (const auto* v : {&l.rms_att, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.wo, &l.rms_ffn, &l.w1,
                          &l.w2, &l.w3})
      n += int64_t(v->size());
  return n;
}

ModelWeights load_model(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  const std::string ext = p.extension().string();
  if (fs::is_directory(p, ec) || ext == ".safetensors" || ext == ".json") return load_safetensors(path);
  return load_llama2c(path);
}

}  // namespace sieve::model
