// Incremental views of the paged CUDA store (view_delta.hpp: the packed description uploaded in
// one copy, the indices merged on the device): the random serving run of tests/kv checks every
// device page table (and the host mirrors) against the model of the resident tokens, and a long
// decode at a larger batch checks the table after every step across many page boundaries.
#include <gtest/gtest.h>

#include <array>
#include <vector>

#include "../kv/kv_test_support.hpp"
#include "../kv/view_scenario.hpp"
#include "cuda_test_util.hpp"
#include "sieve/kv/paged_store.hpp"

namespace sieve {
namespace {

using cuda_test::CudaTest;
using cuda_test::DeviceTensor;
using cuda_test::TestServices;
using kv_test::make_config;
using kv_test::Store;
using kv_test::ViewScenario;
using kv_test::ViewTables;

constexpr DLDevice kGpu{kDLCUDA, 0};

struct CudaBackend final : kv_test::Backend {
  cudaStream_t stream;
  std::array<DeviceTensor, 2> held;
  explicit CudaBackend(cudaStream_t s) : stream(s) {}
  const DLTensor* tokens(const HostTensor& h, int which) override {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);  // the previous rows are read
    held[size_t(which)] = DeviceTensor(h);
    return &held[size_t(which)].dl;
  }
  ViewTables read(const sieve_paged_kv& view) override {
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    // Raw bytes into 4-byte words: a 16-bit pool (bf16 K/V) fills half as many words as it has
    // elements (copying numel * 4 bytes read past its allocation).
    auto get = [](const DLTensor& t, auto& out) {
      const size_t bytes = size_t(numel(t)) * size_t(t.dtype.bits / 8);
      out.resize((bytes + 3) / 4);
      if (bytes) {
        EXPECT_EQ(cudaMemcpy(out.data(), t.data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      }
    };
    ViewTables t;
    EXPECT_EQ(view.indptr.device.device_type, kDLCUDA);
    EXPECT_EQ(view.indices.device.device_type, kDLCUDA);
    get(view.indptr, t.indptr);
    get(view.indices, t.indices);
    get(view.last_page_len, t.last);
    get(view.k_pages, t.k);
    get(view.v_pages, t.v);
    t.indptr_host.assign(view.indptr_host, view.indptr_host + view.batch + 1);
    t.last_host.assign(view.last_page_len_host, view.last_page_len_host + view.batch);
    return t;
  }
};

// Appends k / v (rows split by indptr) to `ids` in layer 0, views them in that order and reads the
// view back; its device arrays must equal its host mirrors. Empty when append or view failed.
ViewTables append_and_view(Store& st, CudaBackend& be, std::vector<int32_t>& ids, std::vector<int32_t>& indptr,
                           const HostTensor& k, const HostTensor& v) {
  auto a = kv_test::make_append(0, ids, indptr, be.tokens(k, 0), be.tokens(v, 1));
  sieve_paged_kv view{};
  if (st.api->append(st.s, &a) != SIEVE_OK || st.api->view(st.s, 0, ids.data(), int32_t(ids.size()), &view) != SIEVE_OK) {
    ADD_FAILURE() << st.error();
    return {};
  }
  ViewTables t = be.read(view);
  EXPECT_EQ(t.indptr, t.indptr_host);
  EXPECT_EQ(t.last, t.last_host);
  return t;
}

class PagedStoreCudaViews : public CudaTest {};

TEST_F(PagedStoreCudaViews, EveryViewOfARandomServingRunIsExact) {
  for (uint32_t seed : {1u, 2u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    TestServices svc(stream_);
    {
      const int max_batch = 6;
      Store st(kv::paged_cuda_store_api(), &svc.table,
               make_config(ViewScenario::kLayers, ViewScenario::kHkv, ViewScenario::kD, ViewScenario::kPage, kF32,
                           ViewScenario::kPages, kGpu, max_batch));
      ASSERT_NE(st.s, nullptr) << st.err;
      CudaBackend be(stream_);
      ViewScenario run(st, be, max_batch, seed);
      run.run(300);
      EXPECT_GT(run.views_checked(), 600);
    }
    EXPECT_EQ(svc.live, 0) << "allocations the store did not free";
  }
}

// Batch 16, ragged prompts, then 200 decode steps (12+ page boundaries per sequence, at
// different steps for each; each change rides in a kernel's parameters): after every step the device table equals a rebuild on the host
// from the lengths, and the page ids of each sequence never change once given.
TEST_F(PagedStoreCudaViews, LongDecodeKeepsTheDeviceTableExact) {
  TestServices svc(stream_);
  {
    const int B = 16, page = 16, hkv = 1, d = 4;
    Store st(kv::paged_cuda_store_api(), &svc.table, make_config(1, hkv, d, page, kBF16, 4096, kGpu, B));
    ASSERT_NE(st.s, nullptr) << st.err;
    CudaBackend be(stream_);
    std::vector<int32_t> ids;
    for (int b = 0; b < B; ++b) ids.push_back(st.add());
    std::vector<int32_t> len(B, 0);
    std::vector<std::vector<int32_t>> pages(B);  // page ids seen so far, per sequence
    for (int step = 0; step <= 200 && !HasFatalFailure(); ++step) {
      std::vector<int32_t> indptr = {0};
      // The prompts fill ~1500 pages: the first view is a full rebuild through the staging ring.
      for (int b = 0; b < B; ++b) indptr.push_back(indptr.back() + (step == 0 ? 1 + 200 * b : 1));
      HostTensor k({indptr.back(), hkv, d}, kF32), v({indptr.back(), hkv, d}, kF32);
      const ViewTables t = append_and_view(st, be, ids, indptr, k, v);
      ASSERT_FALSE(HasFailure()) << "step " << step;
      for (int b = 0; b < B; ++b) len[b] += indptr[b + 1] - indptr[b];
      int32_t at = 0;
      for (int b = 0; b < B; ++b) {
        const int32_t np = (len[b] + page - 1) / page;
        ASSERT_EQ(t.indptr[b], at) << "step " << step;
        ASSERT_EQ(t.last[b], len[b] - (np - 1) * page) << "step " << step;
        for (int32_t i = 0; i < np; ++i) {
          const int32_t p = t.indices[size_t(at + i)];
          if (i < int32_t(pages[b].size())) ASSERT_EQ(p, pages[b][size_t(i)]) << "step " << step << ", seq " << b;
          else pages[b].push_back(p);
        }
        at += np;
      }
      ASSERT_EQ(t.indptr[B], at) << "step " << step;
    }
  }
  EXPECT_EQ(svc.live, 0) << "allocations the store did not free";
}

// 1000 sequences: the appends' slot lists (> 128) and the views' changes (> 900 ints) are too
// large for kernel parameters and take the staging ring (full rebuild, last_page_len only, pages
// added); K in f32 and V in bf16 in one append take one scatter launch each. Every token's K and
// V read back through every view.
TEST_F(PagedStoreCudaViews, LargeBatchesTakeTheStagedPaths) {
  TestServices svc(stream_);
  {
    const int B = 1000, page = 16, d = 4;
    Store st(kv::paged_cuda_store_api(), &svc.table, make_config(1, 1, d, page, kF32, 3 * B, kGpu, B));
    ASSERT_NE(st.s, nullptr) << st.err;
    CudaBackend be(stream_);
    std::vector<int32_t> ids;
    for (int b = 0; b < B; ++b) ids.push_back(st.add());
    std::vector<std::vector<float>> tokens(B);
    float next = 0;
    for (int per : {1, 1, 15, 1}) {  // rebuild, last_page_len only, a page each, last_page_len only
      std::vector<int32_t> indptr = {0};
      for (int b = 0; b < B; ++b) indptr.push_back(indptr.back() + per);
      HostTensor k({indptr.back(), 1, d}, kF32), v({indptr.back(), 1, d}, kBF16);
      for (int b = 0; b < B; ++b)
        for (int32_t r = indptr[b]; r < indptr[b + 1]; ++r) {
          next += 1;
          for (int i = 0; i < d; ++i) k.set(int64_t(r) * d + i, next), v.set(int64_t(r) * d + i, float(int(next) % 256));
          tokens[b].push_back(next);
        }
      const ViewTables t = append_and_view(st, be, ids, indptr, k, v);
      ASSERT_FALSE(HasFailure()) << "per " << per;
      int64_t wrong = 0;
      for (int b = 0; b < B; ++b) {
        const int32_t n = int32_t(tokens[b].size()), np = (n + page - 1) / page;
        ASSERT_EQ(t.indptr[b + 1] - t.indptr[b], np) << "per " << per << ", sequence " << b;
        ASSERT_EQ(t.last[b], n - (np - 1) * page) << "per " << per << ", sequence " << b;
        for (int32_t tok = 0; tok < n; ++tok) {
          const size_t at = (size_t(t.indices[size_t(t.indptr[b] + tok / page)]) * page + size_t(tok % page)) * d;
          wrong += t.k[at] != tokens[b][size_t(tok)];
          wrong += t.v[at + d - 1] != float(int(tokens[b][size_t(tok)]) % 256);
        }
      }
      EXPECT_EQ(wrong, 0) << "per " << per;
    }
  }
  EXPECT_EQ(svc.live, 0) << "allocations the store did not free";
}

// The device indices hold pages_per_layer entries: a view listing a sequence twice past that is
// refused, and the next view is still exact.
TEST_F(PagedStoreCudaViews, RefusesAViewLargerThanThePool) {
  TestServices svc(stream_);
  {
    Store st(kv::paged_cuda_store_api(), &svc.table, make_config(1, 1, 4, 16, kF32, 4, kGpu, 4));
    ASSERT_NE(st.s, nullptr) << st.err;
    CudaBackend be(stream_);
    std::vector<int32_t> ids = {st.add()}, indptr = {0, 48};
    HostTensor k({48, 1, 4}, kF32), v({48, 1, 4}, kF32);
    auto a = kv_test::make_append(0, ids, indptr, be.tokens(k, 0), be.tokens(v, 1));
    ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK) << st.error();
    std::vector<int32_t> twice = {ids[0], ids[0]};
    sieve_paged_kv view{};
    EXPECT_EQ(st.api->view(st.s, 0, twice.data(), 2, &view), SIEVE_ERR_CAPACITY);
    ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 1, &view), SIEVE_OK) << st.error();
    const ViewTables t = be.read(view);
    EXPECT_EQ(t.indptr, (std::vector<int32_t>{0, 3}));
    EXPECT_EQ(t.last, (std::vector<int32_t>{16}));
    EXPECT_EQ(t.indices.size(), 3u);
  }
  EXPECT_EQ(svc.live, 0) << "allocations the store did not free";
}

}  // namespace
}  // namespace sieve
