// SeerAttention-R gate weights: W_q and W_k of every layer and KV head, in one safetensors file
//   layers.{L}.wq  F32 [n_kv_heads, gate_dim, g * head_dim]   (g = n_q_heads / n_kv_heads)
//   layers.{L}.wk  F32 [n_kv_heads, gate_dim, 3 * head_dim]   ([max | min | mean] pooled keys)
// with string metadata: format = "sieve-seer-gate", block, gate_dim, rmsnorm (0/1), n_layers,
// n_q_heads, n_kv_heads, head_dim, rope_theta. The plugin refuses a file whose shape does not
// match the model geometry or whose block / rmsnorm differ from the instance's parameters.
#pragma once
#include <sieve/abi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sieve::seer {

struct GateShape {
  int32_t n_layers = 0;
  int32_t n_q_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block = 64;
  int32_t gate_dim = 0;
  bool rmsnorm = false;
  float rope_theta = 10000.f;

  int32_t group() const { return n_kv_heads > 0 ? n_q_heads / n_kv_heads : 0; }
  int32_t group_dim() const { return group() * head_dim; }  // W_q input width
  int32_t pooled_dim() const { return 3 * head_dim; }       // W_k input width
  int64_t wq_head_elems() const { return int64_t(gate_dim) * group_dim(); }
  int64_t wk_head_elems() const { return int64_t(gate_dim) * pooled_dim(); }
  // Why this cannot be a gate ("" when it can).
  std::string problem() const;
};

struct GateWeights {
  GateShape shape;
  std::vector<float> wq;  // [n_layers, n_kv_heads, gate_dim, g * head_dim]
  std::vector<float> wk;  // [n_layers, n_kv_heads, gate_dim, 3 * head_dim]

  float* wq_at(int32_t layer, int32_t kv_head) {
    return wq.data() + (int64_t(layer) * shape.n_kv_heads + kv_head) * shape.wq_head_elems();
  }
  float* wk_at(int32_t layer, int32_t kv_head) {
    return wk.data() + (int64_t(layer) * shape.n_kv_heads + kv_head) * shape.wk_head_elems();
  }
  const float* wq_at(int32_t layer, int32_t kv_head) const {
    return const_cast<GateWeights*>(this)->wq_at(layer, kv_head);
  }
  const float* wk_at(int32_t layer, int32_t kv_head) const {
    return const_cast<GateWeights*>(this)->wk_at(layer, kv_head);
  }
};

// The shape a file declares, with every tensor's presence and shape checked (no data read).
// Throws sieve::Error with one line naming the file.
GateShape read_gate_shape(const std::string& path);
GateWeights read_gate(const std::string& path);
void write_gate(const std::string& path, const GateWeights& w);

// PyTorch nn.Linear's initialisation, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), from a fixed
// generator (deterministic per seed on every platform).
GateWeights random_gate(const GateShape& shape, uint64_t seed);

// Why a gate of `file` shape cannot serve this geometry with these parameters (one line per
// reason; empty when it can).
std::vector<std::string> gate_mismatch(const GateShape& file, const sieve_geometry& g, int32_t block,
                                       bool rmsnorm);

// Uniform double in [0, 1) from a 64-bit Mersenne Twister draw (portable, unlike the std
// distributions).
double unit_uniform(uint64_t draw);

}  // namespace sieve::seer
