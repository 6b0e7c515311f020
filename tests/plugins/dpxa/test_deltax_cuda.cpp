// dpxa mode=deltax (DeltaXAttention) on CUDA against the plugin's CPU path, with the runtime's
// real host services on both devices (CUDA: its stream and core kernel). Skips without a GPU.
//   - the per-block packing (core/packing's launch_block_pack) gives keep masks bit-equal to
//     packing::keep_mask on the same keys (f32 and bf16 pages, several head dims, ragged lengths);
//   - CUDA deltax == CPU deltax on fresh ragged GQA inputs (sequences not multiples of the block,
//     a chunked prefill, a sequence without queries), both row kinds, into a NaN-poisoned output:
//     f32 and bf16 (output bf16) to twice the arithmetic's bound (common/attention_tolerance.hpp).
//     The selections must be the same for this to mean anything, so each case first checks that
//     the CUDA CSR equals the CPU's entry for entry: f32 and bf16 with head_dim 40 take the
//     scalar scoring kernel (bit-identical shares), bf16 with head_dim 64 keeps every tile
//     (tau 1) and ranks nothing (exact_top 0);
//   - exact_top = 1 equals mode=select (the core CUDA kernel) on the same selection, and the
//     default exact_top differs from it (packed tiles change the output).
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "math/dpxa_tiles.hpp"
#include "dpxa_device_call.hpp"
#include "dpxa_scenario.hpp"
#include "sieve/packing/block_pack_cuda.hpp"
#include "sieve/packing/pack_cpu.hpp"
#include "sieve/runtime/host_services.hpp"
#include "support/cuda_device.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
using Rows = std::vector<std::vector<int32_t>>;
namespace tolerance = sieve::tolerance;

class DeltaXCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = cuda_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    api_ = lib_.policy();
    ASSERT_NE(api_, nullptr);
    cpu_ = std::make_unique<sieve::runtime::HostServices>(sieve::kCpu);
    cuda_ = std::make_unique<sieve::runtime::HostServices>(kCuda0);
  }
  void TearDown() override {
    for (sieve_policy* p : policies_) api_->destroy(p);
  }
  sieve_policy* create(const sieve::runtime::HostServices& host, const sieve_geometry& g,
                       const DpxaArgs& a) {
    DpxaValues v(a);
    sieve_policy* p = create_or_fail(api_, host.table(), g, v.v, DpxaValues::kCount);
    if (p) policies_.push_back(p);
    return p;
  }
  // CPU select + attend (as a host: attend_as_host) into a NaN-poisoned host output; the rows to
  // *rows.
  std::vector<double> run_cpu(DpxaScenario& sc, const DpxaArgs& a, Rows* rows) {
    sieve_policy* p = create(*cpu_, sc.g, a);
    if (!p) return {};
    HostSelection sel(int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads, 1 << 20);
    uint32_t stats = 0;
    EXPECT_EQ(api_->select(p, &sc.call, sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
    sc.w.poison_outputs();
    EXPECT_EQ(attend_as_host(api_, p, sc.call, sel.get(), &sc.w.out.dl(), cpu_->table()), SIEVE_OK)
        << api_->last_error(p);
    *rows = sel.rows();
    return workload_output(sc.w);
  }
  // The same on the device; the rows read back from the device CSR.
  std::vector<double> run_cuda(DeviceCall& dc, const DpxaArgs& a, int64_t max_rows, Rows* rows) {
    sieve_policy* p = create(*cuda_, dc.geometry, a);
    if (!p) return {};
    DeviceSelection ds(max_rows, 1 << 20);
    uint32_t stats = 0;
    EXPECT_EQ(api_->select(p, &dc.call, &ds.sel, &stats), SIEVE_OK) << api_->last_error(p);
    dc.poison();
    EXPECT_EQ(attend_as_host(api_, p, dc.call, &ds.sel, &dc.out_t, cuda_->table()), SIEVE_OK)
        << api_->last_error(p);
    std::string err;
    EXPECT_TRUE(cuda_->synchronize(&err)) << err;
    *rows = ds.rows();
    return dc.output();
  }

  PluginLibrary lib_{"dpxa"};
  const sieve_policy_api* api_ = nullptr;
  std::unique_ptr<sieve::runtime::HostServices> cpu_, cuda_;
  std::vector<sieve_policy*> policies_;
};

// Packing: the device walk's keep masks equal keep_mask's bit for bit, and its per-block anchor
// lists are those masks' anchors.
TEST_F(DeltaXCuda, PackingKeepMasksEqualTheCpu) {
  struct Case {
    DLDataType dtype;
    int32_t d, B;
    float threshold;
  };
  const std::vector<Case> cases = {{sieve::kF32, 128, 128, 0.83f}, {sieve::kBF16, 128, 128, 0.83f},
                                   {sieve::kBF16, 40, 32, 0.75f},  {sieve::kF32, 256, 64, 0.9f},
                                   {sieve::kF16, 64, 16, 0.8f}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << sieve::dtype_name(c.dtype) << " d " << c.d << " B " << c.B);
    DpxaScenario sc({333, 129, 1, 260}, {1, 1, 1, 1}, 16, 4, 2, c.d, 31 + uint64_t(c.d), c.dtype);
    DeviceBytes k(tensor_bytes(sc.w.k_pages), sc.w.k_pages.dl().data);
    DeviceBytes pages(tensor_bytes(sc.w.kv_indices), sc.w.kv_indices.dl().data);
    int64_t kept = 0, total = 0;
    for (int32_t b = 0; b < sc.w.batch; ++b) {
      const int32_t n = sc.w.kv_len[size_t(b)], hkv = sc.g.n_kv_heads;
      const int32_t blocks = (n + c.B - 1) / c.B;
      DeviceBytes keep(size_t(hkv) * n), offs(size_t(hkv) * blocks * c.B),
          counts(size_t(hkv) * blocks * 4);
      ASSERT_EQ(cudaMemset(keep.p, 7, keep.bytes), cudaSuccess);  // neither 0 nor 1
      sieve::packing::BlockPackLaunch l{};
      l.k_pages = k.p;
      l.k_strides = sieve::compact_hnd_strides(hkv, sc.g.page_size, c.d);  // the workload's pool
      l.kv_dtype = sieve::require_storage(c.dtype, "the scenario's keys");
      l.pages = static_cast<const int32_t*>(pages.p) + sc.w.kv_indptr.data<int32_t>()[b];
      l.hkv = hkv;
      l.d = c.d;
      l.page_size = sc.g.page_size;
      l.n = n;
      l.B = c.B;
      l.threshold = c.threshold;
      l.keep = static_cast<uint8_t*>(keep.p);
      l.anchor_off = static_cast<uint8_t*>(offs.p);
      l.n_anchors = static_cast<int32_t*>(counts.p);
      ASSERT_EQ(sieve::packing::launch_block_pack(l), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const auto gk = keep.get<uint8_t>(), go = offs.get<uint8_t>();
      const auto gc = counts.get<int32_t>();
      for (int32_t kvh = 0; kvh < hkv; ++kvh) {
        std::vector<float> kf;
        for (const auto& row : sc.keys(b, kvh)) kf.insert(kf.end(), row.begin(), row.end());
        std::vector<uint8_t> want(static_cast<size_t>(n));
        const sieve::packing::KeepRule rule{sieve::packing::kDelta, sieve::packing::kCos,
                                            c.threshold, 1.0, 0, c.B};
        sieve::packing::keep_mask(rule, 0, kvh, kf.data(), n, c.d, want.data());
        int32_t mismatches = 0;
        for (int32_t i = 0; i < n; ++i) mismatches += gk[size_t(kvh) * n + i] != want[size_t(i)];
        EXPECT_EQ(mismatches, 0) << "sequence " << b << " KV head " << kvh << " of " << n << " keys";
        for (int32_t j = 0; j < blocks; ++j) {
          std::vector<int32_t> anchors, got;
          for (int32_t i = j * c.B; i < std::min(n, (j + 1) * c.B); ++i)
            if (want[size_t(i)]) anchors.push_back(i - j * c.B);
          const int32_t cnt = gc[size_t(kvh) * blocks + j];
          ASSERT_TRUE(cnt >= 1 && cnt <= c.B) << cnt;
          for (int32_t a = 0; a < cnt; ++a) got.push_back(go[(size_t(kvh) * blocks + j) * c.B + a]);
          EXPECT_EQ(got, anchors) << "block " << j;
        }
        for (uint8_t x : want) kept += x;
        total += n;
      }
    }
    // Both decisions occur, or the comparison checks little.
    EXPECT_GT(kept, total / 20);
    EXPECT_LT(kept, total * 19 / 20);
  }
}

// CUDA deltax == CPU deltax with the same selection.
TEST_F(DeltaXCuda, MatchesTheCpuPath) {
  struct Case {
    DLDataType dtype;
    int32_t d, B;
    std::string rows;
    double tau, exact_top, pack;
    std::vector<int32_t> kv, nw;
    int32_t hq, hkv;
    uint64_t seed;
  };
  const std::vector<Case> cases = {
      {sieve::kF32, 64, 128, "q_head", 0.85, 0.3, 0.83, {700, 300, 200, 64}, {700, 300, 77, 0}, 8, 2, 41},
      {sieve::kF32, 32, 32, "kv_head", 0.8, 0.2, 0.8, {333, 190, 45}, {333, 70, 45}, 8, 2, 42},
      {sieve::kF32, 128, 128, "q_head", 0.9, 0.1, 0.83, {1100}, {1100}, 4, 1, 43},
      {sieve::kBF16, 40, 32, "q_head", 0.85, 0.3, 0.8, {410, 150}, {410, 99}, 8, 2, 44},
      {sieve::kBF16, 64, 64, "kv_head", 1.0, 0.0, 0.83, {390, 250}, {390, 130}, 8, 4, 45},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << sieve::dtype_name(c.dtype) << " d " << c.d << " B " << c.B
                                      << " rows " << c.rows << " seed " << c.seed);
    DpxaScenario sc(c.kv, c.nw, 16, c.hq, c.hkv, c.d, c.seed, c.dtype, c.dtype);
    DeviceCall dc(sc);
    DpxaArgs a;
    a.mode = "deltax";
    a.block = c.B;
    a.tau = c.tau;
    a.rows = c.rows;
    a.exact_top = c.exact_top;
    a.pack_threshold = c.pack;
    Rows cpu_rows, gpu_rows;
    const auto want = run_cpu(sc, a, &cpu_rows);
    const auto got = run_cuda(dc, a, int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads, &gpu_rows);
    ASSERT_EQ(gpu_rows, cpu_rows) << "the comparison needs the CPU's selection";
    for (double x : want) ASSERT_TRUE(std::isfinite(x));
    // Both paths sum in f32 (the CUDA attend has no tensor cores), each within the arithmetic's
    // bound of the exact result (with the bf16 output's rounding where the output is bf16).
    const double rounding = 2 * tolerance::attention_bound(sc.w).element;
    EXPECT_LT(worst_rel(got, want), rounding);
    // Packed tiles must matter here: every tile exact gives a different output.
    a.exact_top = 1;
    Rows exact_rows;
    const auto exact = run_cpu(sc, a, &exact_rows);
    EXPECT_GT(worst_rel(exact, want), 10 * rounding) << "nothing packed: the case checks little";
  }
}

// Engine page layouts (ABI 1.1 strided views): the same K/V laid out HND, NHD and as combined
// pools gives bit-identical selections and outputs (both modes) on the device, on the
// tensor-core score kernel (bf16, d 64) and the exact one (f32).
TEST_F(DeltaXCuda, EngineLayoutsGiveBitIdenticalResults) {
  for (const char* mode : {"select", "deltax"})
    for (const DLDataType dtype : {sieve::kF32, sieve::kBF16}) {
      SCOPED_TRACE(std::string(mode) + " " + sieve::dtype_name(dtype));
      DpxaScenario sc({390, 250}, {390, 130}, 16, 8, 2, 64, 60 + dtype.bits, dtype, dtype);
      DpxaArgs a;
      a.mode = mode;
      a.block = 64;
      Rows want_rows;
      DeviceCall compact(sc);
      const auto want = run_cuda(compact, a, int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads, &want_rows);
      ASSERT_FALSE(want_rows.empty());
      for (const sieve::KvLayout layout : sieve::kKvLayouts) {
        SCOPED_TRACE(sieve::kv_layout_name(layout));
        sieve::reference::LaidOutPool pool(sc.w.k_pages.dl(), sc.w.v_pages.dl(), layout);
        DeviceCall dc(sc, &pool);
        Rows rows;
        const auto got = run_cuda(dc, a, int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads, &rows);
        EXPECT_EQ(rows, want_rows);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(double)), 0)
            << "output (deltax, or the core kernel in select mode) differs from the compact pool's";
      }
    }
}

// exact_top = 1: every kept tile exact, the core CUDA kernel's block-sparse result.
TEST_F(DeltaXCuda, ExactTopOneIsModeSelect) {
  for (const char* rows : {"q_head", "kv_head"}) {
    SCOPED_TRACE(rows);
    DpxaScenario sc({600, 260, 90}, {600, 131, 90}, 16, 8, 2, 64, 51);
    DeviceCall dc(sc);
    const int64_t max_rows = int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads;
    DpxaArgs a;
    a.block = 64;
    a.tau = 0.8;
    a.rows = rows;
    Rows rs, rd, rp;
    const auto select = run_cuda(dc, a, max_rows, &rs);
    a.mode = "deltax";
    a.exact_top = 1;
    const auto deltax = run_cuda(dc, a, max_rows, &rd);
    ASSERT_EQ(rs, rd) << "deltax keeps the tiles select keeps";
    int64_t kept = 0, candidates = 0;
    for (int32_t b = 0, r = 0; b < sc.w.batch; ++b)
      for (int32_t t = 0; t < sc.query_blocks(b, 64); ++t)
        for (int32_t h = 0; h < int32_t(rs.size() / size_t(sc.rows(64, 1))); ++h, ++r) {
          candidates += sieve::dpxa::row_span(sc.w.kv_len[size_t(b)], sc.w.n_new[size_t(b)], 64, t).n_candidates;
          kept += int64_t(rs[size_t(r)].size());
        }
    EXPECT_LT(kept, candidates) << "tau 0.8 must drop tiles, or this is dense attention";
    // Two f32 orders (deltax's CUDA attend, the core CUDA kernel's FMA path for f32), each
    // within the arithmetic's bound of the exact result.
    const double rounding = 2 * tolerance::attention_bound(sc.w).element;
    EXPECT_LT(worst_rel(deltax, select), rounding);
    a.exact_top = 0.1;
    const auto packed = run_cuda(dc, a, max_rows, &rp);
    EXPECT_EQ(rp, rs);
    EXPECT_GT(worst_rel(packed, select), 10 * rounding) << "packed tiles must change the output";
  }
}

}  // namespace
