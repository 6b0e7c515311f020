// The oracle itself: the f64 reference against hand-computed attention, the fidelity metrics, and
// the properties the workload builder promises (shuffled pages, NaN where nothing may be read,
// seeded determinism, peaked attention).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "common/attention_tolerance.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/cosine.hpp"
#include "sieve/reference/fidelity.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve {
namespace {

using reference::attend_reference;
using reference::RefAttention;
using reference::RefOptions;
using reference::Workload;
using reference::WorkloadSpec;

// One sequence, one head, head_dim 2, pages of 2, 3 tokens; values written by hand.
struct Tiny {
  Workload w;
  float k[3][2] = {{1, 0}, {0, 1}, {1, 1}};
  float v[3][2] = {{1, 2}, {3, -1}, {-2, 5}};
  explicit Tiny(sieve_phase phase) : w(spec(phase)) {
    const int32_t* ids = w.kv_indices.data<int32_t>();
    for (int t = 0; t < 3; ++t)
      for (int i = 0; i < 2; ++i) {
        w.k_pages.set((int64_t(ids[t / 2]) * 2 + t % 2) * 2 + i, k[t][i]);
        w.v_pages.set((int64_t(ids[t / 2]) * 2 + t % 2) * 2 + i, v[t][i]);
      }
  }
  static WorkloadSpec spec(sieve_phase phase) {
    WorkloadSpec s;
    s.n_q_heads = s.n_kv_heads = 1;
    s.head_dim = 2;
    s.page_size = 2;
    s.kv_lens = {3};
    s.phase = phase;
    s.scale = 0.5f;
    return s;
  }
  // softmax(0.5 * q·k) over keys [0, n) applied to v, and its lse.
  void expected(const float q[2], int n, double out[2], double* lse) const {
    double l[3], mx = -INFINITY, sum = 0;
    for (int t = 0; t < n; ++t) {
      l[t] = 0.5 * (q[0] * k[t][0] + q[1] * k[t][1]);
      mx = std::max(mx, l[t]);
    }
    for (int t = 0; t < n; ++t) sum += std::exp(l[t] - mx);
    out[0] = out[1] = 0;
    for (int t = 0; t < n; ++t)
      for (int i = 0; i < 2; ++i) out[i] += std::exp(l[t] - mx) / sum * v[t][i];
    *lse = mx + std::log(sum);
  }
};

TEST(AttentionReference, DecodeMatchesHandComputedSoftmax) {
  Tiny x(SIEVE_PHASE_DECODE);
  const float q[2] = {0.3f, -1.2f};
  x.w.q.set(0, q[0]);
  x.w.q.set(1, q[1]);
  const RefAttention r = attend_reference(x.w.args);
  double out[2], lse;
  x.expected(q, 3, out, &lse);
  // Two f64 computations of the same softmax: each within the f64 arithmetic's bound.
  const auto f64 = tolerance::attention_bound(x.w, tolerance::kF64);
  EXPECT_NEAR(r.out[0], out[0], 2 * f64.element);
  EXPECT_NEAR(r.out[1], out[1], 2 * f64.element);
  EXPECT_NEAR(r.lse[0], lse, 2 * f64.lse);
}

TEST(AttentionReference, PrefillIsCausal) {
  Tiny x(SIEVE_PHASE_PREFILL);
  const float q[3][2] = {{1, 2}, {-0.5f, 0.25f}, {2, -1}};
  for (int t = 0; t < 3; ++t)
    for (int i = 0; i < 2; ++i) x.w.q.set(t * 2 + i, q[t][i]);
  const RefAttention r = attend_reference(x.w.args);
  const auto f64 = tolerance::attention_bound(x.w, tolerance::kF64);  // as above
  for (int t = 0; t < 3; ++t) {
    double out[2], lse;
    x.expected(q[t], t + 1, out, &lse);  // query t sees keys 0..t
    EXPECT_NEAR(r.out[size_t(t) * 2], out[0], 2 * f64.element) << t;
    EXPECT_NEAR(r.out[size_t(t) * 2 + 1], out[1], 2 * f64.element) << t;
    EXPECT_NEAR(r.lse[size_t(t)], lse, 2 * f64.lse) << t;
  }
  EXPECT_DOUBLE_EQ(r.out[0], 1.0);  // the first query sees only key 0: out = v0
  EXPECT_DOUBLE_EQ(r.out[1], 2.0);
}

TEST(AttentionReference, SelectionRestrictsTheKeys) {
  Tiny x(SIEVE_PHASE_DECODE);
  const float q[2] = {0.7f, 0.1f};
  x.w.q.set(0, q[0]);
  x.w.q.set(1, q[1]);
  x.w.set_selection(SIEVE_SEL_PER_SEQUENCE, 1, 1, {{1}});  // page 1 = token 2 only
  RefOptions opt;
  opt.keep_probs = true;
  const RefAttention r = attend_reference(x.w.args, opt);
  EXPECT_DOUBLE_EQ(r.out[0], -2.0);
  EXPECT_DOUBLE_EQ(r.out[1], 5.0);
  // One key: lse is its logit 0.5 q.k (q as stored, f32), to the f64 arithmetic's bound.
  EXPECT_NEAR(r.lse[0], 0.5 * (double(q[0]) + q[1]), tolerance::attention_bound(x.w, tolerance::kF64).lse);
  EXPECT_THAT(std::vector<double>(r.prob_row(0, 0).begin(), r.prob_row(0, 0).end()),
              ::testing::ElementsAre(0.0, 0.0, 1.0));
  EXPECT_THAT(reference::attended_keys(x.w.args, 0, 0), ::testing::ElementsAre(0, 0, 1));
}

TEST(AttentionReference, PageMassDefinition) {
  // Decode, 2 KV heads of 2 query heads: per-KV-head mass is Σ_t max over the group's heads.
  WorkloadSpec s;
  s.n_q_heads = 4;
  s.n_kv_heads = 2;
  s.head_dim = 16;
  s.page_size = 4;
  s.kv_lens = {10, 3};
  Workload w(s);
  w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
  RefOptions opt;
  opt.keep_probs = true;
  const RefAttention r = attend_reference(w.args, opt);
  for (int32_t b = 0; b < 2; ++b)
    for (int32_t g = 0; g < 2; ++g) {
      const int32_t token = b;  // decode: one query per sequence
      double page_sum[3] = {0, 0, 0};
      const auto p0 = r.prob_row(token, 2 * g), p1 = r.prob_row(token, 2 * g + 1);
      for (size_t t = 0; t < p0.size(); ++t) page_sum[t / 4] += std::max(p0[t], p1[t]);
      const int32_t first = w.kv_indptr.data<int32_t>()[b];
      // The same f64 probabilities summed over a page's 4 tokens, maybe in another order.
      for (int32_t p = 0; p < w.pages(b); ++p)
        EXPECT_NEAR(r.page_mass[size_t(first + p) * 2 + g], page_sum[p],
                    2 * tolerance::gamma(4, tolerance::kF64) * page_sum[p]);
    }
  // Σ_t max_h p_h(t) lies between 1 (one head's mass) and the group size, to the f64 rounding of
  // the probabilities (softmax_sum's relative bound) and of the 10-term sum.
  const double f64 = tolerance::attention_bound(w, tolerance::kF64).relative + tolerance::gamma(10, tolerance::kF64);
  for (int32_t g = 0; g < 2; ++g) {
    double total = 0;
    for (int32_t p = 0; p < w.pages(0); ++p) total += r.page_mass[size_t(p) * 2 + g];
    EXPECT_GE(total, 1.0 - f64);
    EXPECT_LE(total, 2.0 * (1 + f64));
  }
}

TEST(AttentionFidelity, RelativeError) {
  const double ref[3] = {3, 0, 4};
  const float got[3] = {3, 0, 4.5f};
  EXPECT_DOUBLE_EQ(reference::relative_error(ref, got, 3), 0.1);
  const double zero[2] = {0, 0}, small[2] = {0, 1e-3};
  EXPECT_DOUBLE_EQ(reference::relative_error(zero, small, 2), 1e-3);  // absolute when ref is 0
  const float nan[3] = {3, NAN, 4};
  EXPECT_TRUE(std::isnan(reference::relative_error(ref, nan, 3)));
}

TEST(AttentionFidelity, Cosine) {
  const float a[3] = {1, 2, 3}, twice[3] = {2, 4, 6}, minus[3] = {-1, -2, -3}, ortho[3] = {3, 0, -1};
  // |a| = sqrt(14), |2a| = sqrt(56): 28 / sqrt(784) = 1 with every step exact in f64.
  EXPECT_EQ(reference::cosine(a, twice, 3), 1.0);
  EXPECT_EQ(reference::cosine(a, minus, 3), -1.0);
  EXPECT_EQ(reference::cosine(a, ortho, 3), 0.0);
  const float x[2] = {1, 0}, diag[2] = {1, 1};
  EXPECT_DOUBLE_EQ(reference::cosine(x, diag, 2), 1.0 / std::sqrt(2.0));
  // Zero vectors (as the Delta-KV keep rule): two zeros are the same vector, one zero is unrelated.
  const float zero[3] = {0, 0, 0}, negzero[3] = {-0.f, 0, -0.f};
  EXPECT_EQ(reference::cosine(zero, negzero, 3), 1.0);
  EXPECT_EQ(reference::cosine(zero, a, 3), 0.0);
  EXPECT_EQ(reference::cosine(a, zero, 3), 0.0);
  EXPECT_EQ(reference::cosine(a, a, 0), 1.0);  // two empty vectors
  const float nan[3] = {1, NAN, 3};
  EXPECT_TRUE(std::isnan(reference::cosine(nan, a, 3)));
  EXPECT_TRUE(std::isnan(reference::cosine(zero, nan, 3)));
}

TEST(AttentionFidelity, CompareOutputFindsTheWorstRow) {
  WorkloadSpec s;
  s.kv_lens = {20, 30};
  Workload w(s);
  const RefAttention r = attend_reference(w.args);
  for (size_t i = 0; i < r.out.size(); ++i) w.out.set(int64_t(i), float(r.out[i]));
  // Each element rounded once to f32: |fl(x) - x| <= u |x|, so every row within u relatively.
  EXPECT_LE(reference::compare_output(r, w.out.dl()).max_row_rel, tolerance::kF32);
  w.out.set((int64_t(1) * 8 + 5) * 64 + 3, 100.f);  // token 1, head 5
  const reference::OutputError e = reference::compare_output(r, w.out.dl());
  EXPECT_EQ(e.worst_token, 1);
  EXPECT_EQ(e.worst_head, 5);
  EXPECT_GT(e.max_row_rel, 1.0);
  EXPECT_EQ(e.rows, 16);
  w.out.set(0, NAN);
  EXPECT_EQ(reference::compare_output(r, w.out.dl()).non_finite, 1);
}

TEST(AttentionFidelity, AttentionRecall) {
  WorkloadSpec s;
  s.kv_lens = {200, 77};
  s.page_size = 16;
  Workload w(s);
  // Attended mass / total mass, f64 sums of at most 200 probabilities each.
  const double f64 = tolerance::kSafety * tolerance::gamma(2 * 200, tolerance::kF64);
  EXPECT_NEAR(reference::attention_recall(w.args), 1.0, f64);  // dense

  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1,
                  w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 1, 1.0, 1));
  EXPECT_NEAR(reference::attention_recall(w.args), 1.0, f64);  // every block

  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1,
                  reference::SelectionRows(size_t(w.selection_rows(SIEVE_SEL_PER_KV_HEAD, 1))));
  EXPECT_EQ(reference::attention_recall(w.args), 0.0);  // nothing

  // A subset keeps part of the mass, and a superset of it keeps at least as much.
  reference::SelectionRows half = w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 1, 0.5, 2);
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, half);
  const double r_half = reference::attention_recall(w.args);
  EXPECT_GT(r_half, 0.0);
  EXPECT_LT(r_half, 1.0);
  for (auto& row : half)  // add key block 0 where it is missing (rows are increasing)
    if (row.empty() || row.front() != 0) row.insert(row.begin(), 0);
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, half);
  EXPECT_GE(reference::attention_recall(w.args), r_half);
}

TEST(AttentionWorkload, PagesAreShuffledWithNaNWhereNothingMayBeRead) {
  WorkloadSpec s;
  s.n_q_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 4;
  s.page_size = 8;
  s.kv_lens = {20, 8, 1};
  s.spare_pages = 3;
  Workload w(s);
  const int32_t* ids = w.kv_indices.data<int32_t>();
  const int32_t nnz = w.kv_indptr.data<int32_t>()[3];
  ASSERT_EQ(nnz, 3 + 1 + 1);
  ASSERT_EQ(w.k_pages.shape()[0], nnz + 3);
  std::vector<int32_t> sorted(ids, ids + nnz);
  EXPECT_FALSE(std::is_sorted(sorted.begin(), sorted.end())) << "physical ids in token order";
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "a page shared";
  EXPECT_THAT(std::vector<int32_t>(w.kv_last_page_len.data<int32_t>(),
                                   w.kv_last_page_len.data<int32_t>() + 3),
              ::testing::ElementsAre(4, 8, 1));

  // Every slot of the pool is NaN exactly when no sequence's token lives there.
  std::vector<uint8_t> valid(size_t(w.k_pages.numel()), 0);
  for (int32_t b = 0; b < 3; ++b)
    for (int32_t t = 0; t < w.kv_len[b]; ++t)
      for (int32_t i = 0; i < 4; ++i)
        valid[size_t((int64_t(ids[w.kv_indptr.data<int32_t>()[b] + t / 8]) * 8 + t % 8) * 4 + i)] = 1;
  for (int64_t i = 0; i < w.k_pages.numel(); ++i) {
    ASSERT_EQ(std::isnan(w.k_pages.get(i)), !valid[size_t(i)]) << i;
    ASSERT_EQ(std::isnan(w.v_pages.get(i)), !valid[size_t(i)]) << i;
  }
  EXPECT_EQ(kernels::check_attention_args(w.args), "");
}

TEST(AttentionWorkload, SeededAndPeaked) {
  WorkloadSpec s;
  s.kv_lens = {300};
  s.seed = 42;
  Workload a(s), b(s);
  s.seed = 43;
  Workload c(s);
  bool differs = false;
  for (int64_t i = 0; i < a.q.numel(); ++i) {
    ASSERT_EQ(a.q.get(i), b.q.get(i));
    differs |= a.q.get(i) != c.q.get(i);
  }
  EXPECT_TRUE(differs);
  // Heavy keys: the top 5% of keys carry far more than 5% of the mass.
  RefOptions opt;
  opt.keep_probs = true;
  const RefAttention r = attend_reference(a.args, opt);
  double top_mass = 0;
  for (int32_t h = 0; h < s.n_q_heads; ++h) {
    std::vector<double> p(r.prob_row(0, h).begin(), r.prob_row(0, h).end());
    std::sort(p.rbegin(), p.rend());
    top_mass += std::accumulate(p.begin(), p.begin() + 15, 0.0) / s.n_q_heads;
  }
  EXPECT_GT(top_mass, 0.3);
}

}  // namespace
}  // namespace sieve
