// The Hopper building blocks (core/kernels/cuda/hopper/microtests.hpp), one tile each, against an
// f64 reference on the same 16-bit inputs: wgmma with both operands from 128-byte-swizzled shared
// memory (S = Q·Kᵀ, 64 and 128 keys), wgmma with A from registers and B transposed (O = P·V), and
// TMA loads of shuffled K pages (HND and NHD pools, page sizes 8/16/32/64) checked byte for byte
// against the swizzle formula, then multiplied. Outputs start as NaN, so an element the kernel does
// not write fails. Products of 16-bit inputs are exact in f32, so each element is off by at most
// gamma(K, f32) x sum |a_i b_i| (tests/common/tolerance.hpp; kSafety covers truncating tensor-core
// adds). The tensor-map refusals need no GPU. Every other test skips unless the device is
// compute capability 9.0 (sm_90a code runs nowhere else).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/tolerance.hpp"
#include "cuda_test_util.hpp"
#include "microtests.hpp"
#include "swizzle.hpp"
#include "sieve/util/half.hpp"
#include "tensor_map.hpp"

namespace sieve {
namespace {

namespace sm90 = kernels::cuda::sm90;
using cuda_test::CudaTest;
using cuda_test::DeviceBuffer;

constexpr int kD = 128;

// Random 16-bit values in [lo, hi): the stored bits and the exact values they hold.
struct Half16 {
  std::vector<uint16_t> bits;
  std::vector<double> val;
};
Half16 random16(Storage dt, size_t n, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  std::uniform_real_distribution<float> u(lo, hi);
  Half16 h;
  h.bits.resize(n);
  h.val.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = u(rng);
    h.bits[i] = dt == Storage::bf16 ? f32_to_bf16(x) : f32_to_f16(x);
    h.val[i] = dt == Storage::bf16 ? bf16_to_f32(h.bits[i]) : f16_to_f32(h.bits[i]);
  }
  return h;
}

DeviceBuffer upload(const std::vector<uint16_t>& h) {
  DeviceBuffer d(h.size() * 2);
  EXPECT_EQ(cudaMemcpy(d.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}
// n floats of NaN (all bits set).
DeviceBuffer poisoned(size_t n) {
  DeviceBuffer d(n * 4);
  EXPECT_EQ(cudaMemset(d.get(), 0xFF, n * 4), cudaSuccess);
  return d;
}
std::vector<float> download(const DeviceBuffer& d, size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d.get(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// C[m][n] = sum_k A(m, k) B(k, n) in f64 against `got`, each element within its gamma bound.
template <class A, class B>
void expect_product(const std::vector<float>& got, int M, int N, int K, A&& a, B&& b, const std::string& what) {
  int bad = 0;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        ref += a(m, k) * b(k, n);
        mag += std::abs(a(m, k) * b(k, n));
      }
      const double tol = tolerance::kSafety * tolerance::gamma(K, tolerance::kF32) * mag;
      const float g = got[size_t(m) * N + n];
      if (!(std::abs(g - ref) <= tol) && bad++ < 5)
        ADD_FAILURE() << what << ": (" << m << ", " << n << ") = " << g << ", f64 reference " << ref << " +- " << tol;
    }
  EXPECT_EQ(bad, 0) << what << ": elements off";
}

class HopperTile : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    if (!sm90::device_has_wgmma(0)) GTEST_SKIP() << "device 0 is not compute capability 9.0 (sm_90a)";
  }
};

TEST_F(HopperTile, QkFromSwizzledSharedMemoryMatchesF64) {
  std::mt19937 rng(21);
  for (const Storage dt : {Storage::bf16, Storage::f16})
    for (const int n : {64, 128}) {
      const Half16 q = random16(dt, 64 * kD, rng), k = random16(dt, size_t(n) * kD, rng);
      DeviceBuffer dq = upload(q.bits), dk = upload(k.bits), ds = poisoned(size_t(64) * n);
      SIEVE_CUDA_OK(sm90::run_qk_tile(dt, n, dq.get(), dk.get(), static_cast<float*>(ds.get()), stream_));
      SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
      expect_product(
          download(ds, size_t(64) * n), 64, n, kD, [&](int m, int i) { return q.val[m * kD + i]; },
          [&](int i, int j) { return k.val[j * kD + i]; }, std::string(storage_name(dt)) + " QK n" + std::to_string(n));
    }
}

TEST_F(HopperTile, PvWithRegisterAAndTransposedBMatchesF64) {
  std::mt19937 rng(22);
  for (const Storage dt : {Storage::bf16, Storage::f16}) {
    const Half16 p = random16(dt, 64 * 64, rng, 0.f, 1.f), v = random16(dt, 64 * kD, rng);
    DeviceBuffer dp = upload(p.bits), dv = upload(v.bits), d_o = poisoned(size_t(64) * kD);
    SIEVE_CUDA_OK(sm90::run_pv_tile(dt, dp.get(), dv.get(), static_cast<float*>(d_o.get()), stream_));
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
    expect_product(
        download(d_o, size_t(64) * kD), 64, kD, 64, [&](int m, int k) { return p.val[m * 64 + k]; },
        [&](int k, int j) { return v.val[k * kD + j]; }, std::string(storage_name(dt)) + " PV");
  }
}

// A pool of 12 pages x 2 KV heads, HND ([page][head][token][d]) or NHD ([page][token][head][d]);
// the tile reads KV head 1 from 64 / page_size pages in a shuffled order. Pages the tile does
// not read hold NaN, so reading a wrong page shows in S.
TEST_F(HopperTile, TmaLoadsShuffledPagesSwizzledThenQk) {
  std::mt19937 rng(23);
  constexpr int kPages = 12, kHeads = 2, kHead = 1;
  for (const Storage dt : {Storage::bf16, Storage::f16})
    for (const bool nhd : {false, true})
      for (const int ps : {8, 16, 32, 64}) {
        const std::string what = std::string(storage_name(dt)) + (nhd ? " NHD" : " HND") + " page " + std::to_string(ps);
        const PageStrides st = nhd ? PageStrides{int64_t(ps) * kHeads * kD, kD, kHeads * kD}
                                   : compact_hnd_strides(kHeads, ps, kD);
        const size_t pool_n = size_t(kPages) * kHeads * ps * kD;
        Half16 pool = random16(dt, pool_n, rng);
        const int n_tile_pages = 64 / ps;
        std::vector<int32_t> pages(kPages);
        for (int i = 0; i < kPages; ++i) pages[i] = i;
        std::shuffle(pages.begin(), pages.end(), rng);
        pages.resize(n_tile_pages);
        const uint16_t nan16 = dt == Storage::bf16 ? 0x7FC0 : 0x7E00;
        for (int pg = 0; pg < kPages; ++pg)
          if (std::find(pages.begin(), pages.end(), pg) == pages.end())
            for (int h = 0; h < kHeads; ++h)
              for (int t = 0; t < ps; ++t)
                for (int c = 0; c < kD; ++c) pool.bits[st.row(pg, h, t) + c] = nan16;
        auto key = [&](int r, int c) { return st.row(pages[r / ps], kHead, r % ps) + c; };

        DeviceBuffer dpool = upload(pool.bits);
        CUtensorMap map{};
        const sm90::PagedPoolView view{dpool.get(), dt, kD, ps, kHeads, kPages, st};
        const std::string why = sm90::encode_paged_tensor_map(view, ps, &map);
        ASSERT_EQ(why, "") << what;
        const Half16 q = random16(dt, 64 * kD, rng);
        DeviceBuffer dq = upload(q.bits), dpages(pages.size() * 4), ds = poisoned(64 * 64), ddump(2 * 64 * 128);
        SIEVE_CUDA_OK(cudaMemcpy(dpages.get(), pages.data(), pages.size() * 4, cudaMemcpyHostToDevice));
        SIEVE_CUDA_OK(sm90::run_tma_qk_tile(dt, map, static_cast<const int32_t*>(dpages.get()), ps, kHead, dq.get(),
                                            static_cast<float*>(ds.get()), static_cast<uint8_t*>(ddump.get()), stream_));
        SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));

        std::vector<uint8_t> dump(2 * 64 * 128);
        SIEVE_CUDA_OK(cudaMemcpy(dump.data(), ddump.get(), dump.size(), cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int r = 0; r < 64; ++r)
          for (int c = 0; c < kD; ++c) {
            uint16_t got;
            std::memcpy(&got, dump.data() + (c / 64) * 64 * 128 + sm90::sw128_offset(r, c % 64), 2);
            if (got != pool.bits[key(r, c)] && bad++ < 5)
              ADD_FAILURE() << what << ": shared K(" << r << ", " << c << ") = 0x" << std::hex << got << ", pool 0x"
                            << pool.bits[key(r, c)] << std::dec;
          }
        EXPECT_EQ(bad, 0) << what << ": swizzled bytes off";
        expect_product(
            download(ds, 64 * 64), 64, 64, kD, [&](int m, int i) { return q.val[m * kD + i]; },
            [&](int i, int j) { return pool.val[key(j, i)]; }, what + " QK");
      }
}

// What the TMA path refuses, each with its one line (no device needed: checked before the driver).
TEST(HopperTensorMap, RefusesPoolsItCannotRead) {
  alignas(16) static uint16_t pool[16 * 2 * 16 * 128];
  const sm90::PagedPoolView ok{pool, Storage::bf16, 128, 16, 2, 16, compact_hnd_strides(2, 16, 128)};
  CUtensorMap map{};
  auto refusal = [&](sm90::PagedPoolView v, int32_t rows) { return sm90::encode_paged_tensor_map(v, rows, &map); };
  sm90::PagedPoolView v = ok;
  v.dt = Storage::f32;
  EXPECT_NE(refusal(v, 16).find("f32"), std::string::npos);
  v = ok;
  v.head_dim = 96;
  EXPECT_NE(refusal(v, 16).find("head_dim a multiple of 64, got 96"), std::string::npos);
  EXPECT_NE(refusal(ok, 17).find("17 tokens"), std::string::npos);
  EXPECT_NE(refusal(ok, 0).find("0 tokens"), std::string::npos);
  v = ok;
  v.base = reinterpret_cast<const uint8_t*>(pool) + 2;
  EXPECT_NE(refusal(v, 16).find("16-byte aligned"), std::string::npos);
  v = ok;
  v.strides.token = 132;  // 264 bytes
  EXPECT_NE(refusal(v, 16).find("stride of 132 elements"), std::string::npos);
}

TEST(HopperTensorMap, RefusesQueriesItCannotRead) {
  alignas(16) static uint16_t q[8 * 4 * 128];
  const sm90::QueryRowsView ok{q, Storage::bf16, 8, 4, 128};
  CUtensorMap map{};
  auto refusal = [&](sm90::QueryRowsView v, int32_t heads, int32_t tokens) {
    return sm90::encode_query_tensor_map(v, heads, tokens, &map);
  };
  sm90::QueryRowsView v = ok;
  v.dt = Storage::f32;
  EXPECT_NE(refusal(v, 4, 2).find("q is f32"), std::string::npos);
  v = ok;
  v.head_dim = 96;
  EXPECT_NE(refusal(v, 4, 2).find("head_dim a multiple of 64, got 96"), std::string::npos);
  EXPECT_NE(refusal(ok, 0, 2).find("0 heads x 2 tokens"), std::string::npos);
  EXPECT_NE(refusal(ok, 4, 257).find("4 heads x 257 tokens"), std::string::npos);
  v = ok;
  v.base = reinterpret_cast<const uint8_t*>(q) + 2;
  EXPECT_NE(refusal(v, 4, 2).find("16-byte aligned"), std::string::npos);
  v = ok;
  v.n_tokens = 0;
  EXPECT_NE(refusal(v, 4, 2).find("no rows"), std::string::npos);
}

}  // namespace
}  // namespace sieve
