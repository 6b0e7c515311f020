// dpxa mode=deltax (DeltaXAttention, paper 001 §4.2) on the CPU, through the plugin's select and
// attend hooks with the runtime's real host services (mode=select uses select alone, and the core
// kernel computes its tiles, as a host does): exact_top = 1 is the block-sparse result; the output equals a plain f64 recomputation
// (keys of packed tiles expanded `count` times, one dense softmax per row) on ragged GQA inputs
// into a NaN-poisoned buffer; rows with only the sink and diagonal tiles are exact however hard
// the packing; each mode declares the hooks it uses (instance_hooks); bad parameters are refused (CUDA:
// test_deltax_cuda.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "common/attention_tolerance.hpp"
#include "math/dpxa_tiles.hpp"
#include "dpxa_scenario.hpp"
#include "sieve/packing/pack_cpu.hpp"
#include "sieve/reference/page_pool.hpp"
#include "sieve/runtime/conformance.hpp"
#include "sieve/runtime/host_services.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
namespace tolerance = sieve::tolerance;
using ::testing::HasSubstr;
using Rows = std::vector<std::vector<int32_t>>;

class DeltaX : public DpxaTest<sieve::runtime::HostServices> {
 protected:
  DeltaX() : DpxaTest(sieve::kCpu) {}
  // One layer call as a host makes it, into a NaN-poisoned output: select, then the instance's
  // attend when its hooks name it (mode=deltax), else the core kernel on its selection
  // (mode=select). The rows selected to *rows.
  std::vector<double> run(DpxaScenario& sc, const DpxaArgs& a, Rows* rows = nullptr) {
    sieve_policy* p = create(sc.g, a);
    if (!p) return {};
    HostSelection sel(int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads, 100000);
    uint32_t stats = 0;
    EXPECT_EQ(api_->select(p, &sc.call, sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
    sc.w.poison_outputs();
    EXPECT_EQ(attend_as_host(api_, p, sc.call, sel.get(), &sc.w.out.dl(), host_.table()), SIEVE_OK)
        << api_->last_error(p);
    if (rows) *rows = sel.rows();
    return workload_output(sc.w);
  }
  double metric_mean(const std::string& name) const {
    for (const auto& [n, m] : host_.metrics())
      if (n == name) return m.mean();
    return -1;
  }

};

// ---- The plain f64 recomputation --------------------------------------------------------------
// One output row: kept key blocks `kept` of the row; `exact[i]` for kept[i]; a packed block
// contributes each of its anchors `count` times (the anchor's key and value repeated), an exact
// block its keys <= pos; dense f64 softmax over that list.
std::vector<double> plain_row(const std::vector<double>& q, const std::vector<std::vector<double>>& k,
                              const std::vector<std::vector<double>>& v, const std::vector<uint8_t>& keep,
                              int32_t B, const std::vector<int32_t>& kept,
                              const std::vector<bool>& exact, int64_t pos) {
  std::vector<int32_t> keys;  // expanded list of key positions
  const int32_t n = int32_t(k.size());
  for (size_t i = 0; i < kept.size(); ++i) {
    const int32_t j0 = kept[i] * B, j1 = std::min(n, j0 + B);
    if (exact[i]) {
      for (int32_t p = j0; p < j1 && p <= pos; ++p) keys.push_back(p);
      continue;
    }
    for (int32_t p = j0; p < j1;) {  // a run: an anchor and the keys up to the next anchor
      EXPECT_TRUE(keep[size_t(p)]) << "a run starts at an anchor";
      int32_t e = p + 1;
      while (e < j1 && !keep[size_t(e)]) ++e;
      for (int32_t c = p; c < e; ++c) keys.push_back(p);
      p = e;
    }
  }
  const double scale = 1.0 / std::sqrt(double(q.size()));
  std::vector<double> logit(keys.size()), out(q.size(), 0.0);
  double mx = -INFINITY, z = 0;
  for (size_t i = 0; i < keys.size(); ++i) mx = std::max(mx, logit[i] = dot64(q, k[size_t(keys[i])]) * scale);
  for (size_t i = 0; i < keys.size(); ++i) {
    const double w = std::exp(logit[i] - mx);
    z += w;
    for (size_t x = 0; x < out.size(); ++x) out[x] += w * v[size_t(keys[i])][x];
  }
  for (double& o : out) o /= z;
  return out;
}

std::vector<std::vector<double>> values(const DpxaScenario& sc, int32_t b, int32_t kvh) {
  const int32_t n = sc.w.kv_len[size_t(b)], ps = sc.g.page_size, d = sc.g.head_dim;
  const int32_t* pages = sc.w.kv_indices.data<int32_t>() + sc.w.kv_indptr.data<int32_t>()[b];
  std::vector<std::vector<double>> out(static_cast<size_t>(n), std::vector<double>(static_cast<size_t>(d)));
  for (int32_t p = 0; p < n; ++p)
    for (int32_t x = 0; x < d; ++x)
      out[size_t(p)][size_t(x)] =
          sc.w.v_pages.get(((int64_t(pages[p / ps]) * sc.g.n_kv_heads + kvh) * ps + p % ps) * d + x);
  return out;
}

// The whole deltax output from the rows the plugin selected, recomputed plainly. The exact
// off-diagonal tiles are ranked by the estimator's f64 shares (plain_shares); a row whose cut
// falls between two shares closer than the plugin's f32 rounding of them could rank differently
// and is left out (counted in *ambiguous, its output NaN); share_error bounds that rounding.
std::vector<double> plain_deltax(const DpxaScenario& sc, const DpxaArgs& a, const Rows& rows,
                                 int32_t* ambiguous) {
  const double rounding = share_error(sc, a);
  const int32_t B = int32_t(a.block), hq = sc.g.n_q_heads, hkv = sc.g.n_kv_heads, d = sc.g.head_dim;
  const int32_t group = hq / hkv, H = a.rows == "kv_head" ? hkv : hq;
  std::vector<double> out(size_t(sc.w.out.numel()), NAN);
  *ambiguous = 0;
  int32_t row0 = 0;
  for (int32_t b = 0; b < sc.w.batch; ++b) {
    const int32_t n = sc.w.kv_len[size_t(b)], n_new = sc.w.n_new[size_t(b)];
    const int32_t q0 = sc.w.qo_indptr.data<int32_t>()[b];
    for (int32_t kvh = 0; kvh < hkv; ++kvh) {
      const auto k = sc.keys(b, kvh), v = values(sc, b, kvh);
      std::vector<float> kf;
      for (const auto& r : k) kf.insert(kf.end(), r.begin(), r.end());
      std::vector<uint8_t> keep(static_cast<size_t>(n));
      const sieve::packing::KeepRule rule{sieve::packing::kDelta, sieve::packing::kCos,
                                          float(a.pack_threshold), 1.0, 0, B};
      sieve::packing::keep_mask(rule, 0, kvh, kf.data(), n, d, keep.data());
      for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        const auto q = sc.queries(b, h);
        for (int32_t t = 0; t * B < n_new; ++t) {
          const auto& kept = rows[size_t((row0 + t) * H + (H == hq ? h : kvh))];
          const int64_t first = int64_t(n - n_new) + int64_t(t) * B;
          const auto share = plain_shares(a.estimator, q, k, B, t, a.estimator == "xattn" ? 8 : 4,
                                          a.threshold);
          std::vector<bool> exact(kept.size());
          std::vector<size_t> other;
          for (size_t i = 0; i < kept.size(); ++i) {
            exact[i] = kept[i] == 0 || int64_t(kept[i]) * B + B > first;  // sink or diagonal
            if (!exact[i]) other.push_back(i);
          }
          std::stable_sort(other.begin(), other.end(),
                           [&](size_t x, size_t y) { return share[size_t(kept[x])] > share[size_t(kept[y])]; });
          const size_t top = size_t(std::ceil(a.exact_top * double(other.size()) - 1e-6));
          for (size_t r = 0; r < top; ++r) exact[other[r]] = true;
          if (top > 0 && top < other.size() &&
              share[size_t(kept[other[top - 1]])] - share[size_t(kept[other[top]])] <
                  2 * rounding * share[size_t(kept[other[top - 1]])]) {
            ++*ambiguous;
            continue;
          }
          for (int32_t i = 0; i < B && t * B + i < n_new; ++i) {
            const auto o = plain_row(q[size_t(t * B + i)], k, v, keep, B, kept, exact, first + i);
            for (int32_t x = 0; x < d; ++x)
              out[(size_t(q0 + t * B + i) * hq + size_t(h)) * d + size_t(x)] = o[size_t(x)];
          }
        }
      }
    }
    row0 += (n_new + B - 1) / B;
  }
  return out;
}

// ---- Tests ------------------------------------------------------------------------------------

// (1) Every kept tile exact: the block-sparse result of the same selection (mode=select, i.e. the
// core kernel), to f32 rounding; the default exact_top does pack tiles and differs by far more.
TEST_F(DeltaX, ExactTopOneIsTheBlockSparseResult) {
  DpxaScenario sc({301, 230}, {301, 101}, 16, 8, 2, 32, 21);
  DpxaArgs a;
  a.tau = 0.8;
  Rows rs, rd;
  const auto select = run(sc, a, &rs);
  a.mode = "deltax";
  a.exact_top = 1;
  const auto deltax = run(sc, a, &rd);
  ASSERT_EQ(rs, rd) << "deltax keeps the tiles select keeps";
  int64_t dropped = 0, candidates = 0;
  for (int32_t b = 0, row = 0; b < sc.w.batch; ++b)
    for (int32_t t = 0; t < sc.query_blocks(b, 32); ++t)
      for (int32_t h = 0; h < sc.g.n_q_heads; ++h, ++row) {
        const int32_t nc = sieve::dpxa::row_span(sc.w.kv_len[b], sc.w.n_new[b], 32, t).n_candidates;
        candidates += nc;
        dropped += nc - int32_t(rd[size_t(row)].size());
      }
  EXPECT_GT(dropped, 0) << "tau 0.8 must drop tiles, or this is dense attention";
  // Two f32 orders of the same softmax-weighted sums (deltax: two passes in key order; the core
  // kernel: 64-key tiles, online softmax, OpenBLAS's kernel for this CPU): each is within the
  // arithmetic's bound of the exact result, so within twice it of the other (worst_rel divides
  // by 1 + |want| >= 1).
  const double rounding = 2 * tolerance::attention_bound(sc.w).element;
  EXPECT_LT(worst_rel(deltax, select), rounding);
  EXPECT_EQ(metric_mean("deltax_kv_reduction"), 0.0) << "nothing packed at exact_top = 1";
  a.exact_top = 0.1;
  const auto packed = run(sc, a);
  EXPECT_GT(worst_rel(packed, select), 10 * rounding) << "packed tiles must change the output";
  EXPECT_GT(metric_mean("deltax_packed"), 0.0);
  (void)candidates;
}

// (2) Against the plain f64 recomputation on fresh ragged inputs (lengths not multiples of the
// block or of 128, a chunked prefill, GQA 4 and 2), every output written over NaN.
TEST_F(DeltaX, MatchesPlainF64Recomputation) {
  struct Case {
    std::vector<int32_t> kv, nw;
    int32_t hq, hkv, d;
    uint64_t seed;
    std::string rows;
    double exact_top, pack;
  };
  const std::vector<Case> cases = {
      {{333, 190, 45}, {333, 70, 45}, 8, 2, 64, 101, "q_head", 0.1, 0.83},
      {{410}, {410}, 4, 2, 32, 202, "q_head", 0.3, 0.75},
      {{275, 140}, {200, 140}, 8, 2, 32, 303, "kv_head", 0.1, 0.9},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "seed " << c.seed << " rows " << c.rows);
    DpxaScenario sc(c.kv, c.nw, 16, c.hq, c.hkv, c.d, c.seed);
    DpxaArgs a;
    a.mode = "deltax";
    a.tau = 0.85;
    a.rows = c.rows;
    a.exact_top = c.exact_top;
    a.pack_threshold = c.pack;
    host_.clear_metrics();
    Rows rows;
    const auto got = run(sc, a, &rows);
    for (double x : got) ASSERT_TRUE(std::isfinite(x)) << "an output left unwritten (NaN)";
    int32_t ambiguous = 0;
    const auto want = plain_deltax(sc, a, rows, &ambiguous);
    double worst = 0;
    int64_t compared = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::isnan(want[i])) continue;
      ++compared;
      worst = std::max(worst, std::abs(got[i] - want[i]) / (1 + std::abs(want[i])));
    }
    // One f32 computation against f64: the arithmetic's bound (the count-weighted logits add a
    // rounded log(count) <= log(block), inside the bound's shift term and kSafety).
    EXPECT_LT(worst, tolerance::attention_bound(sc.w).element);
    EXPECT_GT(compared, int64_t(want.size() * 9 / 10)) << ambiguous << " ambiguous rows";
    const double red = metric_mean("deltax_kv_reduction");
    EXPECT_GT(red, 0.02) << "the packing must merge keys here";
    EXPECT_LT(red, 1.0);
  }
}

// (3) Sink and diagonal tiles are never packed: with tau 0 a row keeps only those, so even a
// packing that merges almost everything (pack_threshold -0.99, exact_top 0) leaves the result
// equal to the block-sparse one; with tau 1 the same packing changes it (the check can fail).
TEST_F(DeltaX, SinkAndDiagonalAreExact) {
  DpxaScenario sc({290, 160}, {290, 60}, 16, 4, 2, 32, 9);
  DpxaArgs a;
  a.tau = 0;
  const auto select = run(sc, a);
  a.mode = "deltax";
  a.exact_top = 0;
  a.pack_threshold = -0.99;
  const auto deltax = run(sc, a);
  const double rounding = 2 * tolerance::attention_bound(sc.w).element;  // as in (1)
  EXPECT_LT(worst_rel(deltax, select), rounding);
  EXPECT_EQ(metric_mean("deltax_packed"), 0.0);
  a.tau = 1;
  const auto dense_packed = run(sc, a);
  a.mode = "select";
  EXPECT_GT(worst_rel(dense_packed, run(sc, a)), 10 * rounding);
}

// Each mode declares its hooks (ABI 1.1 instance_hooks): mode=select only selects, so the host
// runs the core kernel on its tiles and chains count it as no attender; mode=deltax also attends.
// The table keeps attend for deltax, and attend on a mode=select instance is refused.
TEST_F(DeltaX, EachModeDeclaresTheHooksItUses) {
  DpxaScenario sc({100}, {100}, 16);
  DpxaArgs a;
  sieve_policy* select = create(sc.g, a);
  ASSERT_NE(select, nullptr);
  ASSERT_NE(api_->instance_hooks, nullptr);
  EXPECT_EQ(api_->instance_hooks(select), uint32_t(SIEVE_HOOK_SELECT));
  a.mode = "deltax";
  sieve_policy* deltax = create(sc.g, a);
  ASSERT_NE(deltax, nullptr);
  EXPECT_EQ(api_->instance_hooks(deltax), uint32_t(SIEVE_HOOK_SELECT | SIEVE_HOOK_ATTEND));
  EXPECT_NE(api_->attend, nullptr);
  HostSelection sel(int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads, 100000);
  uint32_t stats = 0;
  ASSERT_EQ(api_->select(select, &sc.call, sel.get(), &stats), SIEVE_OK) << api_->last_error(select);
  EXPECT_EQ(api_->attend(select, &sc.call, sel.get(), &sc.w.out.dl()), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(select), HasSubstr("mode=select"));
}

// (4) Bad parameters (also on CUDA), and an attend that has no select of its layer.
// Engine page layouts (ABI 1.1 strided views): the same K/V laid out HND, NHD and as combined
// pools (V at a byte_offset) gives bit-identical selections in both modes and bit-identical
// deltax outputs (NaN-poisoned before each call) to the compact pool.
TEST_F(DeltaX, EngineLayoutsGiveBitIdenticalResults) {
  for (const char* mode : {"select", "deltax"})
    for (const DLDataType dtype : {sieve::kF32, sieve::kBF16}) {
      SCOPED_TRACE(std::string(mode) + " " + sieve::dtype_name(dtype));
      DpxaScenario sc({290, 161}, {290, 70}, 16, 4, 2, 32, 40 + dtype.bits, dtype);
      DpxaArgs a;
      a.mode = mode;
      auto once = [&](Rows* rows) {
        std::vector<unsigned char> out;
        sieve_policy* p = create(sc.g, a);
        if (!p) return out;
        HostSelection sel(int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads, 100000);
        uint32_t stats = 0;
        EXPECT_EQ(api_->select(p, &sc.call, sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
        *rows = sel.rows();
        if (a.mode == "deltax") {
          sc.w.poison_outputs();
          EXPECT_EQ(api_->attend(p, &sc.call, sel.get(), &sc.w.out.dl()), SIEVE_OK) << api_->last_error(p);
          out.assign(sc.w.out.data<unsigned char>(), sc.w.out.data<unsigned char>() + sc.w.out.nbytes());
        }
        return out;
      };
      Rows want_rows;
      const std::vector<unsigned char> want = once(&want_rows);
      ASSERT_FALSE(want_rows.empty());
      const sieve_paged_kv compact = sc.w.kv;
      for (const sieve::KvLayout layout : sieve::kKvLayouts) {
        SCOPED_TRACE(sieve::kv_layout_name(layout));
        sieve::reference::LaidOutPool pool(sc.w.k_pages.dl(), sc.w.v_pages.dl(), layout);
        pool.install(sc.w.kv);
        Rows rows;
        const std::vector<unsigned char> got = once(&rows);
        EXPECT_EQ(rows, want_rows);
        EXPECT_TRUE(got == want) << "deltax output differs from the compact pool's";
        sc.w.kv = compact;
      }
    }
  // Strides no layout has are refused with one line naming them.
  DpxaScenario sc({100}, {100}, 16);
  int64_t overlapping[4] = {2 * 16 * 32, 16 * 32, 16, 1};  // token stride 16 < head_dim 32
  sc.w.kv.k_pages.strides = overlapping;
  sieve_policy* p = create(sc.g, DpxaArgs{});
  ASSERT_NE(p, nullptr);
  HostSelection sel(int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads, 100000);
  uint32_t stats = 0;
  EXPECT_EQ(api_->select(p, &sc.call, sel.get(), &stats), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(api_->last_error(p)), ::testing::StartsWith("select: k_pages: strides [1024, 512, 16, 1] overlap"));
}

TEST_F(DeltaX, BadParametersAreRefused) {
  DpxaScenario sc({100}, {100}, 16);
  DpxaArgs a;
  a.mode = "deltax";
  std::string err;
  for (double bad : {-0.1, 1.5}) {
    a.exact_top = bad;
    EXPECT_EQ(create(sc.g, a, &err), nullptr);
    EXPECT_THAT(err, HasSubstr("exact_top"));
    EXPECT_THAT(err, HasSubstr("outside [0, 1]"));
  }
  a.exact_top = 0.1;
  a.pack_threshold = -1;
  EXPECT_EQ(create(sc.g, a, &err), nullptr);
  EXPECT_THAT(err, HasSubstr("pack_threshold = -1 is outside (-1, 1]"));
  a.pack_threshold = 1.01;
  EXPECT_EQ(create(sc.g, a, &err), nullptr);
  EXPECT_THAT(err, HasSubstr("pack_threshold"));
  a.pack_threshold = 1;  // the upper end is allowed
  EXPECT_NE(create(sc.g, a, &err), nullptr) << err;

  // CUDA: a build with CUDA accepts deltax there (test_deltax_cuda runs it), and still refuses a
  // bad pack_threshold; a build without CUDA refuses the device itself.
  sieve_geometry cuda = sc.g;
  cuda.device = {kDLCUDA, 0};
  DpxaValues v(a);
  ReasonLog reasons;
  const sieve_status st = api_->validate(&cuda, v.v, DpxaValues::kCount, reasons.sink());
  if (api_->descriptor->devices & SIEVE_DEVICE_CUDA) {
    EXPECT_EQ(st, SIEVE_OK) << reasons.all();
    DpxaArgs bad = a;
    bad.pack_threshold = -1;
    DpxaValues vb(bad);
    ReasonLog rb;
    EXPECT_NE(api_->validate(&cuda, vb.v, DpxaValues::kCount, rb.sink()), SIEVE_OK);
    EXPECT_THAT(rb.all(), HasSubstr("pack_threshold = -1 is outside (-1, 1]"));
  } else {
    EXPECT_NE(st, SIEVE_OK);
  }

  // attend for a layer its select did not see.
  sieve_policy* p = create(sc.g, a);
  ASSERT_NE(p, nullptr);
  HostSelection sel(1000, 1000);
  uint32_t stats = 0;
  ASSERT_EQ(api_->select(p, &sc.call, sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
  sc.call.layer = 2;
  EXPECT_EQ(api_->attend(p, &sc.call, sel.get(), &sc.w.out.dl()), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("last select was for layer 1"));
}

// The ABI conformance suite with mode=deltax (its CPU numeric checks run the attend hook through
// the layer runner; the CUDA checks are left to test_deltax_cuda, which needs a GPU).
TEST(DeltaXConform, ConformancePassesInDeltaxMode) {
  sieve::runtime::ConformOptions o;
  o.isolate = false;
  o.params = {{"mode", "deltax"}};
  const auto r = sieve::runtime::conform(std::string(SIEVE_PLUGIN_DIR) + "/libsieve_dpxa.so", o);
  bool cpu_prefill = false;
  for (const auto& c : r.checks) {
    if (c.name.find("cuda") != std::string::npos) continue;
    cpu_prefill |= c.name == "numeric_cpu_prefill" && c.passed;
    EXPECT_TRUE(c.passed || c.skipped) << c.name << ": " << c.detail;
  }
  EXPECT_TRUE(cpu_prefill);
}

}  // namespace
