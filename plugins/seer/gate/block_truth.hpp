// The true block attention of one query for one GQA group (paper 002 §2.3): the distillation's
// ground truth and `mode=oracle`'s score (§4.2).
//   p_h(t) = softmax_t(q_h . k_t / sqrt(d)) over the keys t < kv_len, for each of the g heads;
//   truth[j] = max_{h in group} max_{t in block j} p_h(t)        (1D column max-pool, then group max)
//   mass[j]  = (1/g) sum_h sum_{t in block j} p_h(t)              (attention mass, for recall)
// Blocks are [j*block, (j+1)*block) clipped to kv_len; truth is not renormalised here.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace sieve::seer {

// q(h, c): query head h (0..g) channel c, post-RoPE; key(t, c): key t channel c, post-RoPE.
// `logits` is scratch of kv_len doubles.
template <class QFn, class KeyFn>
void block_truth(QFn q, KeyFn key, int32_t g, int32_t d, int64_t kv_len, int32_t block, float* truth, float* mass,
                 std::vector<double>& logits) {
  const int64_t nb = (kv_len + block - 1) / block;
  std::fill(truth, truth + nb, 0.f);
  if (mass) std::fill(mass, mass + nb, 0.f);
  logits.resize(size_t(kv_len));
  const double scale = 1.0 / std::sqrt(double(d));
  for (int32_t h = 0; h < g; ++h) {
    double mx = -INFINITY;
    for (int64_t t = 0; t < kv_len; ++t) {
      double acc = 0.0;
      for (int32_t c = 0; c < d; ++c) acc += double(q(h, c)) * double(key(t, c));
      logits[size_t(t)] = acc * scale;
      mx = std::max(mx, logits[size_t(t)]);
    }
    double sum = 0.0;
    for (int64_t t = 0; t < kv_len; ++t) sum += std::exp(logits[size_t(t)] - mx);
    for (int64_t t = 0; t < kv_len; ++t) {
      const float p = float(std::exp(logits[size_t(t)] - mx) / sum);
      const int64_t j = t / block;
      truth[j] = std::max(truth[j], p);
      if (mass) mass[j] += p / float(g);
    }
  }
}

}  // namespace sieve::seer
