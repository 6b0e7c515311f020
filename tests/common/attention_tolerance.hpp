// The error bound of an attention call on a reference::Workload: tolerance::softmax_sum with the
// magnitudes read from the workload's own inputs (its longest sequence, largest query and key
// norms, largest value), so the bound follows the data a test builds rather than one run's result.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/tolerance.hpp"
#include "sieve/reference/workload.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::tolerance {

// What softmax_sum needs from a workload: its longest sequence, the largest scale ||q|| ||k||
// (bounds every logit's scale * sum |q_i k_i|), the largest value element and value-row norm.
// Resident keys only (a workload's spare pages hold NaN).
struct Magnitudes {
  int64_t keys = 0;
  int32_t head_dim = 0;
  double logit = 0, value = 0, value_row = 0;
};

inline Magnitudes magnitudes(const reference::Workload& w) {
  const reference::WorkloadSpec& s = w.spec;
  const int32_t d = s.head_dim;
  auto norm = [&](const HostTensor& t, int64_t row) {
    double n = 0;
    for (int32_t x = 0; x < d; ++x) n += std::pow(double(t.get(row * d + x)), 2);
    return std::sqrt(n);
  };
  Magnitudes m;
  m.head_dim = d;
  double q = 0, k = 0;
  for (int64_t r = 0; r < int64_t(w.n_q_tokens) * s.n_q_heads; ++r) q = std::max(q, norm(w.q, r));
  for (int32_t b = 0; b < w.batch; ++b) {
    m.keys = std::max<int64_t>(m.keys, w.kv_len[size_t(b)]);
    const int32_t* pages = w.kv_indices.data<int32_t>() + w.kv_indptr.data<int32_t>()[b];
    for (int32_t p = 0; p < w.kv_len[size_t(b)]; ++p)
      for (int32_t g = 0; g < s.n_kv_heads; ++g) {
        const int64_t row = (int64_t(pages[p / s.page_size]) * s.n_kv_heads + g) * s.page_size +
                            p % s.page_size;
        k = std::max(k, norm(w.k_pages, row));
        m.value_row = std::max(m.value_row, norm(w.v_pages, row));
        for (int32_t x = 0; x < d; ++x)
          m.value = std::max(m.value, std::abs(double(w.v_pages.get(row * d + x))));
      }
  }
  const double scale = s.scale != 0.f ? double(s.scale) : 1.0 / std::sqrt(double(d));
  m.logit = scale * q * k;
  return m;
}

struct AttentionBound {
  double relative = 0;  // softmax_sum's e: per unit of value magnitude
  double element = 0;   // |o_x - o*_x| for any output element
  double row = 0;       // ||o - o*||_2 for any (token, head) output row
  double lse = 0;       // |lse - lse*| for any row (log_sum_exp)
};

// `u`: the precision the kernel sums in; `u_weights`: the rounding of the softmax weights before
// P.V where a kernel narrows them (16-bit MMA operands), else 0. The output dtype's rounding is
// added when it is narrower than u.
inline AttentionBound attention_bound(const reference::Workload& w, double u = kF32,
                                      double u_weights = 0) {
  const Magnitudes m = magnitudes(w);
  const double u_out = unit_roundoff(w.spec.out_dtype) > u ? unit_roundoff(w.spec.out_dtype) : 0;
  const double e = softmax_sum(m.keys, m.head_dim, m.logit, u, u_weights, u_out);
  return {e, e * m.value, e * m.value_row, log_sum_exp(m.keys, m.head_dim, m.logit, u)};
}

}  // namespace sieve::tolerance
