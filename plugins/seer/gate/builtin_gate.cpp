// Built-in training-free gates (see builtin_gate.hpp): weights built in memory, no file.
#include "gate/builtin_gate.hpp"

#include <sieve/util/error.hpp>

namespace sieve::seer {

bool is_builtin_gate(const std::string& weights) { return weights.rfind(kBuiltinPrefix, 0) == 0; }

std::string builtin_gate_problem(const std::string& weights) {
  if (weights == "builtin:mean") return {};
  return "weights = " + weights + ": unknown built-in gate (known: builtin:mean)";
}

GateWeights builtin_gate(const std::string& weights, const sieve_geometry& g, int32_t block, bool rmsnorm) {
  if (std::string why = builtin_gate_problem(weights); !why.empty()) throw Error(SIEVE_ERR_INVALID_ARGUMENT, why);
  GateWeights w;
  GateShape& s = w.shape;
  s.n_layers = g.n_layers;
  s.n_q_heads = g.n_q_heads;
  s.n_kv_heads = g.n_kv_heads;
  s.head_dim = g.head_dim;
  s.block = block;
  s.gate_dim = g.head_dim;
  s.rmsnorm = rmsnorm;
  s.rope_theta = 0.f;  // no rotation (gate_math.hpp)
  const int32_t d = g.head_dim, group = s.group();
  w.wq.assign(size_t(s.n_layers) * s.n_kv_heads * s.wq_head_elems(), 0.f);
  w.wk.assign(size_t(s.n_layers) * s.n_kv_heads * s.wk_head_elems(), 0.f);
  for (int32_t layer = 0; layer < s.n_layers; ++layer)
    for (int32_t h = 0; h < s.n_kv_heads; ++h) {
      float* wq = w.wq_at(layer, h);  // [gate_dim, group * d]: the group's mean query
      float* wk = w.wk_at(layer, h);  // [gate_dim, 3 * d]: the mean-pooled key
      for (int32_t r = 0; r < d; ++r) {
        for (int32_t j = 0; j < group; ++j) wq[int64_t(r) * group * d + int64_t(j) * d + r] = 1.f / float(group);
        wk[int64_t(r) * 3 * d + 2 * d + r] = 1.f;
      }
    }
  return w;
}

}  // namespace sieve::seer
