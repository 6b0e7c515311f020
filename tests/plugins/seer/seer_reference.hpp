// Straightforward f64 recomputation of the SeerAttention-R gate (paper 002 eq. 1) for the tests:
// pooling, projection, RMSNorm, RoPE and scores, written independently of gate_math.hpp.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "common/tolerance.hpp"
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

// Returns the factor r applied (the RMSNorm backward's gain: dx = r (dy - y mean(dy . y))).
inline double ref_rms(std::vector<double>& x) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double r = 1.0 / std::sqrt(ss / double(x.size()) + 1e-6);
  for (double& v : x) v *= r;
  return r;
}

inline std::vector<double> ref_project(const float* W, const std::vector<double>& x, int32_t rows) {
  std::vector<double> y(size_t(rows), 0.0);
  for (int32_t r = 0; r < rows; ++r)
    for (size_t c = 0; c < x.size(); ++c) y[size_t(r)] += double(W[size_t(r) * x.size() + c]) * x[c];
  return y;
}

// The bound on |f32 gate vector - this f64 one| per element, gate_math's arithmetic in any order
// (tolerance.hpp): the projection y = W x as a `terms`-term sum of |W_rc| x_abs_c (x_abs: what
// each input channel sums, e.g. a mean's |keys|); RMSNorm moves every element by the projection's
// error relative to ||y||, its gate_dim-term sum of squares, the division, sqrt, reciprocal and
// scaling; RoPE's angle a = pos theta^(-i/n) is off relatively by the rounded exponent i/n
// (times ln theta through powf), powf's ulp, the division and the multiply, cos / sin add 2 ulp,
// and each rotated element mixes the pair's two errors.
inline std::vector<double> ref_gate_bound(const float* W, const std::vector<double>& x,
                                          const std::vector<double>& x_abs, int32_t rows,
                                          int64_t terms, bool rmsnorm, int64_t pos, double theta) {
  const double u = tolerance::kF32;
  std::vector<double> y = ref_project(W, x, rows), e(size_t(rows), 0.0);
  for (int32_t r = 0; r < rows; ++r) {
    for (size_t c = 0; c < x.size(); ++c)
      e[size_t(r)] += std::abs(double(W[size_t(r) * x.size() + c])) * x_abs[c];
    e[size_t(r)] *= tolerance::gamma(terms, u);
  }
  if (rmsnorm) {
    double ss = 0, es = 0;
    for (int32_t r = 0; r < rows; ++r) ss += y[size_t(r)] * y[size_t(r)], es += e[size_t(r)] * e[size_t(r)];
    const double f = 1.0 / std::sqrt(ss / double(rows) + 1e-6);
    const double rel = std::sqrt(es / ss) + tolerance::gamma(rows, u) + 5 * u;
    for (int32_t r = 0; r < rows; ++r) {
      e[size_t(r)] = f * (e[size_t(r)] + std::abs(y[size_t(r)]) * rel);
      y[size_t(r)] *= f;
    }
  }
  for (int32_t i = 0; i + 1 < rows; i += 2) {
    const double a = double(pos) * std::pow(theta, -double(i) / double(rows));
    const double mag = std::abs(y[size_t(i)]) + std::abs(y[size_t(i) + 1]);
    const double angle = (std::log(theta) + 4) * u * a;
    const double mixed = e[size_t(i)] + e[size_t(i) + 1] + mag * (angle + 2 * u + tolerance::gamma(2, u));
    e[size_t(i)] = e[size_t(i) + 1] = mixed;
  }
  for (double& b : e) b *= tolerance::kSafety;
  return e;
}

// The bound on |f32 gate_score - ref_dot(q, k) / sqrt(n)| from the two vectors' bounds: each
// product's error and the n-term sum's.
inline double ref_score_bound(const std::vector<double>& q, const std::vector<double>& qe,
                              const std::vector<double>& k, const std::vector<double>& ke) {
  double e = 0, mag = 0;
  for (size_t i = 0; i < q.size(); ++i) {
    e += qe[i] * std::abs(k[i]) + std::abs(q[i]) * ke[i] + qe[i] * ke[i];
    mag += std::abs(q[i] * k[i]);
  }
  const double n = double(q.size());
  return tolerance::kSafety * (e + tolerance::gamma(int64_t(q.size()) + 2, tolerance::kF32) * mag) / std::sqrt(n);
}

// Gate key of block j of KV head h from the sequence's pre-RoPE keys k_pre [T, hkv, d]; with
// `bound`, ref_gate_bound of each element too; with `rms_factor`, RMSNorm's factor (1 without it).
inline std::vector<double> ref_gate_key(const seer::GateWeights& w, int32_t layer, int32_t h,
                                        const std::vector<float>& k_pre, int64_t j,
                                        std::vector<double>* bound = nullptr, double* rms_factor = nullptr) {
  const seer::GateShape& s = w.shape;
  const int32_t d = s.head_dim;
  std::vector<double> pooled(size_t(3 * d)), pooled_abs(size_t(3 * d));
  for (int32_t c = 0; c < d; ++c) {
    double mx = -INFINITY, mn = INFINITY, sum = 0, sum_abs = 0;
    for (int32_t t = 0; t < s.block; ++t) {
      const double v = k_pre[(size_t(j * s.block + t) * s.n_kv_heads + h) * d + c];
      mx = std::max(mx, v);
      mn = std::min(mn, v);
      sum += v;
      sum_abs += std::abs(v);
    }
    pooled[size_t(c)] = mx;
    pooled[size_t(d + c)] = mn;
    pooled[size_t(2 * d + c)] = sum / s.block;
    pooled_abs[size_t(c)] = std::abs(mx);  // max and min are exact
    pooled_abs[size_t(d + c)] = std::abs(mn);
    pooled_abs[size_t(2 * d + c)] = sum_abs / s.block;
  }
  // The mean's block-term sum and division ride on the projection's 3d-term sum.
  if (bound)
    *bound = ref_gate_bound(w.wk_at(layer, h), pooled, pooled_abs, s.gate_dim, 3 * d + s.block + 1,
                            s.rmsnorm, j * s.block, s.rope_theta);
  std::vector<double> y = ref_project(w.wk_at(layer, h), pooled, s.gate_dim);
  const double r = s.rmsnorm ? ref_rms(y) : 1.0;
  if (rms_factor) *rms_factor = r;
  ref_rope(y, j * s.block, s.rope_theta);
  return y;
}

// Gate query of KV head h from the query token's pre-RoPE heads q_pre [hq, d]; `bound` and
// `rms_factor` as for ref_gate_key.
inline std::vector<double> ref_gate_query(const seer::GateWeights& w, int32_t layer, int32_t h,
                                          const std::vector<float>& q_pre, int64_t pos,
                                          std::vector<double>* bound = nullptr, double* rms_factor = nullptr) {
  const seer::GateShape& s = w.shape;
  const int32_t gd = s.group_dim();
  std::vector<double> x(static_cast<size_t>(gd)), x_abs(static_cast<size_t>(gd));
  for (int32_t i = 0; i < gd; ++i) x[size_t(i)] = q_pre[size_t(h) * gd + size_t(i)];
  for (int32_t i = 0; i < gd; ++i) x_abs[size_t(i)] = std::abs(x[size_t(i)]);
  if (bound) *bound = ref_gate_bound(w.wq_at(layer, h), x, x_abs, s.gate_dim, gd, s.rmsnorm, pos, s.rope_theta);
  std::vector<double> y = ref_project(w.wq_at(layer, h), x, s.gate_dim);
  const double r = s.rmsnorm ? ref_rms(y) : 1.0;
  if (rms_factor) *rms_factor = r;
  ref_rope(y, pos, s.rope_theta);
  return y;
}

inline double ref_dot(const std::vector<double>& a, const std::vector<double>& b) {
  double acc = 0;
  for (size_t i = 0; i < a.size(); ++i) acc += a[i] * b[i];
  return acc;
}

// The gate scores q.k_j / sqrt(gate_dim) of one row's complete blocks [0, complete) in f64, with
// each score's f32 bound (ref_score_bound) and the largest of them.
struct RefScores {
  std::vector<double> score, bound;
  double worst = 0;
  // The bound on an f32 softmax probability p of these scores: every score off by at most
  // `worst` moves p relatively by twice that (its own and the normaliser's), plus exp's and the
  // normaliser's roundings (softmax_sum's terms with no dot product).
  double prob_bound(double p) const {
    const double u = tolerance::kF32;
    return p * tolerance::kSafety * (2 * worst + 2 * tolerance::gamma(2 * int64_t(score.size()), u) + 3 * u);
  }
};
inline RefScores ref_block_scores(const seer::GateWeights& w, int32_t layer, int32_t h,
                                  const std::vector<float>& q_pre_last,
                                  const std::vector<float>& k_pre, int64_t len, int32_t complete) {
  RefScores r;
  std::vector<double> qb, kb;
  const std::vector<double> q = ref_gate_query(w, layer, h, q_pre_last, len - 1, &qb);
  for (int32_t j = 0; j < complete; ++j) {
    const std::vector<double> k = ref_gate_key(w, layer, h, k_pre, j, &kb);
    r.score.push_back(ref_dot(q, k) / std::sqrt(double(q.size())));
    r.bound.push_back(ref_score_bound(q, qb, k, kb));
    r.worst = std::max(r.worst, r.bound.back());
  }
  return r;
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
  if (!chosen.empty() && best_other > -INFINITY) {
    EXPECT_GE(worst_chosen, best_other - tol) << "a better-scored block was left out";
  }
}

}  // namespace sieve::testing
