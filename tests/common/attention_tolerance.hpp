// The error bound of an attention call: tolerance.hpp's model with the magnitudes read from the
// call's own inputs (host tensors: its longest sequence, largest query and key norms, largest
// value), so the bound follows the data a test builds rather than one run's result.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/tolerance.hpp"
#include "sieve/attention.h"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/reference/workload.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::tolerance {

// What softmax_sum needs from a call: its longest sequence, the largest |scale| ||q|| ||k|| (bounds
// every logit's scale * sum |q_i k_i|, Cauchy-Schwarz), the largest value element and value-row
// norm. Resident keys only (pages past a sequence's end may hold NaN).
struct Magnitudes {
  int64_t keys = 0;
  int32_t head_dim = 0;
  double logit = 0, value = 0, value_row = 0;
};

inline Magnitudes magnitudes(const sieve_attention_args& a) {
  const int32_t d = a.head_dim, hkv = a.n_kv_heads;
  const sieve_paged_kv& kv = *a.kv;
  auto norm = [&](const DLTensor& t, int64_t row) {
    double n = 0;
    for (int32_t x = 0; x < d; ++x) n += std::pow(double(load_float(t.data, t.dtype, row * d + x)), 2);
    return std::sqrt(n);
  };
  Magnitudes m;
  m.head_dim = d;
  double q = 0, k = 0;
  for (int64_t r = 0; r < numel(*a.q) / d; ++r) q = std::max(q, norm(*a.q, r));
  const int32_t* ids = static_cast<const int32_t*>(kv.indices.data);
  for (int32_t b = 0; b < kv.batch; ++b) {
    const int32_t len = kernels::kv_len(kv, b);
    m.keys = std::max<int64_t>(m.keys, len);
    for (int32_t p = 0; p < len; ++p)
      for (int32_t g = 0; g < hkv; ++g) {
        const int64_t page = ids[kv.indptr_host[b] + p / kv.page_size];
        const int64_t row = (page * hkv + g) * kv.page_size + p % kv.page_size;
        k = std::max(k, norm(kv.k_pages, row));
        m.value_row = std::max(m.value_row, norm(kv.v_pages, row));
        for (int32_t x = 0; x < d; ++x)
          m.value = std::max(m.value, std::abs(double(load_float(kv.v_pages.data, kv.v_pages.dtype, row * d + x))));
      }
  }
  const double scale = a.scale != 0.f ? double(a.scale) : 1.0 / std::sqrt(double(d));
  m.logit = std::abs(scale) * q * k;  // |logit| <= |scale| ||q|| ||k||: a negative scale bounds alike
  return m;
}
inline Magnitudes magnitudes(const reference::Workload& w) { return magnitudes(w.args); }

struct AttentionBound {
  double relative = 0;  // softmax_sum's e: per unit of value magnitude
  double element = 0;   // |o_x - o*_x| for any output element
  double row = 0;       // ||o - o*||_2 for any (token, head) output row
  double lse = 0;       // |lse - lse*| for any row (log_sum_exp)
};

// `u`: the precision the kernel sums in; `u_weights`: the rounding of the softmax weights before
// P.V where a kernel narrows them (16-bit MMA operands), else 0. The output dtype's rounding is
// added when it is narrower than u.
inline AttentionBound attention_bound(const sieve_attention_args& a, double u = kF32,
                                      double u_weights = 0) {
  const Magnitudes m = magnitudes(a);
  const double u_out = unit_roundoff(a.out->dtype) > u ? unit_roundoff(a.out->dtype) : 0;
  const double e = softmax_sum(m.keys, m.head_dim, m.logit, u, u_weights, u_out);
  return {e, e * m.value, e * m.value_row, log_sum_exp(m.keys, m.head_dim, m.logit, u)};
}
inline AttentionBound attention_bound(const reference::Workload& w, double u = kF32,
                                      double u_weights = 0) {
  return attention_bound(w.args, u, u_weights);
}

// The relative error of a decode call's page mass (sum over a page's tokens of max over heads of
// exp(s - lse)): each term is off relatively by its logit's and the lse's error and by exp's
// rounding of |s - lse| <= 2 logit + log(keys), then page_size terms are summed.
inline double page_mass(const sieve_attention_args& a, double u = kF32) {
  const Magnitudes m = magnitudes(a);
  const double shift = 2 * m.logit + std::log(double(std::max<int64_t>(m.keys, 1)));
  return log_sum_exp(m.keys, m.head_dim, m.logit, u) +
         kSafety * (gamma(m.head_dim + 3, u) * m.logit + gamma(a.kv->page_size, u) + u * (shift + 1));
}

}  // namespace sieve::tolerance
