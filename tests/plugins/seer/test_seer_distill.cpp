// The SeerAttention-R gate's self-distillation (gate/distill.hpp): the hand-written f32 gradient
// against central differences of an f64 recomputation of the loss, with a bound derived from the
// arithmetic; the KL going down; determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "common/tolerance.hpp"
#include "gate/distill.hpp"
#include "gate/gate_file.hpp"
#include "seer_reference.hpp"

namespace {

using namespace sieve::testing;
namespace sg = sieve::seer;
namespace tol = sieve::tolerance;


// A small synthetic problem with structure a gate can learn: keys of each block share a random
// direction; queries point at one block's direction.
std::vector<sg::DistillSequence> synthetic_data(const sg::GateShape& s, int32_t n, int32_t T, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int32_t d = s.head_dim, hq = s.n_q_heads, hkv = s.n_kv_heads;
  std::vector<sg::DistillSequence> out;
  for (int32_t i = 0; i < n; ++i) {
    std::vector<std::vector<float>> qpre(size_t(s.n_layers)), kpre(size_t(s.n_layers)), qpost, kpost;
    for (int32_t L = 0; L < s.n_layers; ++L) {
      const int32_t nb = (T + s.block - 1) / s.block;
      std::vector<float> dirs(size_t(nb) * hkv * d);
      for (float& x : dirs) x = nd(rng);
      kpre[size_t(L)].resize(size_t(T) * hkv * d);
      qpre[size_t(L)].resize(size_t(T) * hq * d);
      for (int32_t t = 0; t < T; ++t) {
        for (int32_t h = 0; h < hkv; ++h)
          for (int32_t c = 0; c < d; ++c)
            kpre[size_t(L)][(size_t(t) * hkv + h) * d + c] = 2.f * dirs[(size_t(t / s.block) * hkv + h) * d + c] + 0.3f * nd(rng);
        const int32_t target = std::uniform_int_distribution<int32_t>(0, std::max(0, t / s.block))(rng);
        for (int32_t qh = 0; qh < hq; ++qh)
          for (int32_t c = 0; c < d; ++c)
            qpre[size_t(L)][(size_t(t) * hq + qh) * d + c] =
                1.5f * dirs[(size_t(target) * hkv + qh / s.group()) * d + c] + 0.3f * nd(rng);
      }
    }
    qpost = qpre;  // the synthetic "model" applies no RoPE: post == pre
    kpost = kpre;
    out.push_back(sg::make_distill_sequence(s, T, qpre, kpre, qpost, kpost));
  }
  return out;
}

// One layer, two GQA groups of two query heads, blocks of 16.
sg::GateShape small_shape(int32_t head_dim, int32_t gate_dim, bool rmsnorm) {
  sg::GateShape s;
  s.n_layers = 1;
  s.n_q_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = head_dim;
  s.block = 16;
  s.gate_dim = gate_dim;
  s.rmsnorm = rmsnorm;
  return s;
}

double norm2(const std::vector<double>& v) { return std::sqrt(ref_dot(v, v)); }

// One (layer, KV head) group of the distillation loss recomputed in f64 from seer_reference's
// gate vectors, with what the bound on the f32 code's error needs. The function is the one
// gate_loss_and_grad differentiates: the sum over the group's rows of KL(targets || softmax of the
// scores of the complete blocks), divided by the group's row count, the targets rounded to f32 as
// distill.cpp stores them.
struct RefGroup {
  struct Keys {  // one sequence's complete blocks
    std::vector<std::vector<double>> k, bound;
    std::vector<double> rms;                   // RMSNorm's factor of each (1 without it)
    std::vector<std::vector<double>> max_abs;  // per block and channel, max |pre-RoPE key|
  };
  struct Row {
    size_t seq = 0;
    std::vector<double> q, bound, x;  // x: the group's concatenated pre-RoPE query heads
    std::vector<double> p, target;    // softmax of the scores; targets
    double rms = 1, worst_score = 0;  // the query's RMSNorm factor; max ref_score_bound
  };
  std::vector<Keys> keys;
  std::vector<Row> rows;
  int64_t normaliser = 0;  // rows with at least two complete blocks (distill.cpp's rows_of)
  double loss = 0;
  double score_abs = 0;    // max over rows and blocks of sum_i |q_i k_i| / sqrt(gate_dim)
  int32_t max_blocks = 0;
};

RefGroup ref_group(const sg::GateWeights& w, const std::vector<sg::DistillSequence>& data, int32_t L, int32_t h) {
  const sg::GateShape& s = w.shape;
  const int32_t d = s.head_dim, gd = s.group_dim(), dg = s.gate_dim;
  RefGroup g;
  double kl = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const sg::DistillSequence& seq = data[i];
    const std::vector<float>& kp = seq.k_pre[size_t(L)];
    const std::vector<float>& qp = seq.q_pre[size_t(L)];
    const int32_t complete = seq.tokens / s.block, nb = (seq.tokens + s.block - 1) / s.block;
    RefGroup::Keys& K = g.keys.emplace_back();
    for (int32_t j = 0; j < complete; ++j) {
      K.bound.emplace_back();
      K.rms.emplace_back();
      K.k.push_back(ref_gate_key(w, L, h, kp, j, &K.bound.back(), &K.rms.back()));
      std::vector<double>& m = K.max_abs.emplace_back(size_t(d), 0.0);
      for (int32_t t = j * s.block; t < (j + 1) * s.block; ++t)
        for (int32_t c = 0; c < d; ++c)
          m[size_t(c)] = std::max(m[size_t(c)], double(std::abs(kp[(size_t(t) * s.n_kv_heads + h) * d + c])));
    }
    const std::vector<float>& truth = seq.truth[size_t(L * s.n_kv_heads + h)];
    for (int32_t t = 0; t < seq.tokens; ++t) {
      const int32_t c = (t + 1) / s.block;
      if (c < 2) continue;
      ++g.normaliser;
      const float* tr = truth.data() + size_t(t) * nb;
      double tsum = 0;
      for (int32_t j = 0; j < c; ++j) tsum += tr[j];
      if (!(tsum > 0)) continue;
      RefGroup::Row& r = g.rows.emplace_back();
      r.seq = i;
      const auto heads = qp.begin() + int64_t(t) * s.n_q_heads * d;
      r.q = ref_gate_query(w, L, h, std::vector<float>(heads, heads + int64_t(s.n_q_heads) * d), t, &r.bound, &r.rms);
      r.x.assign(heads + int64_t(h) * gd, heads + int64_t(h + 1) * gd);
      std::vector<double> score(static_cast<size_t>(c));
      double mx = -INFINITY, z = 0;
      for (int32_t j = 0; j < c; ++j) {
        const std::vector<double>& k = K.k[size_t(j)];
        score[size_t(j)] = ref_dot(r.q, k) / std::sqrt(double(dg));
        double abs = 0;
        for (int32_t x = 0; x < dg; ++x) abs += std::abs(r.q[size_t(x)] * k[size_t(x)]);
        g.score_abs = std::max(g.score_abs, abs / std::sqrt(double(dg)));
        r.worst_score = std::max(r.worst_score, ref_score_bound(r.q, r.bound, k, K.bound[size_t(j)]));
        mx = std::max(mx, score[size_t(j)]);
      }
      for (double v : score) z += std::exp(v - mx);
      const double logz = mx + std::log(z);
      for (int32_t j = 0; j < c; ++j) {
        const double target = double(float(tr[j] / tsum));
        r.target.push_back(target);
        r.p.push_back(std::exp(score[size_t(j)] - logz));
        if (target > 0) kl += target * (std::log(target) - (score[size_t(j)] - logz));
      }
      g.max_blocks = std::max(g.max_blocks, c);
    }
  }
  g.loss = g.normaliser ? kl / double(g.normaliser) : 0.0;
  return g;
}

// The bound on |f32 gradient - exact gradient| of the group's W_q[r][c] (of_wq) or W_k[r][c], any
// r. The gradient of W_q[r][c] is
//   sum_rows sum_j ds_j [B^T k_j]_r x_c,  ds_j = (p_j - target_j) / (rows sqrt(gate_dim)),
// B the query's backward (inverse RoPE, then RMSNorm's dx = rho (dy - y mean(dy . y))), x the
// row's concatenated heads; W_k's swaps the roles (the block's B, the row's q, the pooled keys,
// each at most max |key| of its channel in the block). Each term's magnitude with absolute values
// throughout (Higham's |.| evaluation, tolerance.hpp): RoPE keeps a pair's norm, so each entry
// of R^T k is at most ||k||; RMSNorm's backward with |.| adds |y_i| ||y|| sqrt(2) ||k|| / n
// <= sqrt(2) ||k|| (||y|| <= sqrt(n)); so |term| <= (p_j + target_j) / (rows sqrt(gate_dim)) *
// f rho ||k_j|| |x_c|, f = 1 + sqrt(2) with RMSNorm, 1 without. The f32 code's error on a term
// is that magnitude times the sum of
//   - p_j's relative error (RefScores::prob_bound of the row: its scores off by ref_score_bound),
//     on the p_j part of it,
//   - the other side's gate vector's relative error (||ref_gate_bound|| / ||vector||): k_j summed
//     into dq, q into dk,
//   - B's, built from the vector's own RMSNorm factor, y (twice) and RoPE angles, each off by at
//     most that vector's relative bound: 4x it with RMSNorm, 1x (the angles) without,
//   - the backward's roundings, kSafety * gamma(n): the dq sum over the blocks, ds (2), inverse
//     RoPE (2), RMSNorm's gate_dim-term dot and 3 more, the accumulation over every row, and
//     1 / sqrt(gate_dim) (2): n = rows + blocks + gate_dim + 10.
double f32_gradient_bound(const RefGroup& g, const sg::GateShape& s, bool of_wq, int32_t c) {
  const double f = s.rmsnorm ? 1 + std::sqrt(2.0) : 1, b = s.rmsnorm ? 4 : 1;
  const double rounding = tol::kSafety * tol::gamma(g.normaliser + g.max_blocks + s.gate_dim + 10, tol::kF32);
  double e = 0;
  for (const RefGroup::Row& r : g.rows) {
    const RefGroup::Keys& K = g.keys[r.seq];
    RefScores row;
    row.score.resize(r.p.size());
    row.worst = r.worst_score;
    const double rel_p = row.prob_bound(1.0), rel_q = norm2(r.bound) / norm2(r.q);
    for (size_t j = 0; j < r.p.size(); ++j) {
      const double rel_k = norm2(K.bound[j]) / norm2(K.k[j]);
      const double term = of_wq ? f * r.rms * norm2(K.k[j]) * std::abs(r.x[size_t(c)])
                                : f * K.rms[j] * norm2(r.q) * K.max_abs[j][size_t(c % s.head_dim)];
      const double rel = (of_wq ? rel_k + b * rel_q : rel_q + b * rel_k) + rounding;
      e += (r.p[j] * rel_p + (r.p[j] + r.target[j]) * rel) * term;
    }
  }
  return e / (double(g.normaliser) * std::sqrt(double(s.gate_dim)));
}

// The bound on |f64 loss - exact loss|: each logit a chain of at most 3d + block + 2 gate_dim +
// 2 blocks + 16 roundings, relative to the magnitude 3 max|logit| + 2 log(blocks) (sum target s,
// log z, the entropy).
double f64_loss_bound(const RefGroup& g, const sg::GateShape& s) {
  const int64_t chain = 3 * s.head_dim + s.block + 2 * s.gate_dim + 2 * g.max_blocks + 16;
  return tol::kSafety * tol::gamma(chain, tol::kF64) *
         (3 * g.score_abs + 2 * std::log(double(std::max(g.max_blocks, 1))));
}

// gate_loss_and_grad's gradient of each group's mean KL against the f64 loss's central
// differences, Richardson-extrapolated: D(h) = f' + a h^2 + O(h^4), so (4 D(h/2) - D(h)) / 3 is
// off by O(h^4), and |D(h) - D(h/2)| / 3 (D(h/2)'s h^2 term, the estimate of the truncation
// error) bounds that while h is small against the scale on which the loss's derivatives change
// (h = 2^-8 against weights of O(0.3) and logits of O(1): h^4 / h^2 = h^2 ~ 1.5e-5). The rounding of
// the difference quotients: the f64 loss off by e, (4 D(h/2) - D(h)) / 3 by (4 e / (h/2) + e / h) / 3
// = 3 e / h. Plus the f32 gradient's own error (f32_gradient_bound).
TEST(SeerDistill, GradientMatchesF64FiniteDifferences) {
  for (bool rms : {false, true}) {
    const sg::GateShape s = small_shape(4, 6, rms);
    const auto data = synthetic_data(s, 2, 70, 3);
    sg::GateWeights w = sg::random_gate(s, 2);
    // Weights on a 2^-16 grid (|w| < 1/2): w +- h and w +- h/2 below are exact in f32, so the steps
    // the f64 loss sees are exactly h and h/2.
    for (std::vector<float>* v : {&w.wq, &w.wk})
      for (float& x : *v) x = std::ldexp(std::nearbyint(std::ldexp(x, 16)), -16);
    std::vector<float> gq, gk;
    const std::vector<int32_t> all = {0, 1};
    sg::gate_loss_and_grad(w, data, all, &gq, &gk);
    std::mt19937 rng(1);
    for (int trial = 0; trial < 24; ++trial) {
      const bool q = trial % 2 == 0;
      std::vector<float>& p = q ? w.wq : w.wk;
      const size_t i = std::uniform_int_distribution<size_t>(0, p.size() - 1)(rng);
      const int64_t head_elems = q ? s.wq_head_elems() : s.wk_head_elems();
      const int32_t group = int32_t(int64_t(i) / head_elems);
      const int32_t L = group / s.n_kv_heads, h = group % s.n_kv_heads;
      const int32_t col = int32_t(int64_t(i) % head_elems % (q ? s.group_dim() : s.pooled_dim()));
      const float keep = p[i];
      auto central = [&](float step) {
        p[i] = keep + step;
        const double up = ref_group(w, data, L, h).loss;
        p[i] = keep - step;
        const double down = ref_group(w, data, L, h).loss;
        p[i] = keep;
        return (up - down) / (2.0 * step);
      };
      const float step = 0x1p-8f;
      const double d1 = central(step), d2 = central(step / 2);
      const double numeric = (4 * d2 - d1) / 3;
      const RefGroup at = ref_group(w, data, L, h);
      const double bound =
          f32_gradient_bound(at, s, q, col) + std::abs(d1 - d2) / 3 + 3 * f64_loss_bound(at, s) / step;
      const double analytic = q ? gq[i] : gk[i];
      EXPECT_NEAR(analytic, numeric, bound) << (q ? "wq[" : "wk[") << i << "] rms " << rms;
    }
  }
}

TEST(SeerDistill, LowersKlDeterministically) {
  const sg::GateShape s = small_shape(8, 8, false);
  const auto train = synthetic_data(s, 6, 96, 1);
  const auto held = synthetic_data(s, 2, 96, 2);
  sg::DistillOptions o;
  o.steps = 40;
  o.batch = 2;
  o.lr = 1e-2;  // a short run
  o.seed = 4;
  sg::GateWeights w = sg::random_gate(s, 4);
  const sg::GateEval before = sg::evaluate_gate(w, held);
  sg::distill_gate(w, train, o);
  const sg::GateEval after = sg::evaluate_gate(w, held);
  EXPECT_LT(after.kl, 0.7 * before.kl) << "KL " << before.kl << " -> " << after.kl;
  EXPECT_GT(after.gate_recall, before.gate_recall);
  // The oracle's blocks hold the most mass by definition: equal at most to f64 rounding of the
  // 96-token mass sums.
  EXPECT_LE(after.gate_recall, after.oracle_recall + sieve::tolerance::kSafety * sieve::tolerance::gamma(2 * 96, sieve::tolerance::kF64));
  sg::GateWeights again = sg::random_gate(s, 4);
  sg::distill_gate(again, train, o);
  EXPECT_EQ(again.wq, w.wq) << "same seed, same weights";
  EXPECT_EQ(again.wk, w.wk);
}

}  // namespace
