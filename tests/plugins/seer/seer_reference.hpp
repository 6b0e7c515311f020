// Straightforward f64 recomputation of the SeerAttention-R gate (paper 002 eq. 1) for the tests:
// pooling, projection, RMSNorm, RoPE and scores, written independently of gate_math.hpp.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "gate/gate_file.hpp"

namespace sieve::testing {

// RoPE over n channels, consecutive pairs, frequency theta^(-i/n) for pair (i, i+1).
inline void ref_rope(std::vector<double>& x, int64_t pos, double theta) {
  const size_t n = x.size();
  for (size_t i = 0; i + 1 < n; i += 2) {
    const double a = double(pos) * std::pow(theta, -double(i) / double(n));
    const double v0 = x[i], v1 = x[i + 1];
    x[i] = v0 * std::cos(a) - v1 * std::sin(a);
    x[i + 1] = v0 * std::sin(a) + v1 * std::cos(a);
  }
}

inline void ref_rms(std::vector<double>& x) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / double(x.size()) + 1e-6);
  for (double& v : x) v *= r;
}

inline std::vector<double> ref_project(const float* W, const std::vector<double>& x, int32_t rows) {
  std::vector<double> y(size_t(rows), 0.0);
  for (int32_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < x.size(); ++c) y[size_t(r)] += double(W[size_t(r) * x.size() + c]) * x[c];
  return y;
}

// Gate key of block j of KV head h from the sequence's pre-RoPE keys k_pre [T, hkv, d].
inline std::vector<double> ref_gate_key(const seer::GateWeights& w, int32_t layer, int32_t h,
                                        const std::vector<float>& k_pre, int64_t j) {
  const seer::GateShape& s = w.shape;
  const int32_t d = s.head_dim;
  std::vector<double> pooled(size_t(3 * d));
  for (int32_t c = 0; c < d; ++c) {
    double mx = -INFINITY, mn = INFINITY, sum = 0;
    for (int32_t t = 0; t < s.block; ++t) {
      const double v = k_pre[(size_t(j * s.block + t) * s.n_kv_heads + h) * d + c];
      mx = std::max(mx, v);
      mn = std::min(mn, v);
      sum += v;
    }
    pooled[size_t(c)] = mx;
    pooled[size_t(d + c)] = mn;
    pooled[size_t(2 * d + c)] = sum / s.block;
  }
  std::vector<double> y = ref_project(w.wk_at(layer, h), pooled, s.gate_dim);
  if (s.rmsnorm) ref_rms(y);
  ref_rope(y, j * s.block, s.rope_theta);
  return y;
}

// Gate query of KV head h from the query token's pre-RoPE heads q_pre [hq, d].
inline std::vector<double> ref_gate_query(const seer::GateWeights& w, int32_t layer, int32_t h,
                                          const std::vector<float>& q_pre, int64_t pos) {
  const seer::GateShape& s = w.shape;
  const int32_t gd = s.group_dim();
  std::vector<double> x(static_cast<size_t>(gd));
  for (int32_t i = 0; i < gd; ++i) x[size_t(i)] = q_pre[size_t(h) * gd + size_t(i)];
  std::vector<double> y = ref_project(w.wq_at(layer, h), x, s.gate_dim);
  if (s.rmsnorm) ref_rms(y);
  ref_rope(y, pos, s.rope_theta);
  return y;
}

inline double ref_dot(const std::vector<double>& a, const std::vector<double>& b) {
  double acc = 0;
  for (size_t i = 0; i < a.size(); ++i) acc += a[i] * b[i];
  return acc;
}

// A selected row checked against reference scores of the complete blocks [0, scores.size()):
// the row lists block nb-1 (the last) and exactly `expect_k` others, strictly increasing, and no
// unselected candidate scores more than `tol` above a selected one (near-ties may go either way).
inline void expect_top_k_row(const std::vector<int32_t>& row, const std::vector<double>& scores, int32_t nb,
                             int32_t expect_k, double tol) {
  ASSERT_FALSE(row.empty());
  EXPECT_EQ(row.back(), nb - 1) << "the last block is always selected";
  for (size_t i = 1; i < row.size(); ++i) EXPECT_LT(row[i - 1], row[i]) << "strictly increasing";
  const int32_t candidates = nb - 1;
  EXPECT_EQ(int32_t(row.size()) - 1, std::min(expect_k, candidates));
  std::set<int32_t> chosen(row.begin(), row.end() - 1);
  double worst_chosen = INFINITY, best_other = -INFINITY;
  for (int32_t j = 0; j < candidates; ++j) {
    if (chosen.count(j)) worst_chosen = std::min(worst_chosen, scores[size_t(j)]);
    else best_other = std::max(best_other, scores[size_t(j)]);
  }
  if (!chosen.empty() && best_other > -INFINITY)
    EXPECT_GE(worst_chosen, best_other - tol) << "a better-scored block was left out";
}

}  // namespace sieve::testing
