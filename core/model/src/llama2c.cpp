#include "sieve/model/llama2c.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>

#include "sieve/util/checked.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"

namespace sieve::model {

namespace {
constexpr int64_t kHeaderBytes = 7 * 4;
constexpr int32_t kVersionedMagic = 0x616b3432;  // "ak42": llama2.c export versions 1 and 2

[[noreturn]] void refuse(const std::string& name, const std::string& what) {
  fail(SIEVE_ERR_INVALID_ARGUMENT, file_label("model", name) + ": " + what);
}

// The shape a header declares, checked against the file's length before anything is allocated.
struct Layout {
  ModelConfig config;
  int64_t rope_tables = 0;  // floats of the two legacy RoPE tables (skipped)
};

Layout check_header(const int32_t (&h)[7], int64_t size, const std::string& name) {
  if (h[0] == kVersionedMagic)
    refuse(name, "llama2.c export version 1+ (magic \"ak42\") is not supported; export with the legacy "
                 "format (version 0)");
  ModelConfig c;
  c.dim = h[0];
  c.hidden_dim = h[1];
  c.n_layers = h[2];
  c.n_heads = h[3];
  c.n_kv_heads = h[4];
  c.shared_classifier = h[5] > 0;
  c.vocab_size = h[5] == INT32_MIN ? 0 : (h[5] < 0 ? -h[5] : h[5]);
  c.seq_len = h[6];
  c.rope_theta = 10000.f;
  c.norm_eps = 1e-5f;
  if (std::string p = c.problem(); !p.empty())
    refuse(name, "impossible llama2.c header (dim " + std::to_string(h[0]) + ", hidden_dim " + std::to_string(h[1]) +
                     ", n_layers " + std::to_string(h[2]) + ", n_heads " + std::to_string(h[3]) + ", n_kv_heads " +
                     std::to_string(h[4]) + ", vocab_size " + std::to_string(h[5]) + ", seq_len " +
                     std::to_string(h[6]) + "): " + p);

  // The expected length, every step checked: a wrapped sum would let a tiny file "match".
  const std::string what = file_label("model", name) + ": the length its llama2.c header implies";
  const int64_t D = c.dim, F = c.hidden_dim, L = c.n_layers, V = c.vocab_size, KV = c.kv_dim();
  auto mul = [&](int64_t a, int64_t b) { return checked_mul(a, b, what); };
  auto add = [&](std::initializer_list<int64_t> xs) {
    int64_t s = 0;
    for (int64_t x : xs) s = checked_add(s, x, what);
    return s;
  };
  const int64_t per_layer = add({D, mul(D, D), mul(2 * KV, D), mul(D, D), D, mul(3 * F, D)});
  Layout out{c, mul(2, mul(c.seq_len, c.head_dim() / 2))};
  const int64_t floats =
      add({mul(V, D), mul(L, per_layer), D, out.rope_tables, c.shared_classifier ? 0 : mul(V, D)});
  const int64_t expected = add({kHeaderBytes, mul(4, floats)});
  if (size < expected)
    refuse(name, "truncated llama2.c checkpoint: the header implies " + std::to_string(expected) +
                     " bytes, the file has " + std::to_string(size));
  if (size > expected)
    refuse(name, "the file has " + std::to_string(size) + " bytes but its llama2.c header implies " +
                     std::to_string(expected) + " (not a legacy llama2.c checkpoint, or a wrong header)");
  return out;
}

// Fills the weights from `read(offset, dst, floats)`; the layout has been checked against the
// length, so every read is inside the file. A tensor with a NaN or an infinity is refused by
// name: it would make every logit NaN and the output silently meaningless.
ModelWeights read_weights(const Layout& layout, const std::string& name,
                          const std::function<void(int64_t, float*, int64_t)>& read) {
  const ModelConfig& c = layout.config;
  const int64_t D = c.dim, F = c.hidden_dim, V = c.vocab_size, KV = c.kv_dim();
  ModelWeights w;
  w.config = c;
  w.source = name;
  w.format = "llama2.c";
  int64_t at = kHeaderBytes;
  auto take = [&](int64_t n, const char* tensor, int32_t layer) {
    std::vector<float> v(static_cast<size_t>(n));
    read(at, v.data(), n);
    at += 4 * n;
    for (float x : v)
      if (!std::isfinite(x))
        refuse(name, std::string("tensor '") + tensor + "'" + (layer >= 0 ? " of layer " + std::to_string(layer) : "") +
                         " holds a non-finite value (NaN or infinity)");
    return v;
  };
  w.token_embedding = take(V * D, "token_embedding", -1);
  w.layers.resize(size_t(c.n_layers));
  // Each tensor is stored for all layers at once: [L, ...].
  auto each = [&](std::vector<float> LayerWeights::*field, int64_t n, const char* tensor) {
    for (int32_t l = 0; l < c.n_layers; ++l) w.layers[size_t(l)].*field = take(n, tensor, l);
  };
  each(&LayerWeights::rms_att, D, "rms_att");
  each(&LayerWeights::wq, D * D, "wq");
  each(&LayerWeights::wk, KV * D, "wk");
  each(&LayerWeights::wv, KV * D, "wv");
  each(&LayerWeights::wo, D * D, "wo");
  each(&LayerWeights::rms_ffn, D, "rms_ffn");
  each(&LayerWeights::w1, F * D, "w1");
  each(&LayerWeights::w2, D * F, "w2");
  each(&LayerWeights::w3, F * D, "w3");
  w.rms_final = take(D, "rms_final", -1);
  at += 4 * layout.rope_tables;
  if (!c.shared_classifier) w.classifier = take(V * D, "classifier", -1);
  return w;
}
}  // namespace

ModelWeights parse_llama2c(std::span<const std::byte> bytes, const std::string& name) {
  const int64_t size = int64_t(bytes.size());
  if (size < kHeaderBytes)
    refuse(name, "truncated llama2.c checkpoint: " + std::to_string(size) + " bytes, the header alone is " +
                     std::to_string(kHeaderBytes));
  int32_t h[7];
  std::memcpy(h, bytes.data(), sizeof h);
  const Layout layout = check_header(h, size, name);
  return read_weights(layout, name, [&](int64_t at, float* dst, int64_t n) {
    std::memcpy(dst, bytes.data() + at, size_t(n) * 4);
  });
}

ModelWeights load_llama2c(const std::string& path) {
  // Read tensor by tensor: the header is checked against the length before any allocation, and
  // the file is never held twice in memory.
  const InputFile f(path, "model");
  const int64_t size = int64_t(f.size());
  if (size < kHeaderBytes)
    refuse(path, "truncated llama2.c checkpoint: " + std::to_string(size) + " bytes, the header alone is " +
                     std::to_string(kHeaderBytes));
  int32_t h[7];
  f.read_at(0, h, sizeof h);
  const Layout layout = check_header(h, size, path);
  return read_weights(layout, path,
                      [&](int64_t at, float* dst, int64_t n) { f.read_at(uint64_t(at), dst, size_t(n) * 4); });
}

}  // namespace sieve::model
