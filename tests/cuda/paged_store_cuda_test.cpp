// The paged CUDA KV store through its C table: scatter with dtype conversion and strided input
// rows, views (device arrays and host mirrors), sidecars zeroed when a page is taken, eviction and
// byte accounting, every allocation freed through the host services; the same appends into the
// CPU store give bit-identical pages; and attention over a CUDA store's view matches the f64
// reference over the CPU store's view of the same tokens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "../kv/kv_test_support.hpp"
#include "common/tolerance.hpp"
#include "cuda_test_util.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/kernels/attention_cuda.hpp"
#include "sieve/kernels/attention_cuda_checks.hpp"
#include "sieve/kv/paged_store.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/fidelity.hpp"

namespace sieve {
namespace {

using cuda_test::CudaTest;
using cuda_test::DeviceBuffer;
using cuda_test::DeviceTensor;
using cuda_test::TestServices;
using kv_test::keep_last_reason;
using kv_test::make_append;
using kv_test::make_config;
using kv_test::random_tokens;
using kv_test::Store;

constexpr int kMaxBatch = 4;  // sequences one view may take (RefusesWhatItCannotHold asks for 5)

// A device copy of `h` [n, hkv, d] whose token rows are `pad` elements longer than hkv * d and
// whose heads are `pad` apart too: strided input the store must follow.
struct StridedDeviceTokens {
  DeviceBuffer buf;
  int64_t shape[3];
  int64_t strides[3];
  DLTensor dl{};
  StridedDeviceTokens(const HostTensor& h, int pad) {
    const int64_t n = h.shape()[0], hkv = h.shape()[1], d = h.shape()[2];
    const size_t es = dtype_bytes(h.dl().dtype);
    strides[2] = 1;
    strides[1] = d + pad;
    strides[0] = hkv * (d + pad) + pad;
    shape[0] = n;
    shape[1] = hkv;
    shape[2] = d;
    buf = DeviceBuffer(size_t(std::max<int64_t>(n * strides[0], 1)) * es);
    std::vector<unsigned char> host(buf.bytes(), 0xff);  // NaN-ish padding the store must skip
    for (int64_t t = 0; t < n; ++t)
      for (int64_t g = 0; g < hkv; ++g)
        std::memcpy(host.data() + (t * strides[0] + g * strides[1]) * es,
                    static_cast<const char*>(h.dl().data) + ((t * hkv + g) * d) * es, size_t(d) * es);
    EXPECT_EQ(cudaMemcpy(buf.get(), host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    dl = make_view(buf.get(), DLDevice{kDLCUDA, 0}, h.dl().dtype, 3, shape, strides);
  }
};

// Host copy of a view's pools and page table (device views are read back).
struct ViewCopy {
  std::vector<unsigned char> k, v, kp;
  std::vector<int32_t> indptr, indices, last;
  size_t es = 0;
  int64_t hkv = 0, ps = 0, d = 0;

  ViewCopy(const sieve_paged_kv& view) {
    es = dtype_bytes(view.k_pages.dtype);
    hkv = view.k_pages.shape[1];
    ps = view.k_pages.shape[2];
    d = view.k_pages.shape[3];
    const bool dev = view.k_pages.device.device_type == kDLCUDA;
    auto get = [&](const DLTensor& t, size_t bytes, void* dst) {
      if (!bytes || !t.data) return;
      if (dev) {
        EXPECT_EQ(cudaMemcpy(dst, t.data, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      } else {
        std::memcpy(dst, t.data, bytes);
      }
    };
    const size_t pool = size_t(numel(view.k_pages)) * es;
    k.resize(pool);
    v.resize(pool);
    get(view.k_pages, pool, k.data());
    get(view.v_pages, pool, v.data());
    if (view.k_pre_rope_pages.data) {
      kp.resize(pool);
      get(view.k_pre_rope_pages, pool, kp.data());
    }
    indptr.resize(size_t(view.indptr.shape[0]));
    indices.resize(size_t(view.indices.shape[0]));
    last.resize(size_t(view.last_page_len.shape[0]));
    get(view.indptr, indptr.size() * 4, indptr.data());
    get(view.indices, indices.size() * 4, indices.data());
    get(view.last_page_len, last.size() * 4, last.data());
  }
  int64_t tokens(int b) const {
    const int np = indptr[b + 1] - indptr[b];
    return np ? int64_t(np - 1) * ps + last[b] : 0;
  }
  // Byte offset of (sequence b, token t, head h) in the pools.
  size_t at(int b, int64_t t, int64_t h) const {
    const int64_t page = indices[size_t(indptr[b] + t / ps)];
    return size_t(((page * hkv + h) * ps + t % ps) * d) * es;
  }
};

class PagedStoreCuda : public CudaTest {
 protected:
  static constexpr DLDevice kGpu{kDLCUDA, 0};
};

TEST_F(PagedStoreCuda, AppendConvertsScattersAndViews) {
  struct Case {
    DLDataType src, store;
  };
  for (Case c : {Case{kF32, kBF16}, Case{kF32, kF16}, Case{kBF16, kF32}, Case{kF16, kBF16},
                 Case{kF32, kF32}, Case{kBF16, kBF16}}) {
    SCOPED_TRACE(dtype_name(c.src) + " -> " + dtype_name(c.store));
    TestServices svc(stream_);
    {
      const int hkv = 2, d = 64, ps = 16;
      Store st(kv::paged_cuda_store_api(), &svc.table,
               make_config(2, hkv, d, ps, c.store, 40, kGpu, kMaxBatch));
      ASSERT_NE(st.s, nullptr) << st.err;
      const int32_t a = st.add(), b = st.add();
      // Ragged first append (37 + 5 tokens), strided rows; then 20 more for a.
      HostTensor k1 = random_tokens(42, hkv, d, c.src, 1), v1 = random_tokens(42, hkv, d, c.src, 2);
      HostTensor k2 = random_tokens(20, hkv, d, c.src, 3), v2 = random_tokens(20, hkv, d, c.src, 4);
      StridedDeviceTokens dk1(k1, 8), dv1(v1, 3);
      DeviceTensor dk2(k2), dv2(v2);
      std::vector<int32_t> ids1{a, b}, ip1{0, 37, 42}, ids2{a}, ip2{0, 20};
      sieve_kv_append a1 = make_append(1, ids1, ip1, &dk1.dl, &dv1.dl);
      sieve_kv_append a2 = make_append(1, ids2, ip2, &dk2.dl, &dv2.dl);
      ASSERT_EQ(st.api->append(st.s, &a1), SIEVE_OK) << st.error();
      ASSERT_EQ(st.api->append(st.s, &a2), SIEVE_OK) << st.error();
      int32_t len = 0;
      ASSERT_EQ(st.api->seq_len(st.s, 1, a, &len), SIEVE_OK);
      EXPECT_EQ(len, 57);

      std::vector<int32_t> order{b, a};
      sieve_paged_kv view{};
      ASSERT_EQ(st.api->view(st.s, 1, order.data(), 2, &view), SIEVE_OK) << st.error();
      EXPECT_EQ(view.k_pages.device.device_type, kDLCUDA);
      EXPECT_TRUE(same_dtype(view.k_pages.dtype, c.store));
      EXPECT_EQ(view.k_pre_rope_pages.data, nullptr);
      SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
      const ViewCopy vc(view);
      // Device page table == host mirrors.
      ASSERT_EQ(vc.indptr, std::vector<int32_t>(view.indptr_host, view.indptr_host + 3));
      ASSERT_EQ(vc.last, std::vector<int32_t>(view.last_page_len_host, view.last_page_len_host + 2));
      EXPECT_EQ(vc.indptr, (std::vector<int32_t>{0, 1, 5}));
      EXPECT_EQ(vc.last, (std::vector<int32_t>{5, 9}));
      // Every token's bits are the storage dtype's rounding of the input.
      HostTensor expect({1, 1, d}, c.store);
      int64_t wrong = 0;
      auto check = [&](const HostTensor& src, int64_t row, int seq, int64_t t, bool value) {
        for (int h = 0; h < hkv; ++h) {
          for (int i = 0; i < d; ++i) expect.set(i, src.get((row * hkv + h) * d + i));
          const auto& pool = value ? vc.v : vc.k;
          wrong += std::memcmp(pool.data() + vc.at(seq, t, h), expect.dl().data, size_t(d) * vc.es) != 0;
        }
      };
      for (int64_t t = 0; t < 37; ++t) check(k1, t, 1, t, false), check(v1, t, 1, t, true);
      for (int64_t t = 0; t < 5; ++t) check(k1, 37 + t, 0, t, false), check(v1, 37 + t, 0, t, true);
      for (int64_t t = 0; t < 20; ++t) check(k2, t, 1, 37 + t, false), check(v2, t, 1, 37 + t, true);
      EXPECT_EQ(wrong, 0);
    }
    EXPECT_EQ(svc.live, 0) << "allocations the store did not free";
  }
}

TEST_F(PagedStoreCuda, RefusesWhatItCannotHold) {
  TestServices svc(stream_);
  {
    Store st(kv::paged_cuda_store_api(), &svc.table, make_config(1, 2, 64, 16, kF32, 4, kGpu, kMaxBatch));
    ASSERT_NE(st.s, nullptr);
    std::vector<int32_t> ids;
    for (int i = 0; i < 5; ++i) ids.push_back(st.add());
    sieve_paged_kv view{};
    EXPECT_EQ(st.api->view(st.s, 0, ids.data(), 5, &view), SIEVE_ERR_CAPACITY);  // max_batch 4
    EXPECT_THAT(st.error(), testing::HasSubstr("max_batch"));
    // An empty sequence views as no pages.
    ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 2, &view), SIEVE_OK) << st.error();
    EXPECT_EQ(view.indptr_host[2], 0);
    EXPECT_EQ(view.last_page_len_host[0], 0);
    // Pool of 4 pages: 65 tokens need 5.
    HostTensor k = random_tokens(65, 2, 64, kF32, 1);
    DeviceTensor dk(k);
    std::vector<int32_t> one{ids[0]}, ip{0, 65};
    sieve_kv_append a = make_append(0, one, ip, &dk.dl, &dk.dl);
    EXPECT_EQ(st.api->append(st.s, &a), SIEVE_ERR_CAPACITY);
    // Host input into a device store.
    sieve_kv_append h = make_append(0, one, ip, &k.dl(), &k.dl());
    EXPECT_EQ(st.api->append(st.s, &h), SIEVE_ERR_INVALID_ARGUMENT);
  }
  EXPECT_EQ(svc.live, 0);
  // A CPU geometry is not a CUDA store.
  std::string err;
  sieve_kv_store* s = nullptr;
  const sieve_kv_config cpu = make_config(1, 2, 64, 16, kF32, 4, kCpu, kMaxBatch);
  EXPECT_EQ(kv::paged_cuda_store_api()->create(&svc.table, &cpu, &s, keep_last_reason(&err)),
            SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, testing::HasSubstr("geometry.device must be cuda"));
}

TEST_F(PagedStoreCuda, SidecarsZeroedOnTakeEvictionAccounting) {
  TestServices svc(stream_);
  {
    const int hkv = 2, d = 64, ps = 16, pages = 16;
    Store st(kv::paged_cuda_store_api(), &svc.table,
             make_config(2, hkv, d, ps, kBF16, pages, kGpu, kMaxBatch));
    ASSERT_NE(st.s, nullptr);
    sieve_sidecar_desc desc{};
    desc.hdr = SIEVE_HEADER_INIT(sieve_sidecar_desc);
    desc.name = "test.minmax";
    desc.dtype = kF32;
    desc.elems_per_head = 2 * d;
    int32_t slot = -1;
    ASSERT_EQ(st.api->register_sidecar(st.s, &desc, &slot), SIEVE_OK) << st.error();
    const size_t side_page = size_t(hkv) * 2 * d * 4;
    const size_t kv_page = size_t(hkv) * ps * d * 2 * 2;

    const int32_t a = st.add();
    HostTensor k = random_tokens(64, hkv, d, kF32, 5);  // 4 pages
    DeviceTensor dk(k);
    std::vector<int32_t> ids{a}, ip{0, 64};
    sieve_kv_append ap = make_append(0, ids, ip, &dk.dl, &dk.dl);
    ASSERT_EQ(st.api->append(st.s, &ap), SIEVE_OK) << st.error();
    EXPECT_EQ(st.bytes(), 4 * (kv_page + side_page));

    DLTensor side{};
    ASSERT_EQ(st.api->sidecar(st.s, 0, slot, &side), SIEVE_OK);
    EXPECT_EQ(side.device.device_type, kDLCUDA);
    ASSERT_EQ(side.shape[0], pages);
    // Freshly taken pages read zero; now scribble over every page as a policy would.
    std::vector<unsigned char> host(size_t(pages) * side_page);
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
    SIEVE_CUDA_OK(cudaMemcpy(host.data(), side.data, host.size(), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < 4 * side_page; ++i) ASSERT_EQ(host[i], 0) << i;
    SIEVE_CUDA_OK(cudaMemsetAsync(side.data, 0xab, host.size(), stream_));

    sieve_paged_kv view{};
    ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 1, &view), SIEVE_OK);
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
    const int32_t evicted = ViewCopy(view).indices[1];
    const int32_t logical[] = {1};
    uint64_t freed = 0;
    ASSERT_EQ(st.api->evict(st.s, 0, a, logical, 1, &freed), SIEVE_OK) << st.error();
    EXPECT_EQ(freed, kv_page + side_page);
    EXPECT_EQ(st.bytes(), 3 * (kv_page + side_page));
    int32_t len = 0;
    ASSERT_EQ(st.api->seq_len(st.s, 0, a, &len), SIEVE_OK);
    EXPECT_EQ(len, 48);

    // The next page taken is the evicted one: its sidecar slots are zero again, the others not.
    std::vector<int32_t> ip2{0, 1};
    HostTensor k1 = random_tokens(1, hkv, d, kF32, 6);
    DeviceTensor dk1(k1);
    sieve_kv_append ap2 = make_append(0, ids, ip2, &dk1.dl, &dk1.dl);
    ASSERT_EQ(st.api->append(st.s, &ap2), SIEVE_OK) << st.error();
    ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 1, &view), SIEVE_OK);
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
    const ViewCopy vc(view);
    ASSERT_EQ(vc.indices.size(), 4u);
    EXPECT_EQ(vc.indices.back(), evicted);
    SIEVE_CUDA_OK(cudaMemcpy(host.data(), side.data, host.size(), cudaMemcpyDeviceToHost));
    for (int32_t p = 0; p < pages; ++p) {
      const unsigned char want = p == evicted ? 0 : 0xab;
      for (size_t i = 0; i < side_page; ++i)
        ASSERT_EQ(host[size_t(p) * side_page + i], want) << "page " << p << " byte " << i;
    }
    EXPECT_EQ(st.bytes(), 4 * (kv_page + side_page));
    ASSERT_EQ(st.api->remove_sequence(st.s, a), SIEVE_OK);
    EXPECT_EQ(st.bytes(), 0u);
  }
  EXPECT_EQ(svc.live, 0);
}

TEST_F(PagedStoreCuda, SameAppendsAsTheCpuStoreGiveTheSameBits) {
  for (DLDataType store_dt : {kF32, kF16, kBF16}) {
    SCOPED_TRACE(dtype_name(store_dt));
    TestServices svc(stream_);
    {
      const int layers = 2, hkv = 2, d = 8, ps = 32, pages = 24;
      Store gpu(kv::paged_cuda_store_api(), &svc.table,
                make_config(layers, hkv, d, ps, store_dt, pages, kGpu, kMaxBatch, 1));
      Store cpu(kv::paged_cpu_store_api(), nullptr,
                make_config(layers, hkv, d, ps, store_dt, pages, kCpu, kMaxBatch, 1));
      ASSERT_NE(gpu.s, nullptr);
      ASSERT_NE(cpu.s, nullptr);
      std::vector<int32_t> ids;
      for (int i = 0; i < 3; ++i) {
        ids.push_back(gpu.add());
        ASSERT_EQ(cpu.add(), ids.back());
      }
      // Three rounds of ragged appends in mixed input dtypes, an eviction in between.
      const DLDataType inputs[] = {kF32, kBF16, kF16};
      for (int round = 0; round < 3; ++round) {
        std::vector<int32_t> ip{0, 70 - 20 * round, 71 - 20 * round, 100 - 20 * round};
        const int n = ip.back();
        const DLDataType in = inputs[round];
        HostTensor k = random_tokens(n, hkv, d, in, 10 + round), v = random_tokens(n, hkv, d, in, 20 + round),
                   kp = random_tokens(n, hkv, d, in, 30 + round);
        DeviceTensor dk(k), dv(v), dkp(kp);
        for (int layer = 0; layer < layers; ++layer) {
          sieve_kv_append ag = make_append(layer, ids, ip, &dk.dl, &dv.dl, &dkp.dl);
          sieve_kv_append ac = make_append(layer, ids, ip, &k.dl(), &v.dl(), &kp.dl());
          ASSERT_EQ(gpu.api->append(gpu.s, &ag), SIEVE_OK) << gpu.error();
          ASSERT_EQ(cpu.api->append(cpu.s, &ac), SIEVE_OK) << cpu.error();
        }
        if (round == 1) {
          const int32_t logical[] = {0, 2};
          uint64_t fg = 0, fc = 0;
          ASSERT_EQ(gpu.api->evict(gpu.s, 1, ids[0], logical, 2, &fg), SIEVE_OK) << gpu.error();
          ASSERT_EQ(cpu.api->evict(cpu.s, 1, ids[0], logical, 2, &fc), SIEVE_OK) << cpu.error();
          EXPECT_EQ(fg, fc);
        }
      }
      EXPECT_EQ(gpu.bytes(), cpu.bytes());
      for (int layer = 0; layer < layers; ++layer) {
        sieve_paged_kv vg{}, vcpu{};
        ASSERT_EQ(gpu.api->view(gpu.s, layer, ids.data(), 3, &vg), SIEVE_OK);
        ASSERT_EQ(cpu.api->view(cpu.s, layer, ids.data(), 3, &vcpu), SIEVE_OK);
        SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
        const ViewCopy g(vg), c(vcpu);
        ASSERT_EQ(g.indptr, c.indptr);
        ASSERT_EQ(g.indices, c.indices);
        ASSERT_EQ(g.last, c.last);
        int64_t differ = 0, compared = 0;
        for (int b = 0; b < 3; ++b)
          for (int64_t t = 0; t < g.tokens(b); ++t)
            for (int h = 0; h < hkv; ++h) {
              const size_t o = g.at(b, t, h), n = size_t(d) * g.es;
              differ += std::memcmp(g.k.data() + o, c.k.data() + o, n) != 0;
              differ += std::memcmp(g.v.data() + o, c.v.data() + o, n) != 0;
              differ += std::memcmp(g.kp.data() + o, c.kp.data() + o, n) != 0;
              compared += 3;
            }
        EXPECT_EQ(differ, 0) << "of " << compared << " head rows, layer " << layer;
        EXPECT_GT(compared, 0);
      }
    }
    EXPECT_EQ(svc.live, 0);
  }
}

TEST_F(PagedStoreCuda, AttentionOverTheStoreMatchesTheReference) {
  // Decode over a CUDA store's view, against the f64 reference over the CPU store's view of the
  // same appended tokens.
  TestServices svc(stream_);
  {
    const int hq = 8, hkv = 2, d = 64, ps = 16;
    Store gpu(kv::paged_cuda_store_api(), &svc.table,
              make_config(1, hkv, d, ps, kBF16, 64, kGpu, kMaxBatch));
    Store cpu(kv::paged_cpu_store_api(), nullptr, make_config(1, hkv, d, ps, kBF16, 64, kCpu, kMaxBatch));
    std::vector<int32_t> ids{gpu.add(), gpu.add()};
    cpu.add();
    cpu.add();
    std::vector<int32_t> ip{0, 300, 333};
    HostTensor k = random_tokens(333, hkv, d, kF32, 7), v = random_tokens(333, hkv, d, kF32, 8);
    DeviceTensor dk(k), dv(v);
    sieve_kv_append ag = make_append(0, ids, ip, &dk.dl, &dv.dl), ac = make_append(0, ids, ip, &k.dl(), &v.dl());
    ASSERT_EQ(gpu.api->append(gpu.s, &ag), SIEVE_OK) << gpu.error();
    ASSERT_EQ(cpu.api->append(cpu.s, &ac), SIEVE_OK) << cpu.error();
    sieve_paged_kv vg{}, vc{};
    ASSERT_EQ(gpu.api->view(gpu.s, 0, ids.data(), 2, &vg), SIEVE_OK);
    ASSERT_EQ(cpu.api->view(cpu.s, 0, ids.data(), 2, &vc), SIEVE_OK);

    HostTensor q = random_tokens(2, hq, d, kF32, 9), out({2, hq, d}, kF32), qo({3}, kI32);
    qo.data<int32_t>()[0] = 0;
    qo.data<int32_t>()[1] = 1;
    qo.data<int32_t>()[2] = 2;
    DeviceTensor dq(q), dout(out), dqo(qo);
    sieve_attention_args args = kernels::make_attention_args(
        SIEVE_PHASE_DECODE, hq, hkv, d, &q.dl(), &out.dl(), &qo.dl(), qo.data<int32_t>(), &vc);
    const reference::RefAttention ref = reference::attend_reference(args);

    args.q = &dq.dl;
    args.out = &dout.dl;
    args.qo_indptr = &dqo.dl;
    args.kv = &vg;
    std::string err;
    ASSERT_EQ(kernels::attend_cuda(args, stream_, &err), SIEVE_OK) << err;
    ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_OK) << err;
    dout.download(out);
    const reference::OutputError e = reference::compare_output(ref, out.dl());
    EXPECT_EQ(e.non_finite, 0);
    // f32 arithmetic (q is f32, so no tensor cores) over at most 300 keys: the arithmetic's
    // bound on a row's 2-norm error, with this q, k and v's largest row norms (bf16 storage
    // rounds them by < 2^-8, inside kSafety).
    auto max_norm = [&](const HostTensor& t) {
      return tolerance::max_row_norm(t.data<float>(), t.numel() / d, d);
    };
    const double logit = max_norm(q) * max_norm(k) / std::sqrt(double(d));
    const double row_bound =
        tolerance::softmax_sum(300, d, logit, tolerance::kF32) * max_norm(v);
    for (int t = 0; t < 2; ++t)
      for (int h = 0; h < hq; ++h) {
        double err = 0;
        for (int i = 0; i < d; ++i)
          err += std::pow(out.get((int64_t(t) * hq + h) * d + i) - ref.out_row(t, h)[size_t(i)], 2);
        EXPECT_LE(std::sqrt(err), row_bound) << "token " << t << ", head " << h;
      }
  }
  EXPECT_EQ(svc.live, 0);
}

}  // namespace
}  // namespace sieve
