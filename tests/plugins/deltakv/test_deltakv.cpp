// The deltakv plugin (CPU): stage 1-2 (keep masks, anchors, reach) against a plain f64
// recomputation; stage 3 through the plugin's attend hook against dense f64 attention over the
// expanded anchors (each safe anchor's key and value duplicated `count` times) on a ragged batch
// (whole prompts, a chunked prefill, a sequence without queries), for cos / l2, small chunks and
// query blocks, every ablation and packing, f32 and bf16; a threshold that keeps every key gives
// dense attention; kv_reduction reaches the host's metrics; bad input is refused with one line;
// the hook allocates nothing; chains through the layer runner; conformance.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "common/attention_tolerance.hpp"
#include "cpu/deltakv_cpu.hpp"
#include "deltakv_scenario.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/page_pool.hpp"
#include "sieve/runtime/conformance.hpp"
#include "sieve/runtime/host_services.hpp"
#include "support/chain_session.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
namespace tolerance = sieve::tolerance;
namespace dk = sieve::deltakv;
using ::testing::HasSubstr;

class DeltaKv : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = lib_.policy();
    ASSERT_NE(api_, nullptr);
  }
  void TearDown() override {
    for (sieve_policy* p : policies_) api_->destroy(p);
  }
  sieve_policy* create(const sieve_geometry& g, const DkvOpts& o) {
    DkvValues v(o);
    sieve_policy* p = create_or_fail(api_, host_.table(), g, v.v, DkvValues::kN);
    if (p) policies_.push_back(p);
    return p;
  }
  sieve_status attend(sieve_policy* p, DkvScenario& sc, uint32_t kind = SIEVE_SEL_ALL,
                      uint32_t phase = SIEVE_PHASE_PREFILL) {
    sieve_layer_call c = sc.call(phase);
    sieve_selection sel{};
    sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    sel.kind = kind;
    return api_->attend(p, &c, &sel, &sc.w.out.dl());
  }
  // Run the plugin on a poisoned output and compare every element with the expanded-anchor f64
  // attention of the plain packs.
  void check(const DkvOpts& o, DLDataType dtype = sieve::kF32, int32_t d = 16) {
    SCOPED_TRACE(::testing::Message()
                 << "threshold=" << o.threshold << " l2=" << o.l2 << " chunk=" << o.chunk
                 << " q_block=" << o.q_block << " cw=" << o.count_weighting << " phase2=" << o.phase2
                 << " packing=" << o.packing << " dtype=" << sieve::dtype_name(dtype) << " d=" << d);
    DkvScenario sc(dtype, d);
    sieve_policy* p = create(sc.geometry, o);
    ASSERT_NE(p, nullptr);
    sc.w.poison_outputs();
    const uint64_t allocs = host_.allocation_count();
    ASSERT_EQ(attend(p, sc), SIEVE_OK) << api_->last_error(p);
    EXPECT_EQ(host_.allocation_count(), allocs) << "the attend hook must not allocate";
    double err = 0;
    const std::string where = DkvScenario::worst(sc.output(), sc.expected(o, sc.plain_packs(o)), &err);
    EXPECT_LT(err, rounding(sc)) << where;
  }

  // The plugin's stage 3 is f32 softmax-weighted sums (count weights enter as a rounded
  // log(count) on the logit, inside the bound's shift term): the arithmetic's bound against the
  // f64 expanded-anchor attention (worst divides by 1 + |want| >= 1).
  static double rounding(const DkvScenario& sc) { return tolerance::attention_bound(sc.w).element; }

  PluginLibrary& lib_ = deltakv_library();
  const sieve_policy_api* api_ = nullptr;
  sieve::runtime::HostServices host_{sieve::kCpu};
  std::vector<sieve_policy*> policies_;
};

TEST_F(DeltaKv, DescriptorAndSchema) {
  const sieve_policy_descriptor& d = *api_->descriptor;
  EXPECT_STREQ(d.name, "deltakv");
  EXPECT_EQ(d.phases, uint32_t(SIEVE_PHASE_PREFILL)) << "decode uses the full cache, not this plugin";
  EXPECT_NE(api_->attend, nullptr);
  EXPECT_EQ(api_->select, nullptr);
  EXPECT_EQ(api_->correct, nullptr);
  ASSERT_EQ(api_->n_params, DkvValues::kN);
  const char* names[] = {"threshold", "metric", "chunk", "q_block", "count_weighting",
                         "phase2", "packing", "reduction", "seed", "report"};
  for (uint32_t i = 0; i < api_->n_params; ++i) EXPECT_STREQ(api_->params[i].name, names[i]);
}

// Stages 1-2 of the plugin's code against the plain walk, on keys in runs (decisions far from
// the threshold), for both metrics, ragged chunks, and the periodic packing.
TEST(DeltaKvStages, KeepMaskAndPackingMatchPlainRecomputation) {
  DkvScenario sc(sieve::kF32, 40);  // head_dim 40: lanes 0..7 hold two dims, the rest one
  std::vector<DkvOpts> cases(5);
  cases[1].l2 = true;
  cases[1].threshold = 1.0;
  cases[2].chunk = 7;
  cases[3].chunk = 64;
  cases[3].packing = 1;
  cases[3].reduction = 0.75;
  cases[4].packing = 1;
  cases[4].chunk = 33;
  for (const DkvOpts& o : cases) {
    const dk::KeepRule r = keep_rule(o);
    int64_t merged = 0;
    for (int32_t b = 0; b < sc.w.batch; ++b)
      for (int32_t kvh = 0; kvh < 2; ++kvh) {
        const int32_t n = sc.w.kv_len[size_t(b)];
        const std::vector<float> k = sc.keys_f32(b, kvh);
        std::vector<uint8_t> keep(size_t(n) + 1, 7);
        std::vector<int32_t> anchor(size_t(n) + 1, -5), reach(size_t(n) + 1, -5);
        dk::keep_mask(r, 3, kvh, k.data(), n, 40, keep.data());
        const int32_t m = dk::pack(keep.data(), n, anchor.data(), reach.data());
        const PlainPack want = sc.plain_pack(o, b, kvh);
        ASSERT_EQ(m, int32_t(want.anchor.size())) << "b=" << b << " kvh=" << kvh;
        for (int32_t i = 0; i < n; ++i) ASSERT_LE(keep[size_t(i)], 1);
        EXPECT_EQ(std::vector<int32_t>(anchor.begin(), anchor.begin() + m), want.anchor);
        EXPECT_EQ(std::vector<int32_t>(reach.begin(), reach.begin() + m), want.reach);
        EXPECT_EQ(keep[size_t(n)], 7) << "wrote past n";
        merged += n - m;
      }
    EXPECT_GT(merged, 0) << "the scenario must exercise merging";
  }
}

// Random packing: reproducible, first key of each chunk kept, kept fraction ≈ 1 - reduction.
TEST(DeltaKvStages, RandomPackingKeepsTheRequestedFraction) {
  DkvOpts o;
  o.packing = 2;
  o.reduction = 0.65;
  o.chunk = 100;
  o.seed = 11;
  const dk::KeepRule r = keep_rule(o);
  const int32_t n = 20000;
  std::vector<uint8_t> a(n), b(n), c(n);
  dk::keep_mask(r, 2, 1, nullptr, n, 8, a.data());
  dk::keep_mask(r, 2, 1, nullptr, n, 8, b.data());
  dk::keep_mask(r, 2, 0, nullptr, n, 8, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c) << "KV heads draw independently";
  int64_t kept = 0;
  for (int32_t i = 0; i < n; ++i) {
    kept += a[size_t(i)];
    if (i % 100 == 0) {
      EXPECT_EQ(a[size_t(i)], 1);
    }
  }
  // Every 100th key, plus each other key kept with probability 0.35 + 0.65 x 0.01 by a hash:
  // binomial, so within 4.5 standard deviations (a 1e-5 chance for a fair hash).
  const double p = 0.35 + 0.65 * 0.01;
  EXPECT_NEAR(double(kept) / n, p, 4.5 * std::sqrt(p * (1 - p) / n));
}

TEST_F(DeltaKv, CountWeightingEqualsDenseAttentionOverExpandedAnchors) {
  check(DkvOpts{});
  DkvOpts small;
  small.chunk = 16;
  small.q_block = 8;
  check(small);
  DkvOpts l2;
  l2.l2 = true;
  l2.threshold = 1.0;
  l2.q_block = 16;
  check(l2);
  DkvOpts qb1;
  qb1.q_block = 1;  // every query is its own block: the longest compressed history
  qb1.chunk = 40;
  check(qb1);
}

TEST_F(DeltaKv, Ablations) {
  DkvOpts o;
  o.chunk = 32;
  o.q_block = 16;
  o.count_weighting = false;
  check(o);
  o.count_weighting = true;
  o.phase2 = 1;  // off
  check(o);
  o.phase2 = 2;  // only
  check(o);
  o.phase2 = 0;
  o.packing = 1;  // periodic, keep 1/2
  check(o);
  o.reduction = 0.75;  // periodic, keep 1/4
  check(o);
}

TEST_F(DeltaKv, RandomPackingThroughTheHook) {
  DkvOpts o;
  o.packing = 2;
  o.reduction = 0.6;
  o.q_block = 16;
  DkvScenario sc;
  sieve_policy* p = create(sc.geometry, o);
  ASSERT_NE(p, nullptr);
  sc.w.poison_outputs();
  ASSERT_EQ(attend(p, sc), SIEVE_OK) << api_->last_error(p);
  // The packs come from the plugin's own hash (the plain walk cannot redraw it): rebuild them
  // with the stage functions, then the expanded-anchor oracle must still hold.
  std::vector<std::vector<PlainPack>> packs(size_t(sc.w.batch));
  for (int32_t b = 0; b < sc.w.batch; ++b)
    for (int32_t kvh = 0; kvh < 2; ++kvh) {
      const int32_t n = sc.w.kv_len[size_t(b)];
      std::vector<uint8_t> keep(static_cast<size_t>(n));
      PlainPack pk;
      pk.anchor.resize(size_t(n));
      pk.reach.resize(size_t(n));
      dk::keep_mask(keep_rule(o), 0, kvh, nullptr, n, 16, keep.data());
      const int32_t m = dk::pack(keep.data(), n, pk.anchor.data(), pk.reach.data());
      pk.anchor.resize(size_t(m));
      pk.reach.resize(size_t(m));
      packs[size_t(b)].push_back(pk);
    }
  double err = 0;
  const std::string where = DkvScenario::worst(sc.output(), sc.expected(o, packs), &err);
  EXPECT_LT(err, rounding(sc)) << where;
}

TEST_F(DeltaKv, Bf16) {
  DkvOpts o;
  o.q_block = 16;
  check(o, sieve::kBF16);  // the bound adds the bf16 output's rounding
}

// Engine page layouts (ABI 1.1 strided views): the same K/V laid out HND, NHD and as combined
// pools (V at a byte_offset) gives bit-identical outputs (NaN-poisoned before each call), f32 and
// bf16, count weighting on and off.
TEST_F(DeltaKv, EngineLayoutsGiveBitIdenticalOutputs) {
  for (const DLDataType dtype : {sieve::kF32, sieve::kBF16})
    for (const bool cw : {true, false}) {
      SCOPED_TRACE(::testing::Message() << sieve::dtype_name(dtype) << " count_weighting " << cw);
      DkvOpts o;
      o.q_block = 16;
      o.count_weighting = cw;
      DkvScenario sc(dtype, 16, {300, 77, 200, 9, 131}, {300, 77, 150, 0, 131}, 11 + dtype.bits);
      sieve_policy* p = create(sc.geometry, o);
      ASSERT_NE(p, nullptr);
      auto once = [&] {
        sc.w.poison_outputs();
        EXPECT_EQ(attend(p, sc), SIEVE_OK) << api_->last_error(p);
        return std::vector<unsigned char>(sc.w.out.data<unsigned char>(),
                                          sc.w.out.data<unsigned char>() + sc.w.out.nbytes());
      };
      const std::vector<unsigned char> want = once();
      const sieve_paged_kv compact = sc.w.kv;
      for (const sieve::KvLayout layout : sieve::kKvLayouts) {
        SCOPED_TRACE(sieve::kv_layout_name(layout));
        sieve::reference::LaidOutPool pool(sc.w.k_pages.dl(), sc.w.v_pages.dl(), layout);
        pool.install(sc.w.kv);
        EXPECT_TRUE(once() == want) << "output differs from the compact pool's";
        sc.w.kv = compact;
      }
    }
}

// A threshold no cosine reaches keeps every key: count 1 everywhere, phase 1 + phase 2 = every
// causal key exactly: the dense f64 reference.
TEST_F(DeltaKv, KeepEverythingIsDense) {
  DkvOpts o;
  o.threshold = 2.0;
  o.q_block = 16;
  DkvScenario sc;
  sieve_policy* p = create(sc.geometry, o);
  ASSERT_NE(p, nullptr);
  sc.w.poison_outputs();
  ASSERT_EQ(attend(p, sc), SIEVE_OK) << api_->last_error(p);
  const std::vector<double> dense = sieve::reference::attend_reference(sc.w.args).out;
  double err = 0;
  const std::string where = DkvScenario::worst(sc.output(), dense, &err);
  EXPECT_LT(err, rounding(sc)) << where;
}

TEST_F(DeltaKv, ReportsKvReductionPerHeadAndLayer) {
  DkvOpts o;
  DkvScenario sc;
  sieve_policy* p = create(sc.geometry, o);
  ASSERT_NE(p, nullptr);
  host_.clear_metrics();
  ASSERT_EQ(attend(p, sc), SIEVE_OK) << api_->last_error(p);
  const auto packs = sc.plain_packs(o);
  int64_t n = 0, m_all = 0;
  for (int32_t b = 0; b < sc.w.batch; ++b) n += sc.w.kv_len[size_t(b)];
  double lo = 1, hi = 0;
  for (int32_t kvh = 0; kvh < 2; ++kvh) {
    int64_t m = 0;
    for (int32_t b = 0; b < sc.w.batch; ++b) m += int64_t(packs[size_t(b)][size_t(kvh)].anchor.size());
    m_all += m;
    lo = std::min(lo, 1.0 - double(m) / double(n));
    hi = std::max(hi, 1.0 - double(m) / double(n));
  }
  const double layer = 1.0 - double(m_all) / double(2 * n);
  bool found = false;
  for (const auto& [name, s] : host_.metrics()) {
    if (name != "kv_reduction") continue;
    found = true;
    EXPECT_EQ(s.count, 3u) << "two KV heads + the layer";
    // 1 - m / n in f64 (two roundings each), and the sum of the three.
    const double f64 = tolerance::kSafety * tolerance::gamma(4, tolerance::kF64);
    EXPECT_NEAR(s.min, lo, f64);
    EXPECT_NEAR(s.max, hi, f64);
    EXPECT_NEAR(s.sum, lo + hi + layer, 3 * f64);
  }
  EXPECT_TRUE(found);
  EXPECT_GT(layer, 0.3) << "the runs of the scenario merge";
}

TEST_F(DeltaKv, RefusesBadInputWithOneLine) {
  DkvScenario sc;
  sieve_policy* p = create(sc.geometry, DkvOpts{});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(attend(p, sc, SIEVE_SEL_ALL, SIEVE_PHASE_DECODE), SIEVE_ERR_UNSUPPORTED);
  EXPECT_THAT(api_->last_error(p), HasSubstr("prefill only"));
  EXPECT_EQ(attend(p, sc, SIEVE_SEL_BLOCKS), SIEVE_ERR_UNSUPPORTED);
  EXPECT_THAT(api_->last_error(p), HasSubstr("block selection"));
  sc.w.kv_len[1] += 1;
  EXPECT_EQ(attend(p, sc), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("kv_len_host[1]"));
  sc.w.kv_len[1] -= 1;
  sieve_layer_call c = sc.call();
  sieve_selection sel{};
  sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
  int64_t bad_shape[3] = {3, 4, 16};
  DLTensor bad = sieve::make_view(sc.w.out.dl().data, sieve::kCpu, sieve::kF32, 3, bad_shape);
  EXPECT_EQ(api_->attend(p, &c, &sel, &bad), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("out: dim 0"));
}

// Through the layer runner (the path `sieve attn` / `sieve eval` take).
TEST(DeltaKvChains, ThroughTheLayerRunner) {
  using sieve::runtime::SyntheticReport;
  const sieve::runtime::Registry reg = registry_with();
  const sieve::runtime::SyntheticSpec s = small_session(SIEVE_PHASE_PREFILL, 32, {600, 333}, 600);
  auto run = [&](const std::string& text) { return run_chain(s, text, reg); };
  const SyntheticReport all = run("prefill:*=deltakv(threshold=2)");
  EXPECT_LT(all.rel_err, 1e-5);
  const SyntheticReport periodic = run("prefill:*=deltakv(packing=periodic,reduction=0.5,q_block=16)");
  EXPECT_GT(periodic.rel_err, 1e-4) << "half the history merged must change the output";
  EXPECT_LT(periodic.rel_err, 1.0);
  EXPECT_EQ(periodic.hook_allocations, 0u);
  EXPECT_EQ(periodic.non_finite, 0);
  bool reported = false;
  for (const auto& [name, m] : periodic.metrics)
    if (name == "kv_reduction") {
      reported = true;
      EXPECT_NEAR(m.mean(), 0.5, 0.01);
    }
  EXPECT_TRUE(reported);
}

TEST(DeltaKvConform, ConformancePasses) {
  sieve::runtime::ConformOptions o;
  o.isolate = false;
  const auto r = sieve::runtime::conform(std::string(SIEVE_PLUGIN_DIR) + "/libsieve_deltakv.so", o);
  for (const auto& c : r.checks) EXPECT_TRUE(c.passed || c.skipped) << c.name << ": " << c.detail;
  EXPECT_TRUE(r.passed());
}

}  // namespace
