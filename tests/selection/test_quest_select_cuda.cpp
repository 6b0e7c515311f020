// Quest's fused CUDA select (quest_select_cuda.hpp) against the CPU path it must equal bit for bit:
// page_bounds_cpu + top_k_batch_cpu with {head 0, tail 1, k = budget - 1, fill} (what the quest
// plugin runs on the CPU). Synthetic page tables and min/max records: ragged sequences (one page,
// empty, a few, thousands), shuffled page ids, budgets below, at and above the page counts,
// per query head and group max, vector and element-wise bounds, f32/f16/bf16 records, a tiny value
// alphabet (many tied bounds), NaN and infinite records (fill: ranked last, never dropped), one
// CTA per (sequence, KV head) and many slices of a long sequence (the arrival counter; the same
// scratch across budgets, so a counter left non-zero would show). Every output entry is poisoned
// first, so an unwritten one fails. Skipped without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sieve/selection/page_bound.hpp>
#include <sieve/selection/quest_select_cuda.hpp>
#include <sieve/selection/top_k.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace {

namespace sel = sieve::selection;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  Dev(const void* src, size_t count) : Dev(count) {
    EXPECT_EQ(cudaMemcpy(p, src, count * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
};

struct Case {
  DLDataType kv, q;
  int32_t head_dim, n_q_heads, n_kv_heads;
  std::vector<int32_t> pages;  // per sequence
  int values;                  // 0: normal(0, 1); v > 0: integers in [-v, v] (ties)
  bool specials;               // a few NaN / +-inf record values
};

void check_case(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int32_t batch = int32_t(c.pages.size()), d = c.head_dim, Hq = c.n_q_heads, Hkv = c.n_kv_heads;
  constexpr int32_t kPage = 16;
  std::vector<int32_t> indptr = {0};
  for (int32_t n : c.pages) indptr.push_back(indptr.back() + n);
  const int32_t nnz = indptr.back(), pool = nnz + 7, max_pages = *std::max_element(c.pages.begin(), c.pages.end());
  std::vector<int32_t> ids(static_cast<size_t>(pool));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> indices(ids.begin(), ids.begin() + nnz), last(size_t(batch), kPage);

  auto value = [&]() -> float {
    if (c.specials) {
      const int s = int(rng() % 40);
      if (s == 0) return std::numeric_limits<float>::quiet_NaN();
      if (s == 1) return std::numeric_limits<float>::infinity();
      if (s == 2) return -std::numeric_limits<float>::infinity();
    }
    if (c.values > 0) return float(int(rng() % uint32_t(2 * c.values + 1)) - c.values);
    return std::normal_distribution<float>(0.f, 1.f)(rng);
  };
  sieve::HostTensor side({pool, Hkv, 2 * d}, c.kv), k_pages({pool, Hkv, kPage, d}, c.kv);
  for (int64_t i = 0; i < side.numel(); ++i) side.set(i, value());
  sieve::HostTensor q({batch, Hq, d}, c.q);
  for (int64_t i = 0; i < q.numel(); ++i) q.set(i, c.values > 0 ? float(int(rng() % 5) - 2) : value());
  std::vector<int32_t> qo(size_t(batch) + 1);
  std::iota(qo.begin(), qo.end(), 0);

  sieve_paged_kv view{};
  view.batch = batch;
  view.page_size = kPage;
  view.k_pages = k_pages.dl();
  int64_t n_idx = nnz;
  view.indices = sieve::make_view(indices.data(), DLDevice{kDLCPU, 0}, sieve::kI32, 1, &n_idx);
  view.indptr_host = indptr.data();
  view.last_page_len_host = last.data();

  Dev<char> d_side(side.dl().data, side.nbytes()), d_q(q.dl().data, q.nbytes());
  Dev<int32_t> d_indptr(indptr.data(), indptr.size()), d_indices(indices.data(), indices.size()),
      d_qo(qo.data(), qo.size());
  // One scratch for every call below (sized per query head, the larger), zeroed once.
  const size_t scratch_bytes = sel::quest_select_scratch_bytes(batch, Hq, Hkv, false, max_pages);
  Dev<char> d_scratch(scratch_bytes);
  ASSERT_EQ(sel::quest_select_scratch_init(d_scratch.p, scratch_bytes, nullptr), nullptr);
  for (const bool group_max : {false, true}) {
    const int32_t H = group_max ? Hkv : Hq;
    std::vector<float> scores(size_t(std::max(nnz, 1)) * H), scratch(size_t(Hq + 2) * d);
    const sel::ScoreLayout layout{H, 1};
    sel::page_bounds_cpu(view, side.dl(), q.dl(), qo.data(), Hq, group_max, scores.data(), layout, scratch.data());
    for (const int32_t budget : {1, 2, 3, max_pages / 2 + 1, max_pages - 1, max_pages, max_pages + 5}) {
      if (budget < 1) continue;
      const sel::TopKBatch tb{scores.data(), layout, indptr.data(), batch, H, 0, 1, budget - 1, true};
      const int64_t cap = sel::top_k_capacity_needed(tb);
      std::vector<int32_t> want_ptr(size_t(batch) * H + 1), want(size_t(cap) + 1), topk_scratch(size_t(max_pages) + 1);
      const int64_t written = sel::top_k_batch_cpu(tb, want_ptr.data(), want.data(), topk_scratch.data());
      ASSERT_EQ(written, cap) << "fill keeps min(pages, budget) per row";

      Dev<int32_t> d_ptr(want_ptr.size()), d_out(size_t(cap) + 1);
      ASSERT_EQ(cudaMemset(d_ptr.p, 0xff, d_ptr.n * 4), cudaSuccess);
      ASSERT_EQ(cudaMemset(d_out.p, 0xff, d_out.n * 4), cudaSuccess);
      sel::QuestSelectLaunch a{};
      a.q = d_q.p;
      a.q_dtype = sel::storage_of(c.q);
      a.qo_indptr = d_qo.p;
      a.n_q_heads = Hq;
      a.sidecar = d_side.p;
      a.kv_dtype = sel::storage_of(c.kv);
      a.n_kv_heads = Hkv;
      a.head_dim = d;
      a.kv_indptr = d_indptr.p;
      a.kv_indices = d_indices.p;
      a.batch = batch;
      a.max_pages = max_pages;
      a.group_max = group_max;
      a.budget_pages = budget;
      a.scratch = d_scratch.p;
      a.scratch_batch = batch;
      a.sel_indptr = d_ptr.p;
      a.sel_indices = d_out.p;
      a.capacity = cap;
      ASSERT_EQ(sel::launch_quest_select(a), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::string where = "seed " + std::to_string(seed) + " group_max " + std::to_string(group_max) +
                                " budget " + std::to_string(budget);
      ASSERT_EQ(d_ptr.get(), want_ptr) << where;
      const auto got = d_out.get();
      for (int64_t i = 0; i < cap; ++i) ASSERT_EQ(got[size_t(i)], want[size_t(i)]) << "entry " << i << ", " << where;
      ASSERT_EQ(got[size_t(cap)], -1) << "nothing written past the rows, " << where;
    }
  }
}

TEST(QuestSelectCuda, RaggedBatchesMatchTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the fused Quest select is not exercised";
  // Vector bounds (head_dim 128, G = 4), bf16 records and f32 q; ragged with a one-page sequence.
  check_case({sieve::kBF16, sieve::kF32, 128, 8, 2, {37, 1, 90, 150, 12}, 0, false}, 1);
  // f16 records and q, G = 2, f32 records G = 8 and 7.
  check_case({sieve::kF16, sieve::kF16, 64, 4, 2, {300, 5, 41}, 0, false}, 2);
  check_case({sieve::kF32, sieve::kBF16, 128, 16, 2, {64, 65, 3}, 0, false}, 3);
  check_case({sieve::kBF16, sieve::kBF16, 128, 28, 4, {100, 33}, 0, false}, 4);
}

TEST(QuestSelectCuda, TiesAndNonFiniteBoundsMatchTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the fused Quest select is not exercised";
  check_case({sieve::kBF16, sieve::kBF16, 128, 8, 2, {200, 77, 9}, 1, false}, 5);   // {-1, 0, 1}: ties
  check_case({sieve::kBF16, sieve::kF32, 128, 8, 8, {120, 2, 64}, 2, true}, 6);     // ties, NaN, inf
  check_case({sieve::kF32, sieve::kF32, 64, 4, 1, {500, 31}, 0, true}, 7);
}

TEST(QuestSelectCuda, ElementWiseBoundsMatchTheCpu) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the fused Quest select is not exercised";
  check_case({sieve::kF16, sieve::kF32, 40, 6, 2, {50, 18, 7}, 0, false}, 8);    // head_dim % 8 != 0, G = 3
  check_case({sieve::kF32, sieve::kF32, 256, 4, 4, {33, 90}, 1, true}, 9);       // head_dim > 128
}

TEST(QuestSelectCuda, LongSequencesSplitIntoSlices) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the fused Quest select is not exercised";
  // Per query head, G = 8: 8 rows of 1999 pages, each (sequence, KV head) over several slices.
  check_case({sieve::kBF16, sieve::kF32, 64, 16, 2, {2000, 1500, 40}, 0, false}, 10);
  // Group max: one row of 13000 pages in ~50 slices, the last to arrive selects.
  check_case({sieve::kBF16, sieve::kBF16, 64, 4, 1, {13000, 100}, 3, false}, 11);
}

}  // namespace
