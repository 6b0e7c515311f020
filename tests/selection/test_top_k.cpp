// top_k.hpp: every row against a full sort by (score desc, index asc) — ties from a small score
// alphabet, -inf/NaN items, -0/+0, forced head/tail clipping, the dense rule — and the batch
// layouts ([nnz, H] and [H, nnz]) against row-by-row calls, with per-segment forced tails too.
#include <gtest/gtest.h>
#include <sieve/selection/top_k.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace {

namespace sel = sieve::selection;

// The rule of top_k.hpp written the slow, obvious way.
std::vector<int32_t> reference(const std::vector<float>& s, sel::TopKRow r) {
  const int32_t n = std::max(r.n, 0);
  const int32_t head = std::clamp(r.head, 0, n), tail = std::clamp(r.tail, 0, n - head);
  std::vector<int32_t> out;
  if (int64_t(n) <= int64_t(head) + tail + std::max(r.k, 0)) {
    for (int32_t j = 0; j < n; ++j) out.push_back(j);
    return out;
  }
  std::vector<int32_t> mid;
  for (int32_t j = head; j < n - tail; ++j)
    if (!std::isnan(s[size_t(j)]) && s[size_t(j)] != -std::numeric_limits<float>::infinity())
      mid.push_back(j);
  std::stable_sort(mid.begin(), mid.end(), [&](int32_t a, int32_t b) {
    return s[size_t(a)] > s[size_t(b)];  // stable: equal scores keep index order; -0 == +0
  });
  mid.resize(std::min<size_t>(mid.size(), size_t(std::max(r.k, 0))));
  for (int32_t j = 0; j < head; ++j) out.push_back(j);
  for (int32_t j : mid) out.push_back(j);
  for (int32_t j = n - tail; j < n; ++j) out.push_back(j);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<float> random_scores(std::mt19937& rng, int32_t n, bool ties) {
  std::uniform_real_distribution<float> u(-3.f, 3.f);
  std::uniform_int_distribution<int> small(-2, 2), special(0, 19);
  std::vector<float> s(static_cast<size_t>(n));
  for (auto& v : s) {
    v = ties ? float(small(rng)) * 0.5f : u(rng);
    switch (special(rng)) {
      case 0: v = -std::numeric_limits<float>::infinity(); break;
      case 1: v = std::numeric_limits<float>::quiet_NaN(); break;
      case 2: v = -0.0f; break;
      case 3: v = 0.0f; break;
      case 4: v = std::numeric_limits<float>::infinity(); break;
      default: break;
    }
  }
  return s;
}

TEST(TopK, RowsMatchAFullSortIncludingTiesAndNonFiniteScores) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> len(0, 70), small(-1, 6);
  for (int iter = 0; iter < 3000; ++iter) {
    const int32_t n = len(rng);
    const sel::TopKRow r{n, small(rng), small(rng), small(rng) * 3};
    const auto s = random_scores(rng, n, iter % 2 == 0);
    std::vector<int32_t> out(size_t(n) + 1, -7), scratch(size_t(n) + 1, -9);
    const int32_t m = sel::top_k_row(r, s.data(), 1, out.data(), scratch.data());
    out.resize(size_t(m));
    ASSERT_EQ(out, reference(s, r)) << "iter " << iter << " n=" << n << " head=" << r.head
                                    << " tail=" << r.tail << " k=" << r.k;
    for (int32_t i = 1; i < m; ++i) ASSERT_LT(out[size_t(i - 1)], out[size_t(i)]);
  }
}

TEST(TopK, KeepsAllWhenTheRowFitsAndNeverPicksMinusInfinity) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> s = {ninf, ninf, 1.f, ninf, ninf, 2.f};
  std::vector<int32_t> out(8), scratch(8);
  // n = 6 <= head + tail + k = 0 + 1 + 5: dense, -inf or not.
  EXPECT_EQ(sel::top_k_row({6, 0, 1, 5}, s.data(), 1, out.data(), scratch.data()), 6);
  // k = 3 of the middle [0, 5): only index 2 is finite; the tail 5 is forced.
  const int32_t m = sel::top_k_row({6, 0, 1, 3}, s.data(), 1, out.data(), scratch.data());
  out.resize(size_t(m));
  EXPECT_EQ(out, (std::vector<int32_t>{2, 5}));
  // order_key: -0 == +0, NaN and -inf are 0, +inf is the largest.
  EXPECT_EQ(sel::order_key(-0.0f), sel::order_key(0.0f));
  EXPECT_EQ(sel::order_key(ninf), 0u);
  EXPECT_EQ(sel::order_key(std::nanf("")), 0u);
  EXPECT_GT(sel::order_key(std::numeric_limits<float>::infinity()), sel::order_key(3e38f));
  EXPECT_GT(sel::order_key(-3e38f), 0u);
  EXPECT_LT(sel::order_key(-2.f), sel::order_key(-1.f));
}

// top_k_batch_cpu on `b` against reference() row by row; `by_item` holds b's scores as [nnz, H].
void expect_rows_match(const sel::TopKBatch& b, const std::vector<float>& by_item) {
  const int32_t H = b.rows_per_segment;
  const int64_t cap = sel::top_k_capacity_needed(b);
  std::vector<int32_t> indptr(size_t(b.n_segments) * H + 1, -1), indices(size_t(cap) + 1, -1), scratch(64);
  ASSERT_LE(sel::top_k_batch_cpu(b, indptr.data(), indices.data(), scratch.data()), cap);
  for (int32_t s = 0; s < b.n_segments; ++s)
    for (int32_t h = 0; h < H; ++h) {
      const int32_t n = b.seg_indptr[s + 1] - b.seg_indptr[s];
      std::vector<float> row(static_cast<size_t>(n));
      for (int32_t j = 0; j < n; ++j) row[size_t(j)] = by_item[size_t(b.seg_indptr[s] + j) * H + size_t(h)];
      const int32_t r = s * H + h;
      std::vector<int32_t> got(indices.begin() + indptr[size_t(r)], indices.begin() + indptr[size_t(r) + 1]);
      EXPECT_EQ(got, reference(row, {n, b.head, sel::segment_tail(b.seg_tail, s, b.tail), b.k}))
          << "segment " << s << " head " << h;
    }
}

TEST(TopK, BatchLayoutsMatchRowByRow) {
  std::mt19937 rng(11);
  const int32_t H = 3;
  std::vector<int32_t> seg = {0};
  for (int32_t s = 0; s < 6; ++s) seg.push_back(seg.back() + int32_t(rng() % 40));
  const int32_t nnz = seg.back();
  std::vector<float> by_item(size_t(nnz) * H), by_head(size_t(nnz) * H);
  for (int32_t j = 0; j < nnz; ++j)
    for (int32_t h = 0; h < H; ++h) {
      const float v = float(rng() % 9);  // many ties
      by_item[size_t(j) * H + size_t(h)] = v;
      by_head[size_t(h) * nnz + size_t(j)] = v;
    }
  for (const bool item_major : {true, false}) {
    sel::TopKBatch b{item_major ? by_item.data() : by_head.data(),
                     item_major ? sel::ScoreLayout{H, 1} : sel::ScoreLayout{1, nnz},
                     seg.data(), 6, H, 1, 1, 4};
    expect_rows_match(b, by_item);
  }
}

// A batch past the threading threshold (2^15 scored items: rows on OpenMP threads, counts first):
// every row against the reference, ragged segments (one shorter than its forced items: dense),
// per-segment tails, ties, -inf and NaN.
TEST(TopK, LargeBatchOnThreadsMatchesTheReference) {
  std::mt19937 rng(5);
  const int32_t H = 8, S = 5;
  std::vector<int32_t> seg = {0};
  for (int32_t s = 0; s < S; ++s) seg.push_back(seg.back() + (s == 2 ? 3 : 1000 + int32_t(rng() % 300)));
  const std::vector<int32_t> tails = {1, 4, 1, 0, 40};
  const int32_t nnz = seg.back();
  ASSERT_GE(int64_t(nnz) * H, int64_t(1) << 15);
  const std::vector<float> scores = random_scores(rng, nnz * H, true);  // [nnz, H]
  sel::TopKBatch b{scores.data(), sel::ScoreLayout{H, 1}, seg.data(), S, H, 2, 1, 61};
  expect_rows_match(b, scores);
  b.seg_tail = tails.data();
  expect_rows_match(b, scores);
}

// seg_tail (raas's prompt rows): segment s's rows force their last seg_tail[s] items instead of
// the batch's tail — 0, inside the row, the whole row and past it — and the capacity follows.
TEST(TopK, PerSegmentTailsReplaceTheBatchTail) {
  std::mt19937 rng(12);
  const int32_t H = 2;
  const std::vector<int32_t> seg = {0, 9, 9, 30, 42, 50};
  const std::vector<int32_t> tails = {3, 1, 0, 12, 20};
  const int32_t nnz = seg.back();
  const std::vector<float> scores = random_scores(rng, nnz * H, true);  // [nnz, H], ties and -inf/NaN
  sel::TopKBatch b{scores.data(), sel::ScoreLayout{H, 1}, seg.data(), 5, H, 0, 1, 3};
  b.seg_tail = tails.data();
  int64_t want_cap = 0;
  for (int32_t s = 0; s < 5; ++s) {
    const int32_t n = seg[size_t(s) + 1] - seg[size_t(s)];
    want_cap += H * std::min<int64_t>(n, std::min(tails[size_t(s)], n) + 3);
  }
  EXPECT_EQ(sel::top_k_capacity_needed(b), want_cap);
  expect_rows_match(b, scores);
}

}  // namespace
