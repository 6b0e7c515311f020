#include "gate/distill.hpp"

#include <sieve/util/error.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "gate/block_truth.hpp"
#include "gate/gate_math.hpp"

namespace sieve::seer {

namespace {

int32_t blocks_of(int32_t tokens, int32_t block) { return (tokens + block - 1) / block; }

// Backward of the parameter-free RMSNorm y = x * r: dx = r * (dy - y * mean(dy . y)).
void rms_backward(const float* y, float r, float* dy_to_dx, int32_t n) {
  float dot = 0.f;
  for (int32_t i = 0; i < n; ++i) dot += dy_to_dx[i] * y[i];
  dot /= float(n);
  for (int32_t i = 0; i < n; ++i) dy_to_dx[i] = r * (dy_to_dx[i] - y[i] * dot);
}

// Forward of one gate vector keeping what the backward needs: pre-RoPE normalised vector and the
// RMS factor.
struct GateVec {
  std::vector<float> normed;  // after (RMSNorm), before RoPE
  std::vector<float> rotated; // final
  float r = 1.f;
};

void forward_vec(const float* W, const float* x, int32_t cols, const GateShape& s, int64_t pos, GateVec& out) {
  out.normed.resize(size_t(s.gate_dim));
  out.rotated.resize(size_t(s.gate_dim));
  project(W, x, s.gate_dim, cols, out.normed.data());
  out.r = s.rmsnorm ? rms_normalize(out.normed.data(), s.gate_dim) : 1.f;
  out.rotated = out.normed;
  rope_rotate(out.rotated.data(), s.gate_dim, pos, s.rope_theta);
}

// d(rotated) -> d(projection output), in place.
void backward_vec(const GateShape& s, int64_t pos, const GateVec& v, float* d) {
  rope_rotate(d, s.gate_dim, pos, s.rope_theta, /*inverse=*/true);
  if (s.rmsnorm) rms_backward(v.normed.data(), v.r, d, s.gate_dim);
}

void add_outer(float* G, const float* dy, const float* x, int32_t rows, int32_t cols) {
  for (int32_t r = 0; r < rows; ++r) {
    const float a = dy[r];
    if (a == 0.f) continue;
    float* g = G + int64_t(r) * cols;
    for (int32_t c = 0; c < cols; ++c) g[c] += a * x[c];
  }
}

// Everything one (sequence, layer, KV head) contributes: KL summed over its rows (and the
// gradients when asked); optionally the recall at 25% of the complete blocks.
struct GroupResult {
  double kl = 0, gate_recall = 0, oracle_recall = 0;
  int64_t rows = 0;
};

GroupResult run_group(const GateWeights& w, const DistillSequence& seq, int32_t L, int32_t h, float row_weight,
                      float* gwq, float* gwk, bool recall) {
  const GateShape& s = w.shape;
  const int32_t T = seq.tokens, d = s.head_dim, g = s.group(), dg = s.gate_dim, B = s.block;
  const int32_t nb_all = blocks_of(T, B), complete_all = T / B;
  GroupResult res;
  if (complete_all < 2) return res;
  const std::vector<float>& qp = seq.q_pre[size_t(L)];
  const std::vector<float>& kp = seq.k_pre[size_t(L)];
  const std::vector<float>& truth = seq.truth[size_t(L * s.n_kv_heads + h)];
  const std::vector<float>& mass = seq.mass[size_t(L * s.n_kv_heads + h)];
  const float* Wq = w.wq_at(L, h);
  const float* Wk = w.wk_at(L, h);

  // Keys of the complete blocks.
  std::vector<float> pooled(size_t(complete_all) * 3 * d);
  std::vector<GateVec> kg(static_cast<size_t>(complete_all));
  for (int32_t j = 0; j < complete_all; ++j) {
    auto key = [&](int32_t t, int32_t c) { return kp[(size_t(j * B + t) * s.n_kv_heads + h) * d + c]; };
    pool_block(key, B, d, pooled.data() + size_t(j) * 3 * d);
    forward_vec(Wk, pooled.data() + size_t(j) * 3 * d, 3 * d, s, int64_t(j) * B, kg[size_t(j)]);
  }
  const size_t nc = static_cast<size_t>(complete_all);
  std::vector<float> dkg(nc * size_t(dg), 0.f), scores(nc), gt(nc), dq(static_cast<size_t>(dg));
  std::vector<int32_t> order(nc);
  GateVec qg;
  const float inv_sqrt = 1.f / std::sqrt(float(dg));
  for (int32_t t = 0; t < T; ++t) {
    const int32_t c = (t + 1) / B;
    if (c < 2) continue;
    const float* qcat = qp.data() + (size_t(t) * s.n_q_heads + size_t(h) * g) * d;
    forward_vec(Wq, qcat, g * d, s, t, qg);
    const float* tr = truth.data() + size_t(t) * nb_all;
    double tsum = 0;
    for (int32_t j = 0; j < c; ++j) tsum += tr[j];
    if (!(tsum > 0)) continue;
    float mx = -INFINITY;
    for (int32_t j = 0; j < c; ++j) {
      scores[size_t(j)] = gate_score(qg.rotated.data(), kg[size_t(j)].rotated.data(), dg);
      mx = std::max(mx, scores[size_t(j)]);
    }
    double z = 0;
    for (int32_t j = 0; j < c; ++j) z += std::exp(double(scores[size_t(j)]) - mx);
    const double logz = std::log(z) + mx;
    double kl = 0;
    for (int32_t j = 0; j < c; ++j) {
      gt[size_t(j)] = float(tr[j] / tsum);
      if (gt[size_t(j)] > 0) kl += double(gt[size_t(j)]) * (std::log(double(gt[size_t(j)])) - (scores[size_t(j)] - logz));
    }
    res.kl += kl;
    ++res.rows;
    if (gwq) {
      std::fill(dq.begin(), dq.end(), 0.f);
      for (int32_t j = 0; j < c; ++j) {
        const float p = float(std::exp(double(scores[size_t(j)]) - logz));
        const float ds = (p - gt[size_t(j)]) * row_weight * inv_sqrt;
        if (ds == 0.f) continue;
        const float* kv = kg[size_t(j)].rotated.data();
        float* dk = dkg.data() + size_t(j) * dg;
        for (int32_t i = 0; i < dg; ++i) {
          dq[size_t(i)] += ds * kv[i];
          dk[i] += ds * qg.rotated[size_t(i)];
        }
      }
      backward_vec(s, t, qg, dq.data());
      add_outer(gwq, dq.data(), qcat, dg, g * d);
    }
    if (recall) {
      const float* ms = mass.data() + size_t(t) * nb_all;
      double total = 0;
      for (int32_t j = 0; j < c; ++j) total += ms[j];
      const int32_t k = std::max(1, c / 4);
      auto top_mass = [&](const float* by) {
        std::iota(order.begin(), order.begin() + c, 0);
        std::partial_sort(order.begin(), order.begin() + k, order.begin() + c, [&](int32_t a, int32_t b) {
          return by[a] != by[b] ? by[a] > by[b] : a < b;
        });
        double m = 0;
        for (int32_t i = 0; i < k; ++i) m += ms[order[size_t(i)]];
        return total > 0 ? m / total : 1.0;
      };
      res.gate_recall += top_mass(scores.data());
      res.oracle_recall += top_mass(tr);
    }
  }
  if (gwk)
    for (int32_t j = 0; j < complete_all; ++j) {
      float* dk = dkg.data() + size_t(j) * dg;
      backward_vec(s, int64_t(j) * B, kg[size_t(j)], dk);
      add_outer(gwk, dk, pooled.data() + size_t(j) * 3 * d, dg, 3 * d);
    }
  return res;
}

int64_t rows_of(const GateShape& s, const DistillSequence& seq) {
  int64_t rows = 0;
  for (int32_t t = 0; t < seq.tokens; ++t) rows += (t + 1) / s.block >= 2;
  return rows;
}

}  // namespace

DistillSequence make_distill_sequence(const GateShape& s, int32_t T, std::vector<std::vector<float>> q_pre,
                                      std::vector<std::vector<float>> k_pre,
                                      const std::vector<std::vector<float>>& q_post,
                                      const std::vector<std::vector<float>>& k_post) {
  const int32_t d = s.head_dim, g = s.group(), nb = blocks_of(T, s.block);
  require(int32_t(q_pre.size()) == s.n_layers && int32_t(k_pre.size()) == s.n_layers &&
              int32_t(q_post.size()) == s.n_layers && int32_t(k_post.size()) == s.n_layers,
          SIEVE_ERR_INVALID_ARGUMENT, "make_distill_sequence: one tensor per layer expected");
  DistillSequence seq;
  seq.tokens = T;
  seq.truth.resize(size_t(s.n_layers) * s.n_kv_heads);
  seq.mass.resize(seq.truth.size());
  std::vector<double> logits;
  for (int32_t L = 0; L < s.n_layers; ++L)
    for (int32_t h = 0; h < s.n_kv_heads; ++h) {
      std::vector<float>& tr = seq.truth[size_t(L * s.n_kv_heads + h)];
      std::vector<float>& ms = seq.mass[size_t(L * s.n_kv_heads + h)];
      tr.assign(size_t(T) * nb, 0.f);
      ms.assign(size_t(T) * nb, 0.f);
      const std::vector<float>& qv = q_post[size_t(L)];
      const std::vector<float>& kv = k_post[size_t(L)];
      for (int32_t t = 0; t < T; ++t) {
        if ((t + 1) / s.block < 2) continue;  // no row of the loss
        auto q = [&](int32_t gh, int32_t c) { return qv[(size_t(t) * s.n_q_heads + h * g + gh) * d + c]; };
        auto k = [&](int64_t u, int32_t c) { return kv[(size_t(u) * s.n_kv_heads + h) * d + c]; };
        block_truth(q, k, g, d, t + 1, s.block, tr.data() + size_t(t) * nb, ms.data() + size_t(t) * nb, logits);
      }
    }
  seq.q_pre = std::move(q_pre);
  seq.k_pre = std::move(k_pre);
  return seq;
}

double gate_loss_and_grad(const GateWeights& w, const std::vector<DistillSequence>& data,
                          const std::vector<int32_t>& seqs, std::vector<float>* gwq, std::vector<float>* gwk) {
  const GateShape& s = w.shape;
  if (gwq) gwq->assign(w.wq.size(), 0.f);
  if (gwk) gwk->assign(w.wk.size(), 0.f);
  int64_t rows = 0;
  for (int32_t i : seqs) rows += rows_of(s, data[size_t(i)]);
  if (rows == 0) return 0;
  // The loss is the mean over rows of each group; every group has the same row count per sequence.
  const float row_weight = 1.f / float(rows);
  double kl = 0;
  int64_t n = 0;
  for (int32_t L = 0; L < s.n_layers; ++L)
    for (int32_t h = 0; h < s.n_kv_heads; ++h) {
      float* gq = gwq ? gwq->data() + (int64_t(L) * s.n_kv_heads + h) * s.wq_head_elems() : nullptr;
      float* gk = gwk ? gwk->data() + (int64_t(L) * s.n_kv_heads + h) * s.wk_head_elems() : nullptr;
      for (int32_t i : seqs) {
        GroupResult r = run_group(w, data[size_t(i)], L, h, row_weight, gq, gk, false);
        kl += r.kl;
        n += r.rows;
      }
    }
  return n ? kl / double(n) : 0.0;
}

void distill_gate(GateWeights& w, const std::vector<DistillSequence>& train, const DistillOptions& o,
                  const std::function<void(int32_t, double)>& on_step) {
  require(!train.empty(), SIEVE_ERR_INVALID_ARGUMENT, "distill_gate: no training sequence");
  require(o.steps >= 1 && o.batch >= 1, SIEVE_ERR_INVALID_ARGUMENT, "distill_gate: steps and batch must be >= 1");
  std::vector<float> mq(w.wq.size(), 0.f), vq(w.wq.size(), 0.f), mk(w.wk.size(), 0.f), vk(w.wk.size(), 0.f), gq, gk;
  std::mt19937_64 rng(o.seed ^ 0x5eedULL);
  std::vector<int32_t> order(train.size());
  std::iota(order.begin(), order.end(), 0);
  size_t cursor = order.size();
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  for (int32_t step = 0; step < o.steps; ++step) {
    std::vector<int32_t> batch;
    while (int32_t(batch.size()) < std::min<int32_t>(o.batch, int32_t(train.size()))) {
      if (cursor == order.size()) {  // a new epoch: Fisher-Yates with the portable uniform
        for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[size_t(unit_uniform(rng()) * double(i))]);
        cursor = 0;
      }
      batch.push_back(order[cursor++]);
    }
    const double kl = gate_loss_and_grad(w, train, batch, &gq, &gk);
    const double lr = o.lr * 0.5 * (1.0 + std::cos(M_PI * double(step) / double(o.steps)));
    const double c1 = 1.0 - std::pow(b1, step + 1), c2 = 1.0 - std::pow(b2, step + 1);
    auto adamw = [&](std::vector<float>& p, std::vector<float>& m, std::vector<float>& v, const std::vector<float>& g) {
      for (size_t i = 0; i < p.size(); ++i) {
        m[i] = float(b1 * m[i] + (1 - b1) * g[i]);
        v[i] = float(b2 * v[i] + (1 - b2) * double(g[i]) * g[i]);
        const double update = (m[i] / c1) / (std::sqrt(v[i] / c2) + eps);
        p[i] = float(p[i] - lr * (update + o.weight_decay * p[i]));
      }
    };
    adamw(w.wq, mq, vq, gq);
    adamw(w.wk, mk, vk, gk);
    if (on_step) on_step(step, kl);
  }
}

GateEval evaluate_gate(const GateWeights& w, const std::vector<DistillSequence>& data) {
  const GateShape& s = w.shape;
  GateEval e;
  double kl = 0, gr = 0, orc = 0;
  for (const DistillSequence& seq : data)
    for (int32_t L = 0; L < s.n_layers; ++L)
      for (int32_t h = 0; h < s.n_kv_heads; ++h) {
        GroupResult r = run_group(w, seq, L, h, 0.f, nullptr, nullptr, true);
        kl += r.kl;
        gr += r.gate_recall;
        orc += r.oracle_recall;
        e.positions += r.rows;
      }
  if (e.positions) {
    e.kl = kl / double(e.positions);
    e.gate_recall = gr / double(e.positions);
    e.oracle_recall = orc / double(e.positions);
  }
  return e;
}

}  // namespace sieve::seer
