#include "sieve/model/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "sieve/model/llama2c.hpp"
#include "sieve/model/safetensors_file.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/half.hpp"

namespace sieve::model {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

[[noreturn]] void refuse(const std::string& file, const std::string& what) {
  fail(SIEVE_ERR_INVALID_ARGUMENT, "model '" + file + "': " + what);
}

using TensorEntry = SafetensorsEntry;

void read_header(const std::string& file, std::map<std::string, TensorEntry>* out) {
  SafetensorsHeader h;
  read_safetensors_header(file, &h, "model");
  for (auto& [name, e] : h.tensors) (*out)[name] = std::move(e);
}

std::vector<float> read_tensor(const TensorEntry& e, const std::string& name) {
  return read_safetensors_tensor(e, name, "model");
}

template <class T>
T config_value(const json& c, const std::string& file, const char* key, const T* fallback) {
  if (!c.contains(key) || c[key].is_null()) {
    if (!fallback) refuse(file, std::string("config.json has no '") + key + "'");
    return *fallback;
  }
  try {
    return c[key].get<T>();
  } catch (const std::exception&) {
    refuse(file, std::string("config.json: '") + key + "' has the wrong type: " + c[key].dump());
  }
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
  if (!fs::exists(p, ec)) fail(SIEVE_ERR_NOT_FOUND, "model '" + path + "': no such file or directory");
  const fs::path dir = fs::is_directory(p, ec) ? p : p.parent_path().empty() ? fs::path(".") : p.parent_path();
  const std::string config_path = (dir / "config.json").string();

  // config.json
  json c;
  {
    std::ifstream f(config_path);
    if (!f) fail(SIEVE_ERR_NOT_FOUND, "model '" + path + "': no config.json beside the weights (" + config_path + ")");
    try {
      c = json::parse(f);
    } catch (const std::exception& e) {
      refuse(config_path, std::string("not JSON: ") + e.what());
    }
  }
  if (!c.is_object()) refuse(config_path, "not a JSON object");
  const std::string none;
  const std::string model_type = config_value<std::string>(c, config_path, "model_type", &none);
  if (model_type != "llama" && model_type != "qwen2")
    refuse(config_path, "model_type '" + model_type + "' is not supported (llama, qwen2)");
  ModelConfig m;
  m.dim = config_value<int32_t>(c, config_path, "hidden_size", nullptr);
  m.hidden_dim = config_value<int32_t>(c, config_path, "intermediate_size", nullptr);
  m.n_layers = config_value<int32_t>(c, config_path, "num_hidden_layers", nullptr);
  m.n_heads = config_value<int32_t>(c, config_path, "num_attention_heads", nullptr);
  m.n_kv_heads = config_value<int32_t>(c, config_path, "num_key_value_heads", &m.n_heads);
  m.vocab_size = config_value<int32_t>(c, config_path, "vocab_size", nullptr);
  const int32_t default_seq = 2048;
  m.seq_len = config_value<int32_t>(c, config_path, "max_position_embeddings", &default_seq);
  const float theta = 10000.f, eps = 1e-6f;
  m.rope_theta = config_value<float>(c, config_path, "rope_theta", &theta);
  // transformers 5 writes the RoPE settings as rope_parameters {rope_type, rope_theta, ...}.
  if (c.contains("rope_parameters") && !c["rope_parameters"].is_null()) {
    const json& rp = c["rope_parameters"];
    if (!rp.is_object()) refuse(config_path, "rope_parameters is not an object");
    const std::string deflt = "default";
    const std::string type = config_value<std::string>(rp, config_path, "rope_type", &deflt);
    if (type != "default") refuse(config_path, "rope_parameters.rope_type '" + type + "' is not supported (default)");
    m.rope_theta = config_value<float>(rp, config_path, "rope_theta", &m.rope_theta);
  }
  m.norm_eps = config_value<float>(c, config_path, "rms_norm_eps", &eps);
  const bool no = false;
  m.shared_classifier = config_value<bool>(c, config_path, "tie_word_embeddings", &no);
  m.qkv_bias = model_type == "qwen2" ? true : config_value<bool>(c, config_path, "attention_bias", &no);
  if (c.contains("rope_scaling") && !c["rope_scaling"].is_null())
    refuse(config_path, "rope_scaling " + c["rope_scaling"].dump() + " is not supported");
  if (config_value<bool>(c, config_path, "mlp_bias", &no)) refuse(config_path, "mlp_bias is not supported");
  if (c.contains("hidden_act") && c["hidden_act"] != "silu")
    refuse(config_path, "hidden_act " + c["hidden_act"].dump() + " is not supported (silu)");
  if (model_type == "qwen2" && config_value<bool>(c, config_path, "use_sliding_window", &no))
    refuse(config_path, "use_sliding_window is not supported");
  if (std::string pr = m.problem(); !pr.empty()) refuse(config_path, "impossible config: " + pr);
  if (c.contains("head_dim") && !c["head_dim"].is_null() &&
      config_value<int32_t>(c, config_path, "head_dim", nullptr) != m.head_dim())
    refuse(config_path, "head_dim " + c["head_dim"].dump() + " differs from hidden_size / num_attention_heads = " +
                            std::to_string(m.head_dim()) + " (not supported)");

  // The weight files.
  std::vector<std::string> files;
  if (p.extension() == ".safetensors") {
    files.push_back(p.string());
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    files.push_back((dir / "model.safetensors").string());
  } else if (fs::exists(dir / "model.safetensors.index.json", ec)) {
    const std::string index = (dir / "model.safetensors.index.json").string();
    std::ifstream f(index);
    json ij;
    try {
      ij = json::parse(f);
    } catch (const std::exception& e) {
      refuse(index, std::string("not JSON: ") + e.what());
    }
    if (!ij.contains("weight_map") || !ij["weight_map"].is_object()) refuse(index, "has no weight_map object");
    for (const auto& [name, shard] : ij["weight_map"].items()) {
      if (!shard.is_string()) refuse(index, "weight_map['" + name + "'] is not a file name");
      std::string s = (dir / shard.get<std::string>()).string();
      if (std::find(files.begin(), files.end(), s) == files.end()) files.push_back(s);
    }
  } else {
    fail(SIEVE_ERR_NOT_FOUND, "model '" + path + "': neither model.safetensors nor model.safetensors.index.json in " +
                                  dir.string());
  }
  std::map<std::string, TensorEntry> tensors;
  for (const auto& f : files) read_header(f, &tensors);

  const int64_t D = m.dim, F = m.hidden_dim, V = m.vocab_size, KV = m.kv_dim();
  auto get = [&](const std::string& name, std::vector<int64_t> shape) {
    auto it = tensors.find(name);
    if (it == tensors.end()) refuse(files.size() == 1 ? files[0] : dir.string(), "tensor '" + name + "' is missing");
    if (it->second.shape != shape) {
      auto str = [](const std::vector<int64_t>& s) {
        std::string r = "[";
        for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
        return r + "]";
      };
      refuse(it->second.file, "tensor '" + name + "' has shape " + str(it->second.shape) + ", config.json implies " +
                                  str(shape));
    }
    return read_tensor(it->second, name);
  };

  ModelWeights w;
  w.config = m;
  w.source = path;
  w.format = "safetensors";
  w.token_embedding = get("model.embed_tokens.weight", {V, D});
  w.layers.resize(size_t(m.n_layers));
  for (int32_t i = 0; i < m.n_layers; ++i) {
    const std::string pre = "model.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[size_t(i)];
    l.rms_att = get(pre + "input_layernorm.weight", {D});
    l.wq = unpermute_rope_rows(get(pre + "self_attn.q_proj.weight", {D, D}), m.n_heads, m.head_dim(), D);
    l.wk = unpermute_rope_rows(get(pre + "self_attn.k_proj.weight", {KV, D}), m.n_kv_heads, m.head_dim(), D);
    l.wv = get(pre + "self_attn.v_proj.weight", {KV, D});
    if (m.qkv_bias) {
      l.bq = unpermute_rope_rows(get(pre + "self_attn.q_proj.bias", {D}), m.n_heads, m.head_dim(), 1);
      l.bk = unpermute_rope_rows(get(pre + "self_attn.k_proj.bias", {KV}), m.n_kv_heads, m.head_dim(), 1);
      l.bv = get(pre + "self_attn.v_proj.bias", {KV});
    }
    l.wo = get(pre + "self_attn.o_proj.weight", {D, D});
    l.rms_ffn = get(pre + "post_attention_layernorm.weight", {D});
    l.w1 = get(pre + "mlp.gate_proj.weight", {F, D});
    l.w2 = get(pre + "mlp.down_proj.weight", {D, F});
    l.w3 = get(pre + "mlp.up_proj.weight", {F, D});
  }
  w.rms_final = get("model.norm.weight", {D});
  if (!m.shared_classifier) {
    if (!tensors.count("lm_head.weight"))
      refuse(config_path, "tie_word_embeddings is false but no tensor 'lm_head.weight' exists");
    w.classifier = get("lm_head.weight", {V, D});
  }
  return w;
}

}  // namespace sieve::model
