// The delta_correction plugin's CUDA path (cuda/delta_apply.cu + the core kernel's q_rows call on
// the host's stream) against its CPU path and the f64 rule, on the same ragged scenario with a
// sparse O* (f32 and bf16, every mode, interpolation, gamma = 1); then the streaming > Δ chain
// through the layer runner on the GPU. Skips without a CUDA device.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../../cuda/cuda_test_util.hpp"
#include "delta_scenario.hpp"
#include "support/chain_session.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
using sieve::cuda_test::DeviceTensor;

constexpr DLDevice kCuda0{kDLCUDA, 0};

class DeltaCorrectionCuda : public sieve::cuda_test::CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    api_ = lib_.policy();
    ASSERT_NE(api_, nullptr);
    ASSERT_TRUE(api_->descriptor->devices & SIEVE_DEVICE_CUDA);
  }
  sieve_policy* create(sieve::runtime::HostServices& host, const sieve_geometry& g, const DeltaRule& r) {
    DeltaValues v(r);
    return create_or_fail(api_, host.table(), g, v.v, DeltaValues::kCount);
  }

  // CPU and CUDA corrections of the same O*, compared with each other and with the f64 rule.
  void check(const DeltaRule& r, DLDataType dtype) {
    // head_dim 8 (the CUDA kernels are built for 8, 64 and 128): the FMA kernels.
    DeltaScenario sc(dtype, {300, 77, 200, 9, 131}, {300, 77, 150, 0, 131}, 7, 8, 4, 2);
    check(r, sc);
  }
  void check(const DeltaRule& r, DeltaScenario& sc) {
    SCOPED_TRACE(::testing::Message() << "gamma=" << r.gamma << " tail=" << r.tail << " recompute="
                                      << r.recompute << " interpolate=" << r.interpolate << " anchor_kernel="
                                      << (r.row_kernel ? "rows" : "tiled") << " dtype="
                                      << sieve::dtype_name(sc.w.spec.kv_dtype) << " d=" << sc.w.spec.head_dim);
    sieve::runtime::HostServices cpu(sieve::kCpu), gpu(kCuda0);
    sc.sparse_first_stage(cpu);  // (re)writes O* into w.out
    auto& w = sc.w;
    DeviceTensor q(w.q), out(w.out), qo(w.qo_indptr), kp(w.k_pages), vp(w.v_pages), ki(w.kv_indptr),
        kx(w.kv_indices), kl(w.kv_last_page_len);
    sieve_paged_kv view = w.kv;
    view.k_pages = kp.dl;
    view.v_pages = vp.dl;
    view.indptr = ki.dl;
    view.indices = kx.dl;
    view.last_page_len = kl.dl;
    view.k_pre_rope_pages.device = kCuda0;
    sieve_geometry g = sc.geometry;
    g.device = kCuda0;

    sieve_policy* pg = create(gpu, g, r);
    ASSERT_NE(pg, nullptr);
    sieve_layer_call c = sc.call();
    c.q = &q.dl;
    c.qo_indptr = &qo.dl;
    c.kv_view = &view;
    c.geometry = &g;
    sieve_selection sel{};
    sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    const uint64_t allocs = gpu.allocation_count();
    ASSERT_EQ(api_->correct(pg, &c, &sel, &out.dl), SIEVE_OK) << api_->last_error(pg);
    EXPECT_EQ(gpu.allocation_count(), allocs) << "the correct hook must not allocate";
    std::string err;
    ASSERT_TRUE(gpu.synchronize(&err)) << err;
    sieve::HostTensor got(w.out);
    out.download(got);
    api_->destroy(pg);

    sieve_policy* pc = create(cpu, sc.geometry, r);
    ASSERT_NE(pc, nullptr);
    sieve_layer_call cc = sc.call();
    ASSERT_EQ(api_->correct(pc, &cc, &sel, &w.out.dl()), SIEVE_OK) << api_->last_error(pc);
    api_->destroy(pc);

    std::vector<double> gpu_out(size_t(got.numel()));
    for (int64_t i = 0; i < got.numel(); ++i) gpu_out[size_t(i)] = got.get(i);
    double e_cpu = 0, e_rule = 0;
    const std::string w1 = DeltaScenario::worst(gpu_out, sc.output(), &e_cpu);
    EXPECT_LT(e_cpu, 2 * sc.rule_bound()) << "CUDA vs CPU, " << w1;  // each within it of the rule
    const std::string w2 = DeltaScenario::worst(gpu_out, sc.expected(r), &e_rule);
    EXPECT_LT(e_rule, sc.rule_bound()) << "CUDA vs the f64 rule, " << w2;
  }

  PluginLibrary lib_{"delta_correction"};
  const sieve_policy_api* api_ = nullptr;
};

// Both anchor kernels: `tiled` (far keys through the tiled prefill kernel, near keys through the
// row kernel, merged by lse; the tail as a compacted prefill) and `rows` (the row kernel over
// every key). f32 and d = 16 take the FMA kernels.
TEST_F(DeltaCorrectionCuda, MatchesTheCpuPathAndTheRule) {
  for (bool rows : {false, true}) {
    for (DeltaRule r : {DeltaRule{8, 16}, DeltaRule{5, 3, false, true}, DeltaRule{8, 16, true, false},
                        DeltaRule{1, 0}, DeltaRule{64, 128}, DeltaRule{3, 7}}) {
      r.row_kernel = rows;
      check(r, sieve::kF32);
    }
    check({8, 16, false, false, rows}, sieve::kBF16);
    check({5, 3, false, true, rows}, sieve::kBF16);
  }
}

// bf16 q and K/V with head_dim 64 and 128: the tensor-core kernels (prefill for the far keys and
// the tail, row kernel for the near keys); several anchor blocks per sequence, a chunked prefill.
TEST_F(DeltaCorrectionCuda, TensorCorePathsMatchTheRule) {
  for (int32_t d : {64, 128}) {
    DeltaScenario sc(sieve::kBF16, {1500, 700, 64}, {1500, 500, 64}, 11, d, 8, 2);
    for (bool rows : {false, true}) {
      check({16, 32, false, false, rows}, sc);
      check({7, 5, false, true, rows}, sc);
    }
  }
}

TEST_F(DeltaCorrectionCuda, StreamingThenDeltaThroughTheRunner) {
  using sieve::runtime::SyntheticReport;
  const sieve::runtime::Registry reg = registry_with();
  sieve::runtime::SyntheticSpec s = small_session(SIEVE_PHASE_PREFILL, 64, {2000, 777}, 2000);
  s.kv_dtype = sieve::kBF16;
  s.device = kCuda0;
  auto run = [&](const std::string& text) { return run_chain(s, text, reg); };
  // Random keys here (see the CPU test): the chain must run, change the output, and reduce to
  // dense at gamma = 1 and after `dense`; bf16 outputs, so the row and tiled kernels round apart.
  const SyntheticReport stream = run("prefill:*=streaming(sink=4,window=64)");
  const SyntheticReport delta = run("prefill:*=streaming(sink=4,window=64)>delta_correction(gamma=16,tail=32)");
  const SyntheticReport gamma1 = run("prefill:*=streaming(sink=4,window=64)>delta_correction(gamma=1,tail=0)");
  const SyntheticReport after_dense = run("prefill:*=dense>delta_correction(gamma=16,tail=32)");
  EXPECT_GT(stream.rel_err, 1e-1);
  EXPECT_NE(delta.rel_err, stream.rel_err);
  EXPECT_LT(gamma1.rel_err, 1e-2);
  EXPECT_LT(after_dense.rel_err, 1e-2);
  EXPECT_EQ(delta.hook_allocations, 0u);
  EXPECT_EQ(delta.non_finite, 0);
}

}  // namespace
