#include "sieve/model/hf_config.hpp"

#include <cfloat>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>

#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"
#include "sieve/util/printable.hpp"

namespace sieve::model {

using nlohmann::json;

namespace {

class Reader {
 public:
  Reader(const json& c, const std::string& name) : c_(c), name_(name) {}

  [[noreturn]] void refuse(const std::string& what) const {
    fail(SIEVE_ERR_INVALID_ARGUMENT, file_label("model", name_) + ": " + what);
  }
  // The value of `key`, or nullptr when absent or null.
  const json* find(const json& obj, const char* key) const {
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  std::string shown(const json& v) const { return printable(v.dump(), 64); }

  int32_t integer(const char* key, std::optional<int32_t> fallback, int64_t lo = 1, int64_t hi = INT32_MAX) const {
    const json* v = find(c_, key);
    if (!v) {
      if (!fallback) refuse(std::string("config.json has no '") + key + "'");
      return *fallback;
    }
    if (!v->is_number_integer())
      refuse(std::string("config.json: '") + key + "' must be an integer, got " + shown(*v));
    // Compared in the type JSON holds, before any narrowing (4294967360 must not become 64).
    const bool in_range = v->is_number_unsigned()
                              ? v->get<uint64_t>() <= uint64_t(hi) && int64_t(v->get<uint64_t>()) >= lo
                              : v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
    if (!in_range)
      refuse(std::string("config.json: '") + key + "' = " + shown(*v) + " is outside [" + std::to_string(lo) + ", " +
             std::to_string(hi) + "]");
    return int32_t(v->get<int64_t>());
  }
  float real(const json& obj, const char* key, float fallback) const {
    const json* v = find(obj, key);
    if (!v) return fallback;
    if (!v->is_number()) refuse(std::string("config.json: '") + key + "' must be a number, got " + shown(*v));
    const double d = v->get<double>();
    if (!std::isfinite(d) || std::fabs(d) > double(FLT_MAX))
      refuse(std::string("config.json: '") + key + "' = " + shown(*v) + " does not fit a 32-bit float");
    return float(d);
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = find(c_, key);
    if (!v) return fallback;
    if (!v->is_boolean()) refuse(std::string("config.json: '") + key + "' must be true or false, got " + shown(*v));
    return v->get<bool>();
  }
  std::string text(const json& obj, const char* key, const std::string& fallback) const {
    const json* v = find(obj, key);
    if (!v) return fallback;
    if (!v->is_string()) refuse(std::string("config.json: '") + key + "' must be a string, got " + shown(*v));
    return v->get<std::string>();
  }

 private:
  const json& c_;
  const std::string& name_;
};

}  // namespace

ModelConfig parse_hf_config(const std::string& text, const std::string& name) {
  json c;
  try {
    c = json::parse(text);
  } catch (const std::exception& e) {
    fail(SIEVE_ERR_INVALID_ARGUMENT, file_label("model", name) + ": not JSON: " + printable(e.what()));
  }
  const Reader r(c, name);
  if (!c.is_object()) r.refuse("not a JSON object");
  const std::string model_type = r.text(c, "model_type", "");
  if (model_type != "llama" && model_type != "qwen2")
    r.refuse("model_type '" + printable(model_type, 64) + "' is not supported (llama, qwen2)");
  ModelConfig m;
  m.dim = r.integer("hidden_size", std::nullopt);
  m.hidden_dim = r.integer("intermediate_size", std::nullopt);
  m.n_layers = r.integer("num_hidden_layers", std::nullopt);
  m.n_heads = r.integer("num_attention_heads", std::nullopt);
  m.n_kv_heads = r.integer("num_key_value_heads", m.n_heads);
  m.vocab_size = r.integer("vocab_size", std::nullopt);
  m.seq_len = r.integer("max_position_embeddings", 2048);
  m.rope_theta = r.real(c, "rope_theta", 10000.f);
  // transformers 5 writes the RoPE settings as rope_parameters {rope_type, rope_theta, ...}.
  if (const json* rp = r.find(c, "rope_parameters")) {
    if (!rp->is_object()) r.refuse("rope_parameters is not an object");
    const std::string type = r.text(*rp, "rope_type", "default");
    if (type != "default")
      r.refuse("rope_parameters.rope_type '" + printable(type, 64) + "' is not supported (default)");
    m.rope_theta = r.real(*rp, "rope_theta", m.rope_theta);
  }
  m.norm_eps = r.real(c, "rms_norm_eps", 1e-6f);
  m.shared_classifier = r.boolean("tie_word_embeddings", false);
  m.qkv_bias = model_type == "qwen2" ? true : r.boolean("attention_bias", false);
  if (const json* rs = r.find(c, "rope_scaling")) r.refuse("rope_scaling " + r.shown(*rs) + " is not supported");
  if (r.boolean("mlp_bias", false)) r.refuse("mlp_bias is not supported");
  if (const std::string act = r.text(c, "hidden_act", "silu"); act != "silu")
    r.refuse("hidden_act '" + printable(act, 64) + "' is not supported (silu)");
  if (model_type == "qwen2" && r.boolean("use_sliding_window", false)) r.refuse("use_sliding_window is not supported");
  if (std::string pr = m.problem(); !pr.empty()) r.refuse("impossible config: " + pr);
  if (r.find(c, "head_dim") && r.integer("head_dim", std::nullopt) != m.head_dim())
    r.refuse("head_dim " + r.shown(c["head_dim"]) + " differs from hidden_size / num_attention_heads = " +
             std::to_string(m.head_dim()) + " (not supported)");
  return m;
}

}  // namespace sieve::model
