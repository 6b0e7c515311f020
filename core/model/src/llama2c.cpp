#include "sieve/model/llama2c.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>

#include "sieve/util/error.hpp"

namespace sieve::model {

namespace {
constexpr int64_t kHeaderBytes = 7 * 4;
constexpr int32_t kVersionedMagic = 0x616b3432;  // "ak42": llama2.c export versions 1 and 2

[[noreturn]] void refuse(const std::string& name, const std::string& what) {
  fail(SIEVE_ERR_INVALID_ARGUMENT, "model '" + name + "': " + what);
}
}  // namespace

std::vector<std::byte> read_file_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  if (!f) fail(SIEVE_ERR_NOT_FOUND, "'" + path + "': cannot open: " + std::strerror(errno));
  const std::streamoff n = f.tellg();
  if (n < 0) fail(SIEVE_ERR_INVALID_ARGUMENT, "'" + path + "': cannot read its size");
  std::vector<std::byte> bytes(static_cast<size_t>(n));
  f.seekg(0);
  if (n > 0 && !f.read(reinterpret_cast<char*>(bytes.data()), n))
    fail(SIEVE_ERR_INVALID_ARGUMENT, "'" + path + "': read failed");
  return bytes;
}

ModelWeights parse_llama2c(std::span<const std::byte> bytes, const std::string& name) {
  const int64_t size = int64_t(bytes.size());
  if (size < kHeaderBytes)
    refuse(name, "truncated llama2.c checkpoint: " + std::to_string(size) + " bytes, the header alone is " +
                     std::to_string(kHeaderBytes));
  int32_t h[7];
  std::memcpy(h, bytes.data(), sizeof h);
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

  // Expected length, in int64 (the header's values are < 2^31, their products are not).
  const int64_t D = c.dim, F = c.hidden_dim, L = c.n_layers, V = c.vocab_size, KV = c.kv_dim();
  const int64_t per_layer = D + D * D + 2 * KV * D + D * D + D + 3 * F * D;
  const int64_t rope_tables = 2 * (int64_t(c.seq_len) * c.head_dim() / 2);
  const int64_t floats = V * D + L * per_layer + D + rope_tables + (c.shared_classifier ? 0 : V * D);
  const int64_t expected = kHeaderBytes + 4 * floats;
  if (size < expected)
    refuse(name, "truncated llama2.c checkpoint: the header implies " + std::to_string(expected) +
                     " bytes, the file has " + std::to_string(size));
  if (size > expected)
    refuse(name, "the file has " + std::to_string(size) + " bytes but its llama2.c header implies " +
                     std::to_string(expected) + " (not a legacy llama2.c checkpoint, or a wrong header)");

  ModelWeights w;
  w.config = c;
  w.source = name;
  w.format = "llama2.c";
  int64_t at = kHeaderBytes;
  auto take = [&](int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    std::memcpy(v.data(), bytes.data() + at, size_t(n) * 4);
    at += 4 * n;
    return v;
  };
  w.token_embedding = take(V * D);
  w.layers.resize(size_t(L));
  // Each tensor is stored for all layers at once: [L, ...].
  for (auto& l : w.layers) l.rms_att = take(D);
  for (auto& l : w.layers) l.wq = take(D * D);
  for (auto& l : w.layers) l.wk = take(KV * D);
  for (auto& l : w.layers) l.wv = take(KV * D);
  for (auto& l : w.layers) l.wo = take(D * D);
  for (auto& l : w.layers) l.rms_ffn = take(D);
  for (auto& l : w.layers) l.w1 = take(F * D);
  for (auto& l : w.layers) l.w2 = take(D * F);
  for (auto& l : w.layers) l.w3 = take(F * D);
  w.rms_final = take(D);
  at += 4 * rope_tables;
  if (!c.shared_classifier) w.classifier = take(V * D);
  return w;
}

ModelWeights load_llama2c(const std::string& path) {
  std::vector<std::byte> bytes = read_file_bytes(path);
  return parse_llama2c(bytes, path);
}

}  // namespace sieve::model
