#include "gate_file.hpp"

#include <sieve/model/safetensors_file.hpp>
#include <sieve/util/error.hpp>
#include <sieve/util/file_input.hpp>
#include <sieve/util/printable.hpp>

#include <charconv>
#include <cmath>
#include <random>

namespace sieve::seer {

namespace {

constexpr const char* kWhat = "gate weights";
constexpr const char* kFormat = "sieve-seer-gate";

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

[[noreturn]] void refuse(const std::string& path, const std::string& what) {
  fail(SIEVE_ERR_INVALID_ARGUMENT, file_label(kWhat, path) + ": " + what);
}

const std::string& meta(const model::SafetensorsHeader& h, const std::string& path, const char* key) {
  auto it = h.metadata.find(key);
  if (it == h.metadata.end()) refuse(path, std::string("metadata has no '") + key + "' (not a sieve distill-gate file?)");
  return it->second;
}

// The whole string must be a decimal int32: "4294967301" is refused, not wrapped to 5.
int32_t meta_int(const model::SafetensorsHeader& h, const std::string& path, const char* key) {
  const std::string& text = meta(h, path, key);
  int32_t v = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec == std::errc::result_out_of_range)
    refuse(path, std::string("metadata '") + key + "' = '" + printable(text, 64) + "' is outside the int32 range");
  if (ec != std::errc() || end != text.data() + text.size() || text.empty())
    refuse(path, std::string("metadata '") + key + "' = '" + printable(text, 64) + "' is not an integer");
  return v;
}

std::string wq_name(int32_t L) { return "layers." + std::to_string(L) + ".wq"; }
std::string wk_name(int32_t L) { return "layers." + std::to_string(L) + ".wk"; }

GateShape parse(const model::SafetensorsHeader& h, const std::string& path) {
  auto fmt = h.metadata.find("format");
  if (fmt == h.metadata.end() || fmt->second != kFormat)
    refuse(path, std::string("metadata 'format' is not '") + kFormat + "' (not a sieve distill-gate file?)");
  GateShape s;
  s.n_layers = meta_int(h, path, "n_layers");
  s.n_q_heads = meta_int(h, path, "n_q_heads");
  s.n_kv_heads = meta_int(h, path, "n_kv_heads");
  s.head_dim = meta_int(h, path, "head_dim");
  s.block = meta_int(h, path, "block");
  s.gate_dim = meta_int(h, path, "gate_dim");
  s.rmsnorm = meta_int(h, path, "rmsnorm") != 0;
  if (h.metadata.count("rope_theta")) {
    const std::string& text = meta(h, path, "rope_theta");
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), s.rope_theta);
    if (ec != std::errc() || end != text.data() + text.size() || text.empty() || !std::isfinite(s.rope_theta))
      refuse(path, "metadata 'rope_theta' = '" + printable(text, 64) + "' is not a finite 32-bit float");
  }
  if (std::string p = s.problem(); !p.empty()) refuse(path, p);
  for (int32_t L = 0; L < s.n_layers; ++L) {
    const std::pair<std::string, std::vector<int64_t>> want[] = {
        {wq_name(L), {s.n_kv_heads, s.gate_dim, s.group_dim()}},
        {wk_name(L), {s.n_kv_heads, s.gate_dim, s.pooled_dim()}}};
    for (const auto& [name, shape] : want) {
      auto it = h.tensors.find(name);
      if (it == h.tensors.end()) refuse(path, "tensor '" + name + "' is missing");
      if (it->second.shape != shape)
        refuse(path, "tensor '" + name + "' has shape " + shape_text(it->second.shape) + ", the metadata implies " +
                         shape_text(shape) + " (gate_dim / head counts mismatch)");
    }
  }
  return s;
}

}  // namespace

std::string GateShape::problem() const {
  if (n_layers < 1 || n_q_heads < 1 || n_kv_heads < 1 || head_dim < 1)
    return "n_layers, n_q_heads, n_kv_heads and head_dim must be >= 1";
  // The tensor widths below are int32: sizes whose products do not fit are not a gate.
  if (int64_t(n_q_heads / n_kv_heads) * head_dim > INT32_MAX || 3 * int64_t(head_dim) > INT32_MAX)
    return "head_dim " + std::to_string(head_dim) + " x the GQA group is too large";
  if (n_q_heads % n_kv_heads) return "n_q_heads " + std::to_string(n_q_heads) + " is not a multiple of n_kv_heads " +
                                     std::to_string(n_kv_heads);
  if (gate_dim < 2 || gate_dim % 2) return "gate_dim " + std::to_string(gate_dim) + " must be even and >= 2 (RoPE rotates pairs)";
  if (block != 16 && block != 32 && block != 64 && block != 128)
    return "block " + std::to_string(block) + " is not one of 16, 32, 64, 128";
  return {};
}

GateShape read_gate_shape(const std::string& path) {
  model::SafetensorsHeader h;
  model::read_safetensors_header(path, &h, kWhat);
  return parse(h, path);
}

GateWeights read_gate(const std::string& path) {
  model::SafetensorsHeader h;
  model::read_safetensors_header(path, &h, kWhat);
  GateWeights w;
  w.shape = parse(h, path);
  // Bounded by the file: parse() found every tensor with this shape, and tensors do not overlap.
  const int64_t heads = int64_t(w.shape.n_layers) * w.shape.n_kv_heads;
  w.wq.reserve(size_t(heads * w.shape.wq_head_elems()));
  w.wk.reserve(size_t(heads * w.shape.wk_head_elems()));
  for (int32_t L = 0; L < w.shape.n_layers; ++L) {
    auto q = model::read_safetensors_tensor(h.tensors.at(wq_name(L)), wq_name(L), kWhat);
    auto k = model::read_safetensors_tensor(h.tensors.at(wk_name(L)), wk_name(L), kWhat);  // finite (checked)
    w.wq.insert(w.wq.end(), q.begin(), q.end());
    w.wk.insert(w.wk.end(), k.begin(), k.end());
  }
  return w;
}

void write_gate(const std::string& path, const GateWeights& w) {
  const GateShape& s = w.shape;
  if (std::string p = s.problem(); !p.empty()) fail(SIEVE_ERR_INVALID_ARGUMENT, "write_gate: " + p);
  std::vector<model::SafetensorsTensor> tensors;
  for (int32_t L = 0; L < s.n_layers; ++L) {
    const float* q = w.wq_at(L, 0);
    const float* k = w.wk_at(L, 0);
    tensors.push_back({wq_name(L), {s.n_kv_heads, s.gate_dim, s.group_dim()},
                       std::vector<float>(q, q + s.n_kv_heads * s.wq_head_elems())});
    tensors.push_back({wk_name(L), {s.n_kv_heads, s.gate_dim, s.pooled_dim()},
                       std::vector<float>(k, k + s.n_kv_heads * s.wk_head_elems())});
  }
  char theta[32];
  std::snprintf(theta, sizeof theta, "%.9g", double(s.rope_theta));
  model::write_safetensors(path, tensors,
                           {{"format", kFormat},
                            {"block", std::to_string(s.block)},
                            {"gate_dim", std::to_string(s.gate_dim)},
                            {"rmsnorm", s.rmsnorm ? "1" : "0"},
                            {"n_layers", std::to_string(s.n_layers)},
                            {"n_q_heads", std::to_string(s.n_q_heads)},
                            {"n_kv_heads", std::to_string(s.n_kv_heads)},
                            {"head_dim", std::to_string(s.head_dim)},
                            {"rope_theta", theta}});
}

double unit_uniform(uint64_t draw) { return double(draw >> 11) * 0x1.0p-53; }

GateWeights random_gate(const GateShape& shape, uint64_t seed) {
  if (std::string p = shape.problem(); !p.empty()) fail(SIEVE_ERR_INVALID_ARGUMENT, "random_gate: " + p);
  GateWeights w;
  w.shape = shape;
  std::mt19937_64 rng(seed);
  auto fill = [&](std::vector<float>& v, int64_t n, int32_t fan_in) {
    const double bound = 1.0 / std::sqrt(double(fan_in));
    v.resize(size_t(n));
    for (float& x : v) x = float((2.0 * unit_uniform(rng()) - 1.0) * bound);
  };
  fill(w.wq, int64_t(shape.n_layers) * shape.n_kv_heads * shape.wq_head_elems(), shape.group_dim());
  fill(w.wk, int64_t(shape.n_layers) * shape.n_kv_heads * shape.wk_head_elems(), shape.pooled_dim());
  return w;
}

std::vector<std::string> gate_mismatch(const GateShape& f, const sieve_geometry& g, int32_t block, bool rmsnorm) {
  std::vector<std::string> r;
  auto differ = [&](const char* what, int64_t file, int64_t model) {
    if (file != model)
      r.push_back(std::string("weights: the gate file was made for ") + what + " = " + std::to_string(file) +
                  ", the model has " + std::to_string(model));
  };
  // More layers than the model is accepted (layer L uses the file's layer L): the synthetic
  // conformance session runs one layer of the geometry the static checks declare with four.
  if (f.n_layers < g.n_layers)
    r.push_back("weights: the gate file has " + std::to_string(f.n_layers) + " layers, the model " +
                std::to_string(g.n_layers));
  differ("n_q_heads", f.n_q_heads, g.n_q_heads);
  differ("n_kv_heads", f.n_kv_heads, g.n_kv_heads);
  differ("head_dim", f.head_dim, g.head_dim);
  if (f.block != block)
    r.push_back("block = " + std::to_string(block) + " but the gate file was distilled for block " +
                std::to_string(f.block) + " (pass block=" + std::to_string(f.block) + " or another file)");
  if (f.rmsnorm != rmsnorm)
    r.push_back(std::string("rmsnorm = ") + (rmsnorm ? "true" : "false") + " but the gate file was distilled " +
                (f.rmsnorm ? "with" : "without") + " RMSNorm inside the gate");
  return r;
}

}  // namespace sieve::seer
