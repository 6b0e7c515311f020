#include "sieve/model/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "sieve/model/hf_config.hpp"
#include "sieve/model/safetensors_file.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"
#include "sieve/util/printable.hpp"

namespace sieve::model {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void refuse(const std::string& file, const std::string& what) {
  fail(SIEVE_ERR_INVALID_ARGUMENT, file_label("model", file) + ": " + what);
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

// One tensor of a layer: where it goes, its shape, and the RoPE row permutation it needs
// (rope_heads > 0: unpermute_rope_rows over that many heads, rope_cols columns).
struct LayerTensor {
  std::string suffix;
  std::vector<float> LayerWeights::*field;
  std::vector<int64_t> shape;
  int32_t rope_heads = 0;
  int64_t rope_cols = 0;
};

std::vector<LayerTensor> layer_tensors(const ModelConfig& m) {
  const int64_t D = m.dim, F = m.hidden_dim, KV = m.kv_dim();
  std::vector<LayerTensor> t = {
      {"input_layernorm.weight", &LayerWeights::rms_att, {D}},
      {"self_attn.q_proj.weight", &LayerWeights::wq, {D, D}, m.n_heads, D},
      {"self_attn.k_proj.weight", &LayerWeights::wk, {KV, D}, m.n_kv_heads, D},
      {"self_attn.v_proj.weight", &LayerWeights::wv, {KV, D}},
      {"self_attn.o_proj.weight", &LayerWeights::wo, {D, D}},
      {"post_attention_layernorm.weight", &LayerWeights::rms_ffn, {D}},
      {"mlp.gate_proj.weight", &LayerWeights::w1, {F, D}},
      {"mlp.down_proj.weight", &LayerWeights::w2, {D, F}},
      {"mlp.up_proj.weight", &LayerWeights::w3, {F, D}}};
  if (m.qkv_bias) {
    t.push_back({"self_attn.q_proj.bias", &LayerWeights::bq, {D}, m.n_heads, 1});
    t.push_back({"self_attn.k_proj.bias", &LayerWeights::bk, {KV}, m.n_kv_heads, 1});
    t.push_back({"self_attn.v_proj.bias", &LayerWeights::bv, {KV}});
  }
  return t;
}

std::string layer_prefix(int32_t i) { return "model.layers." + std::to_string(i) + "."; }

// The weight files of a checkpoint directory (model.safetensors or the shards of the index).
std::vector<std::string> weight_files(const fs::path& p, const fs::path& dir) {
  std::error_code ec;
  if (p.extension() == ".safetensors") return {p.string()};
  if (fs::exists(dir / "model.safetensors", ec)) return {(dir / "model.safetensors").string()};
  const fs::path index = dir / "model.safetensors.index.json";
  if (!fs::exists(index, ec))
    fail(SIEVE_ERR_NOT_FOUND, file_label("model", p.string()) +
                                  ": neither model.safetensors nor model.safetensors.index.json in " +
                                  printable(dir.string()));
  json ij;
  try {
    ij = json::parse(read_text_file(index.string(), "model", kMaxHfConfigBytes));
  } catch (const json::exception& e) {
    refuse(index.string(), std::string("not JSON: ") + printable(e.what()));
  }
  if (!ij.is_object() || !ij.contains("weight_map") || !ij["weight_map"].is_object())
    refuse(index.string(), "has no weight_map object");
  std::vector<std::string> files;
  for (const auto& [name, shard] : ij["weight_map"].items()) {
    if (!shard.is_string()) refuse(index.string(), "weight_map['" + printable(name) + "'] is not a file name");
    std::string s = (dir / shard.get<std::string>()).string();
    if (std::find(files.begin(), files.end(), s) == files.end()) files.push_back(s);
  }
  return files;
}

}  // namespace

std::vector<float> unpermute_rope_rows(const std::vector<float>& hf, int32_t n_heads, int32_t head_dim,
                                       int64_t cols) {
  std::vector<float> out(hf.size());
  const int32_t half = head_dim / 2;
  for (int32_t h = 0; h < n_heads; ++h)
    for (int32_t i = 0; i < half; ++i)
      for (int32_t c = 0; c < 2; ++c) {
        const int64_t dst = int64_t(h) * head_dim + 2 * i + c, src = int64_t(h) * head_dim + c * half + i;
        std::memcpy(out.data() + dst * cols, hf.data() + src * cols, size_t(cols) * 4);
      }
  return out;
}

ModelWeights load_safetensors(const std::string& path) {
  std::error_code ec;
  fs::path p(path);
  const fs::file_status st = fs::status(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    fail(SIEVE_ERR_INVALID_ARGUMENT, file_label("model", path) + ": cannot open: " +
                                         (ec == std::errc::too_many_symbolic_link_levels
                                              ? std::string("symlink loop (too many levels of symbolic links)")
                                              : ec.message()));
  if (!fs::exists(st)) fail(SIEVE_ERR_NOT_FOUND, file_label("model", path) + ": no such file or directory");
  const fs::path dir = fs::is_directory(st) ? p : p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string config_path = (dir / "config.json").string();
  const ModelConfig m = parse_hf_config(read_text_file(config_path, "model", kMaxHfConfigBytes), config_path);

  const std::vector<std::string> files = weight_files(p, dir);
  std::map<std::string, SafetensorsEntry> tensors;
  for (const auto& f : files) {
    SafetensorsHeader h;
    read_safetensors_header(f, &h, "model");
    for (auto& [name, e] : h.tensors) tensors[name] = std::move(e);
  }

  // Every tensor is found and its shape and dtype checked before anything is allocated: a
  // config.json claiming 2^22 layers is refused at the first missing tensor, not after sizing
  // 2^22 layers; and then what is read is bounded by the files' lengths.
  const int64_t D = m.dim, V = m.vocab_size;
  const std::vector<LayerTensor> per_layer = layer_tensors(m);
  auto find = [&](const std::string& name, const std::vector<int64_t>& shape) -> const SafetensorsEntry& {
    auto it = tensors.find(name);
    if (it == tensors.end())
      refuse(files.size() == 1 ? files[0] : dir.string(), "tensor '" + name + "' is missing");
    if (it->second.shape != shape)
      refuse(it->second.file, "tensor '" + name + "' has shape " + shape_text(it->second.shape) +
                                  ", config.json implies " + shape_text(shape));
    const std::string& dt = it->second.dtype;
    if (dt != "F32" && dt != "F16" && dt != "BF16")
      refuse(it->second.file, "tensor '" + name + "' has dtype " + printable(dt, 32) + "; supported: F32, F16, BF16");
    return it->second;
  };
  if (!m.shared_classifier && !tensors.count("lm_head.weight"))
    refuse(config_path, "tie_word_embeddings is false but no tensor 'lm_head.weight' exists");
  find("model.embed_tokens.weight", {V, D});
  for (int32_t i = 0; i < m.n_layers; ++i)
    for (const LayerTensor& t : per_layer) find(layer_prefix(i) + t.suffix, t.shape);
  find("model.norm.weight", {D});
  if (!m.shared_classifier) find("lm_head.weight", {V, D});

  auto get = [&](const std::string& name, const std::vector<int64_t>& shape) {
    return read_safetensors_tensor(find(name, shape), name, "model");
  };
  ModelWeights w;
  w.config = m;
  w.source = path;
  w.format = "safetensors";
  w.token_embedding = get("model.embed_tokens.weight", {V, D});
  w.layers.resize(size_t(m.n_layers));
  for (int32_t i = 0; i < m.n_layers; ++i)
    for (const LayerTensor& t : per_layer) {
      std::vector<float> v = get(layer_prefix(i) + t.suffix, t.shape);
      w.layers[size_t(i)].*t.field = t.rope_heads ? unpermute_rope_rows(v, t.rope_heads, m.head_dim(), t.rope_cols)
                                                  : std::move(v);
    }
  w.rms_final = get("model.norm.weight", {D});
  if (!m.shared_classifier) w.classifier = get("lm_head.weight", {V, D});
  return w;
}

}  // namespace sieve::model
