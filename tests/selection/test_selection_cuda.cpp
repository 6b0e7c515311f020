// core/selection's CUDA kernels against its CPU functions, bit for bit: the batched top-k (ties,
// -inf/NaN, long rows beyond the shared key buffer, many rows, both score layouts, per-segment
// forced tails), the fused
// min/max append (incremental over ragged appends, and the catch-up recomputation) and the page
// bounds (per head and group max; f32, f16 and bf16 pages; both bound kernels). Skipped without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>
#include <sieve/selection/page_bound.hpp>
#include <sieve/selection/page_bound_cuda.hpp>
#include <sieve/selection/top_k.hpp>
#include <sieve/selection/top_k_cuda.hpp>
#include <sieve/util/page_layout.hpp>
#include <sieve/util/tensor.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "mocks/fake_paged_kv.hpp"
#include "support/layer_call.hpp"

namespace {

namespace sel = sieve::selection;
using namespace sieve::testing;

bool have_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device: the CUDA selection kernels are not exercised"

// A device copy of a host vector, freed with the object.
template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { put(h.data(), h.size()); }
  Dev(const void* src, size_t count) : Dev(count) { put(static_cast<const T*>(src), count); }
  ~Dev() { cudaFree(p); }
  void put(const T* src, size_t count) {
    EXPECT_EQ(cudaMemcpy(p, src, count * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  std::vector<T> get() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void poison() { EXPECT_EQ(cudaMemset(p, 0xff, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess); }
};

TEST(SelectionCuda, TopKMatchesTheCpuBitForBit) {
  REQUIRE_GPU();
  std::mt19937 rng(21);
  for (const bool item_major : {true, false}) {
    for (int iter = 0; iter < 6; ++iter) {
      const int32_t H = 1 + int32_t(rng() % 5), segs = 1 + int32_t(rng() % 9);
      std::vector<int32_t> seg = {0};
      for (int32_t s = 0; s < segs; ++s)
        seg.push_back(seg.back() + int32_t(iter == 5 ? 3000 + rng() % 3000 : rng() % 600));
      const int32_t nnz = seg.back();
      std::vector<float> scores(size_t(nnz) * H);
      std::uniform_int_distribution<int> alphabet(-4, 4), special(0, 30);
      std::normal_distribution<float> normal(0.f, 1.f);
      for (auto& v : scores) {
        v = iter % 2 ? float(alphabet(rng)) : normal(rng);  // ties on odd iterations
        const int sp = special(rng);
        if (sp == 0) v = -std::numeric_limits<float>::infinity();
        if (sp == 1) v = std::numeric_limits<float>::quiet_NaN();
        if (sp == 2) v = -0.0f;
      }
      const sel::ScoreLayout layout = item_major ? sel::ScoreLayout{H, 1} : sel::ScoreLayout{1, nnz};
      const int32_t k = int32_t(rng() % 200);
      sel::TopKBatch b{scores.data(), layout, seg.data(), segs, H, int32_t(rng() % 3), 1, k};
      // From iteration 3 on: a forced tail per segment (raas's prompt rows), up to past the end.
      std::vector<int32_t> tails(static_cast<size_t>(segs));
      for (int32_t s = 0; s < segs; ++s) tails[size_t(s)] = int32_t(rng() % uint32_t(seg[size_t(s) + 1] - seg[size_t(s)] + 3));
      if (iter >= 3) b.seg_tail = tails.data();
      const int64_t cap = sel::top_k_capacity_needed(b);
      std::vector<int32_t> indptr(size_t(segs) * H + 1), indices(size_t(cap) + 1, -1),
          scratch(size_t(nnz) + 1);
      const int64_t written = sel::top_k_batch_cpu(b, indptr.data(), indices.data(), scratch.data());

      Dev<float> d_scores(scores);
      Dev<int32_t> d_seg(seg), d_indptr(indptr.size()), d_indices(size_t(cap) + 1), d_tails(tails);
      Dev<char> d_scratch(sel::top_k_cuda_scratch_bytes(int64_t(segs) * H));
      d_indptr.poison();
      d_indices.poison();
      sel::TopKCudaLaunch a{d_scores.p, layout, d_seg.p, segs, H, b.head, b.tail, b.k,
                            d_scratch.p, d_indptr.p, d_indices.p, cap, nullptr};
      if (b.seg_tail) a.seg_tail = d_tails.p;
      ASSERT_EQ(sel::launch_top_k_cuda(a), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got_indptr = d_indptr.get();
      ASSERT_EQ(got_indptr, indptr) << "iter " << iter << " item_major " << item_major;
      const auto got = d_indices.get();
      for (int64_t i = 0; i < written; ++i)
        ASSERT_EQ(got[size_t(i)], indices[size_t(i)]) << "entry " << i << " iter " << iter;
    }
  }
}

// A FakePagedKv with ragged sequences; the device mirrors its pages and page table.
// Group sizes, head_dims and dtypes cover both bound kernels: the vector one (head_dim <= 128, a
// multiple of 8, G in {1, 2, 4, 7, 8}) and the element-wise one (any other shape).
// With `layout`, the store keeps its pages as an engine does (strided views, ABI 1.1): the device
// kernel reads them through the view's strides and must still match the CPU bit for bit.
void bounds_and_append(DLDataType dtype, int32_t head_dim, int32_t n_q_heads = 8, int32_t n_kv_heads = 2,
                       const sieve::KvLayout* layout = nullptr) {
  sieve_geometry g = test_geometry(16, 3, 2048);
  g.n_q_heads = n_q_heads;
  g.n_kv_heads = n_kv_heads;
  g.head_dim = head_dim;
  g.rope_dim = head_dim;
  g.kv_dtype = dtype;
  FakePagedKv store(test_kv_config(g, 400));
  if (layout) store.set_layout(*layout);
  sieve_sidecar_desc desc{SIEVE_HEADER_INIT(sieve_sidecar_desc), "quest.minmax", dtype, 2 * head_dim};
  int32_t slot = -1;
  ASSERT_EQ(store.register_sidecar(&desc, &slot), SIEVE_OK);
  std::vector<int32_t> ids(3);
  for (auto& id : ids) ASSERT_EQ(store.add_sequence(&id), SIEVE_OK);
  std::mt19937 rng(4);
  std::normal_distribution<float> n(0.f, 1.5f);
  const size_t side_elems = size_t(400) * g.n_kv_heads * 2 * head_dim;
  const size_t eb = sieve::dtype_bytes(dtype);
  Dev<char> d_side(side_elems * eb);
  for (int round = 0; round < 6; ++round) {
    std::vector<int32_t> tok = {0};
    for (int b = 0; b < 3; ++b) tok.push_back(tok.back() + int32_t(round == 0 ? 100 + rng() % 300 : rng() % 20));
    sieve::HostTensor k({tok.back(), g.n_kv_heads, head_dim}, sieve::kF32), v = k;
    for (int64_t i = 0; i < k.numel(); ++i) k.set(i, n(rng)), v.set(i, n(rng));
    sieve_kv_append a{SIEVE_HEADER_INIT(sieve_kv_append), 0, 3, ids.data(), tok.data(), &k.dl(), &v.dl(), nullptr};
    ASSERT_EQ(store.append(&a), SIEVE_OK);
    sieve_paged_kv view{};
    ASSERT_EQ(store.view(0, ids.data(), 3, &view), SIEVE_OK);
    DLTensor side{};
    ASSERT_EQ(store.sidecar(0, slot, &side), SIEVE_OK);
    const bool catch_up = round == 3;  // recompute everything on the device this round
    sel::minmax_on_append_cpu(view, tok.data(), side);

    sieve::PageStrides at;
    ASSERT_EQ(sieve::page_strides(view.k_pages, "k", &at), "");
    Dev<char> d_k(sieve::data_ptr<char>(view.k_pages), size_t(sieve::page_span(view.k_pages, at)) * eb);
    std::vector<int32_t> indptr(view.indptr_host, view.indptr_host + 4);
    std::vector<int32_t> indices(sieve::data_ptr<int32_t>(view.indices),
                                 sieve::data_ptr<int32_t>(view.indices) + indptr[3]);
    std::vector<int32_t> last(view.last_page_len_host, view.last_page_len_host + 3);
    Dev<int32_t> d_indptr(indptr), d_indices(indices), d_last(last), d_tok(tok);
    int32_t max_pages = 0;
    for (int b = 0; b < 3; ++b) max_pages = std::max(max_pages, indptr[size_t(b) + 1] - indptr[size_t(b)]);
    sel::MinMaxAppendLaunch m{d_k.p, at, d_side.p, *sieve::storage_of(dtype), g.n_kv_heads, g.page_size, head_dim,
                              d_indptr.p, d_indices.p, d_last.p, catch_up ? nullptr : d_tok.p, 3,
                              max_pages, nullptr};
    ASSERT_EQ(sel::launch_minmax_append(m), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    // Compare the sidecar of every resident page (others are unused slots).
    const auto dev_side = d_side.get();
    const size_t per_page = size_t(g.n_kv_heads) * 2 * head_dim * eb;
    for (int32_t phys : indices)
      ASSERT_EQ(0, std::memcmp(dev_side.data() + size_t(phys) * per_page,
                               static_cast<const char*>(side.data) + size_t(phys) * per_page, per_page))
          << "round " << round << " page " << phys;

    // Bounds: one query per sequence, q in f32 or bf16.
    for (const bool group_max : {false, true}) {
      const int32_t H = group_max ? g.n_kv_heads : g.n_q_heads;
      sieve::HostTensor q({3, g.n_q_heads, head_dim}, round % 2 ? sieve::kBF16 : round == 4 ? sieve::kF16 : sieve::kF32);
      for (int64_t i = 0; i < q.numel(); ++i) q.set(i, n(rng));
      const std::vector<int32_t> qo = {0, 1, 2, 3};
      std::vector<float> cpu(size_t(indptr[3]) * H),
          scratch(size_t(sel::page_bounds_scratch_floats(g.n_q_heads, head_dim)));
      sel::page_bounds_cpu(view, side, q.dl(), qo.data(), g.n_q_heads, group_max, cpu.data(),
                           {1, indptr[3]}, scratch.data());
      Dev<char> d_q(q.dl().data, q.nbytes());
      Dev<int32_t> d_qo(qo);
      Dev<float> d_scores(cpu.size());
      d_scores.poison();
      sel::PageBoundLaunch pb{d_q.p, *sieve::storage_of(q.dl().dtype), d_qo.p, g.n_q_heads, d_side.p,
                              *sieve::storage_of(dtype), g.n_kv_heads, head_dim, d_indptr.p, d_indices.p,
                              3, max_pages, group_max, d_scores.p, {1, indptr[3]}, nullptr};
      ASSERT_EQ(sel::launch_page_bounds(pb), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto got = d_scores.get();
      for (size_t i = 0; i < cpu.size(); ++i)
        ASSERT_EQ(sel::order_key(got[i]), sel::order_key(cpu[i]))
            << "score " << i << " round " << round << " group_max " << group_max << ": " << got[i]
            << " vs " << cpu[i];
    }
  }
}

TEST(SelectionCuda, MinMaxAppendAndBoundsMatchTheCpuF32) {
  REQUIRE_GPU();
  bounds_and_append(sieve::kF32, 128);
}
TEST(SelectionCuda, MinMaxAppendAndBoundsMatchTheCpuBf16) {
  REQUIRE_GPU();
  bounds_and_append(sieve::kBF16, 128);
}
TEST(SelectionCuda, MinMaxAppendAndBoundsMatchTheCpuF16OddHeadDim) {
  REQUIRE_GPU();
  bounds_and_append(sieve::kF16, 40);
}
TEST(SelectionCuda, MinMaxAppendReadsEngineLayouts) {
  REQUIRE_GPU();
  for (const sieve::KvLayout& layout : sieve::kKvLayouts) {
    SCOPED_TRACE(sieve::kv_layout_name(layout));
    bounds_and_append(sieve::kBF16, 128, 8, 2, &layout);
    bounds_and_append(sieve::kF32, 40, 6, 3, &layout);
  }
}
TEST(SelectionCuda, BoundsMatchTheCpuOnTheElementWiseKernel) {
  REQUIRE_GPU();
  bounds_and_append(sieve::kBF16, 36, 6, 2);   // head_dim not a multiple of 8, G = 3
  bounds_and_append(sieve::kF32, 256, 4, 4);   // head_dim above 128
  bounds_and_append(sieve::kF16, 64, 40, 20);  // more KV heads than a block's 16 half-warps
}
TEST(SelectionCuda, BoundsMatchTheCpuOnTheVectorKernelForEveryGroupSize) {
  REQUIRE_GPU();
  bounds_and_append(sieve::kBF16, 128, 8, 8);   // G = 1
  bounds_and_append(sieve::kBF16, 128, 6, 3);   // G = 2, a KV-head tile of 3
  bounds_and_append(sieve::kBF16, 128, 28, 4);  // G = 7 (Qwen2-7B's 28 q / 4 KV heads)
  bounds_and_append(sieve::kF32, 64, 16, 2);    // G = 8
  bounds_and_append(sieve::kBF16, 16, 4, 1);    // lanes past head_dim hold empty partials
}

// Rows longer than the shared key buffer (read from global memory), rows sized by the
// max_row_items hint, and more rows than the emit kernel sums itself (the scan path).
TEST(SelectionCuda, TopKMatchesTheCpuOnLongRowsAndManyRows) {
  REQUIRE_GPU();
  std::mt19937 rng(77);
  struct Case {
    int32_t segs, H, min_len, spread, hint, k;
  };
  const Case cases[] = {
      {2, 3, 26000, 3000, 0, 700},      // beyond every buffer: global-memory path
      {3, 2, 5000, 3000, 8100, 900},    // the hint sizes the buffer
      {2, 2, 9000, 100, 4000, 4000},    // the hint is too small: those rows go to global memory
      {90, 50, 1, 40, 0, 7},            // 4500 rows: the one-block scan of the counts
  };
  for (const Case& cs : cases) {
    std::vector<int32_t> seg = {0};
    for (int32_t s = 0; s < cs.segs; ++s) seg.push_back(seg.back() + cs.min_len + int32_t(rng() % uint32_t(cs.spread)));
    const int32_t nnz = seg.back(), H = cs.H;
    std::vector<float> scores(size_t(nnz) * H);
    std::uniform_int_distribution<int> coarse(-50, 50), special(0, 60);
    std::normal_distribution<float> normal(0.f, 3.f);
    for (size_t i = 0; i < scores.size(); ++i) {
      scores[i] = (i / 7) % 2 ? float(coarse(rng)) : normal(rng);  // ties and distinct values
      const int sp = special(rng);
      if (sp == 0) scores[i] = -std::numeric_limits<float>::infinity();
      if (sp == 1) scores[i] = std::numeric_limits<float>::quiet_NaN();
    }
    const sel::ScoreLayout layout{1, nnz};
    sel::TopKBatch b{scores.data(), layout, seg.data(), cs.segs, H, 1, 2, cs.k};
    const int64_t cap = sel::top_k_capacity_needed(b);
    std::vector<int32_t> indptr(size_t(cs.segs) * H + 1), indices(size_t(cap) + 1, -1), scratch(size_t(nnz) + 1);
    const int64_t written = sel::top_k_batch_cpu(b, indptr.data(), indices.data(), scratch.data());
    Dev<float> d_scores(scores);
    Dev<int32_t> d_seg(seg), d_indptr(indptr.size()), d_indices(size_t(cap) + 1);
    Dev<char> d_scratch(sel::top_k_cuda_scratch_bytes(int64_t(cs.segs) * H));
    d_indptr.poison();
    d_indices.poison();
    sel::TopKCudaLaunch a{d_scores.p, layout, d_seg.p, cs.segs, H, b.head, b.tail, b.k,
                          d_scratch.p, d_indptr.p, d_indices.p, cap, nullptr, cs.hint};
    ASSERT_EQ(sel::launch_top_k_cuda(a), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(d_indptr.get(), indptr) << "segs " << cs.segs << " rows " << cs.segs * H;
    const auto got = d_indices.get();
    for (int64_t i = 0; i < written; ++i)
      ASSERT_EQ(got[size_t(i)], indices[size_t(i)]) << "entry " << i << " segs " << cs.segs;
  }
}

}  // namespace
