// The dpxa plugin (CPU), loaded from its .so: sink and diagonal blocks always kept; per-head
// thresholds from a file; selections checked against a plain f64 recomputation of the anchors,
// tile shares and greedy cover for every estimator; rows=kv_head is the union of its group;
// calibration reaches its target on the calibration data; bad input is refused with a message;
// conformance passes; the long-context generator reproduces the paper's adjacent similarity.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "math/dpxa_math.hpp"
#include "dpxa_scenario.hpp"
#include "mocks/mock_host_services.hpp"
#include "sieve/runtime/conformance.hpp"
#include "support/chain_session.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
namespace tolerance = sieve::tolerance;
using ::testing::HasSubstr;
using ::testing::NiceMock;
using Rows = std::vector<std::vector<int32_t>>;

class Dpxa : public DpxaTest<NiceMock<MockHostServices>> {
 protected:
  void TearDown() override {
    DpxaTest::TearDown();
    EXPECT_EQ(host_.live_allocations(), 0u);
  }
  // Run select and return the rows (checks the CSR shape).
  Rows select(DpxaScenario& sc, const DpxaArgs& a) {
    sieve_policy* p = create(sc.g, a);
    if (!p) return {};
    const int32_t B = int32_t(a.block);
    const int32_t H = a.rows == "kv_head" ? sc.g.n_kv_heads : sc.g.n_q_heads;
    const int32_t n_rows = sc.rows(B, H);
    HostSelection sel(int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads, 100000);
    uint32_t stats = 0;
    EXPECT_EQ(api_->select(p, &sc.call, sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
    EXPECT_EQ(stats, 0u);
    const sieve_selection& s = sel.sel();
    EXPECT_EQ(s.kind, uint32_t(SIEVE_SEL_BLOCKS));
    EXPECT_EQ(s.heads, uint32_t(a.rows == "kv_head" ? SIEVE_SEL_PER_KV_HEAD : SIEVE_SEL_PER_Q_HEAD));
    EXPECT_EQ(s.q_block, B);
    EXPECT_EQ(s.k_block_pages, B / sc.g.page_size);
    EXPECT_EQ(s.n_rows, n_rows);
    Rows rows(static_cast<size_t>(n_rows));
    EXPECT_EQ(sel.indptr()[0], 0);
    for (int32_t r = 0; r < n_rows && r < s.n_rows; ++r) {
      for (int32_t e = sel.indptr()[r]; e < sel.indptr()[r + 1]; ++e) {
        rows[r].push_back(sel.indices()[e]);
        if (rows[r].size() > 1) {
          EXPECT_LT(rows[r][rows[r].size() - 2], rows[r].back()) << "row " << r;
        }
      }
    }
    return rows;
  }

};

// Forced blocks of query block t: 0 and the blocks holding its positions.
std::set<int32_t> forced_blocks(const DpxaScenario& sc, int32_t b, int32_t B, int32_t t) {
  const auto r = sieve::dpxa::row_span(sc.w.kv_len[b], sc.w.n_new[b], B, t);
  std::set<int32_t> f{0};
  for (int32_t j = r.diag_first; j < r.n_candidates; ++j) f.insert(j);
  return f;
}

TEST_F(Dpxa, DescriptorAndSchema) {
  const sieve_policy_descriptor& d = *api_->descriptor;
  EXPECT_STREQ(d.name, "dpxa");
  EXPECT_EQ(d.phases, uint32_t(SIEVE_PHASE_PREFILL));
  EXPECT_EQ(d.selection_heads, uint32_t(SIEVE_SEL_PER_Q_HEAD));
  ASSERT_EQ(api_->n_params, DpxaValues::kCount);
  const char* names[] = {"estimator", "block", "threshold", "stride", "tau", "thresholds", "rows",
                         "mode", "exact_top", "pack_threshold"};
  for (uint32_t i = 0; i < DpxaValues::kCount; ++i) EXPECT_STREQ(api_->params[i].name, names[i]);
  EXPECT_STREQ(api_->params[1].default_value, "128");
  EXPECT_STREQ(api_->params[2].default_value, "0.75");
  EXPECT_STREQ(api_->params[7].default_value, "select");
  EXPECT_STREQ(api_->params[8].default_value, "0.1");
  EXPECT_STREQ(api_->params[9].default_value, "0.83");
  EXPECT_NE(api_->select, nullptr);
  // attend exists for mode=deltax; a mode=select instance does not use it (instance_hooks,
  // test_deltax.cpp).
  EXPECT_NE(api_->attend, nullptr);
  EXPECT_EQ(api_->on_append, nullptr);
}

// tau = 0 keeps exactly the sink and the diagonal; larger tau keeps a superset; tau = 1 all.
TEST_F(Dpxa, SinkAndDiagonalAlwaysKept) {
  // Whole prompts, a chunked prefill whose queries start mid-block, a short sequence.
  DpxaScenario sc({300, 200, 40}, {300, 77, 40}, 8);
  for (const char* est : {"dpxa", "xattn", "stride"}) {
    SCOPED_TRACE(est);
    DpxaArgs a;
    a.estimator = est;
    a.tau = 0;
    const Rows r0 = select(sc, a);
    a.tau = 0.6;
    const Rows r6 = select(sc, a);
    a.tau = 1;
    const Rows r1 = select(sc, a);
    int32_t row = 0;
    for (int32_t b = 0; b < sc.w.batch; ++b)
      for (int32_t t = 0; t < sc.query_blocks(b, 32); ++t)
        for (int32_t h = 0; h < sc.g.n_q_heads; ++h, ++row) {
          const auto f = forced_blocks(sc, b, 32, t);
          EXPECT_EQ(std::set<int32_t>(r0[row].begin(), r0[row].end()), f) << "row " << row;
          for (int32_t j : f) EXPECT_TRUE(std::binary_search(r6[row].begin(), r6[row].end(), j));
          const auto span = sieve::dpxa::row_span(sc.w.kv_len[b], sc.w.n_new[b], 32, t);
          EXPECT_EQ(int32_t(r1[row].size()), span.n_candidates) << "row " << row;
        }
  }
}

// Every estimator against the f64 recomputation: the kept set holds the forced blocks, covers tau
// of the estimated share, is minimal, and is a top set (no dropped tile outweighs a kept one).
TEST_F(Dpxa, SelectionMatchesPlainRecomputation) {
  DpxaScenario sc({512, 260}, {512, 130}, 16);
  const int32_t B = 32;
  for (const char* est : {"dpxa", "xattn", "stride"}) {
    for (double tau : {0.5, 0.9}) {
      SCOPED_TRACE(::testing::Message() << est << " tau=" << tau);
      DpxaArgs a;
      a.estimator = est;
      a.tau = tau;
      const Rows rows = select(sc, a);
      const int32_t S = std::string(est) == "xattn" ? 8 : 4;
      const double rounding = share_error(sc, a);
      int32_t row = 0, pruned = 0;
      for (int32_t b = 0; b < sc.w.batch; ++b) {
        for (int32_t t = 0; t < sc.query_blocks(b, B); ++t) {
          for (int32_t h = 0; h < sc.g.n_q_heads; ++h, ++row) {
            const auto q = sc.queries(b, h);
            const auto k = sc.keys(b, h / (sc.g.n_q_heads / sc.g.n_kv_heads));
            const auto w = plain_shares(est, q, k, B, t, S, 0.75);
            const auto f = forced_blocks(sc, b, B, t);
            const std::set<int32_t> kept(rows[row].begin(), rows[row].end());
            pruned += expect_greedy_cover(w, kept, [&](int32_t j) { return f.count(j) > 0; }, tau,
                                          rounding, row);
          }
        }
      }
      EXPECT_GT(pruned, 0) << "some row must drop a tile, or the test checks nothing";
    }
  }
}

// The anchors the plugin scores with are the plain delta walk's.
TEST(DpxaCore, AnchorsMatchPlainWalk) {
  DpxaScenario sc({700}, {700}, 16, 4, 2, 64);
  for (int32_t g = 0; g < 2; ++g) {
    const auto k = sc.keys(0, g);
    std::vector<float> flat;
    for (const auto& r : k) flat.insert(flat.end(), r.begin(), r.end());
    for (double thr : {0.6, 0.75, 0.9}) {
      sieve::dpxa::Anchors a;
      sieve::dpxa::block_anchors(flat.data(), 700, 64, 128, float(thr), a);
      int64_t total = 0;
      for (int32_t blk = 0; blk * 128 < 700; ++blk) {
        const auto want = plain_anchors(k, blk * 128, std::min(128, 700 - blk * 128), thr);
        std::vector<int32_t> got(a.offsets.begin() + blk * 128,
                                 a.offsets.begin() + blk * 128 + a.counts[blk]);
        EXPECT_EQ(got, want) << "block " << blk << " threshold " << thr;
        total += a.counts[blk];
      }
      if (thr == 0.75) {  // generator keys: well below every key, well above one per block
        EXPECT_LT(total, 700 * 0.6);
        EXPECT_GT(total, 700 * 0.05);
      }
    }
  }
}

// max_row_tiles (what the CUDA selection's tile scratch and DeltaX's span rows are sized for)
// covers Σ_t n_candidates(t) of every chunk a sequence of at most max_seq_len tokens can be
// prefilled in, counted by row_span itself; and a chunk starting mid-block can need more than the
// KB (KB + 1) / 2 tiles of a whole prompt, the size the scratch once had.
TEST(DpxaCore, MaxRowTilesCoversEveryChunkedPrefill) {
  for (int32_t B : {4, 16, 32})
    for (int64_t L : {int64_t(B) * 4 - 1, int64_t(B) * 8, int64_t(B) * 8 + 5}) {
      const int64_t kb = (L + B - 1) / B;
      int64_t worst = 0;
      for (int64_t kv_len = 1; kv_len <= L; ++kv_len)
        for (int64_t n_new = 1; n_new <= kv_len; ++n_new) {
          int64_t tiles = 0;
          for (int32_t t = 0; int64_t(t) * B < n_new; ++t)
            tiles += sieve::dpxa::row_span(kv_len, n_new, B, t).n_candidates;
          worst = std::max(worst, tiles);
        }
      SCOPED_TRACE(::testing::Message() << "B " << B << ", max_seq_len " << L);
      EXPECT_LE(worst, sieve::dpxa::max_row_tiles(L, B));
      // (A max_seq_len ending mid-block can absorb the excess in its short last key block.)
      if (L % B == 0) {
        EXPECT_GT(worst, kb * (kb + 1) / 2);
      }
    }
}

// Per-head tau from a thresholds file: head 0 keeps everything, head 1 only the forced blocks,
// the rest the global tau; a bad file is refused naming the line.
TEST_F(Dpxa, ThresholdsFilePerHead) {
  const std::string path = ::testing::TempDir() + "dpxa_thresholds.txt";
  {
    std::ofstream f(path);
    f << "# layer head tau\n1 0 1.0\n1 1 0.0  # forced only\n0 2 0.0\n";
  }
  DpxaScenario sc({256}, {256}, 16);
  DpxaArgs a;
  a.thresholds = path;
  a.tau = 0.0;
  const Rows rows = select(sc, a);
  for (int32_t t = 0; t < 8; ++t) {
    const auto span = sieve::dpxa::row_span(256, 256, 32, t);
    EXPECT_EQ(int32_t(rows[t * 4 + 0].size()), span.n_candidates) << "head 0 has tau 1";
    EXPECT_EQ(std::set<int32_t>(rows[t * 4 + 1].begin(), rows[t * 4 + 1].end()),
              forced_blocks(sc, 0, 32, t));
    EXPECT_EQ(std::set<int32_t>(rows[t * 4 + 2].begin(), rows[t * 4 + 2].end()),
              forced_blocks(sc, 0, 32, t)) << "layer 0's entry must not apply to layer 1";
  }
  {
    std::ofstream f(path);
    f << "1 0 0.5\n1 9 0.5\n";
  }
  std::string err;
  EXPECT_EQ(create(sc.g, a, &err), nullptr);
  EXPECT_THAT(err, HasSubstr(":2:"));
  EXPECT_THAT(err, HasSubstr("head 9"));
  {
    std::ofstream f(path);
    f << "1 0 1.5\n";
  }
  EXPECT_EQ(create(sc.g, a, &err), nullptr);
  EXPECT_THAT(err, HasSubstr("outside [0, 1]"));
  a.thresholds = path + ".missing";
  EXPECT_EQ(create(sc.g, a, &err), nullptr);
  EXPECT_THAT(err, HasSubstr("cannot open: No such file or directory"));
  a.thresholds = ::testing::TempDir();  // a directory is not a thresholds file
  EXPECT_EQ(create(sc.g, a, &err), nullptr);
  EXPECT_THAT(err, HasSubstr("is a directory"));
  std::remove(path.c_str());
}

TEST_F(Dpxa, KvHeadRowsAreTheGroupUnion) {
  DpxaScenario sc({400, 150}, {400, 150}, 16);
  DpxaArgs a;
  const Rows q = select(sc, a);
  a.rows = "kv_head";
  const Rows kv = select(sc, a);
  ASSERT_EQ(q.size(), kv.size() * 2);
  for (size_t r = 0; r < kv.size(); ++r) {
    const size_t blk = r / 2, g = r % 2;
    std::set<int32_t> u;
    for (size_t h = g * 2; h < g * 2 + 2; ++h) u.insert(q[blk * 4 + h].begin(), q[blk * 4 + h].end());
    EXPECT_EQ(std::set<int32_t>(kv[r].begin(), kv[r].end()), u) << "row " << r;
  }
}

#ifdef _OPENMP
// The CPU select runs (sequence, KV head) pairs on OpenMP threads, each writing only its own rows
// (and the KV-head unions its own heads make): one thread or three give the same rows.
TEST_F(Dpxa, ThreadsChangeNoRow) {
  DpxaScenario sc({1500, 900, 700}, {1500, 640, 700}, 16, 8, 2, 64);  // past the threading threshold
  const int before = omp_get_max_threads();
  for (const char* rows : {"q_head", "kv_head"}) {
    SCOPED_TRACE(rows);
    DpxaArgs a;
    a.rows = rows;
    omp_set_num_threads(1);
    const Rows one = select(sc, a);
    omp_set_num_threads(3);
    const Rows three = select(sc, a);
    ASSERT_FALSE(one.empty());
    EXPECT_EQ(one, three);
  }
  omp_set_num_threads(before);
}
#endif

TEST_F(Dpxa, Bf16KeysAndQueries) {
  DpxaScenario sc({300}, {300}, 16, 4, 2, 32, 3, sieve::kBF16);
  DpxaArgs a;
  a.tau = 0;
  const Rows r = select(sc, a);
  for (int32_t t = 0; t < sc.query_blocks(0, 32); ++t)
    EXPECT_EQ(std::set<int32_t>(r[t * 4].begin(), r[t * 4].end()), forced_blocks(sc, 0, 32, t));
}

TEST_F(Dpxa, BadInputIsRefused) {
  DpxaScenario sc({100}, {100}, 16);
  std::string err;
  DpxaArgs a;
  a.block = 40;  // not a multiple of 16
  EXPECT_EQ(create(sc.g, a, &err), nullptr);
  EXPECT_THAT(err, HasSubstr("block = 40"));
  a.block = 32;
  a.stride = 64;
  EXPECT_EQ(create(sc.g, a, &err), nullptr);
  EXPECT_THAT(err, HasSubstr("stride"));

  // Too little selection capacity: CAPACITY, the selection untouched.
  a.stride = 0;
  sieve_policy* p = create(sc.g, a);
  ASSERT_NE(p, nullptr);
  HostSelection small(1000, 3);
  uint32_t stats = 0;
  EXPECT_EQ(api_->select(p, &sc.call, small.get(), &stats), SIEVE_ERR_CAPACITY);
  EXPECT_EQ(small.indptr()[0], kSelectionPoison);
  EXPECT_EQ(small.sel().kind, uint32_t(SIEVE_SEL_ALL));
  // Lengths that disagree with the view.
  HostSelection sel(1000, 1000);
  sc.w.kv_len[0] = 99;
  EXPECT_EQ(api_->select(p, &sc.call, sel.get(), &stats), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("kv_len 99"));
  sc.w.kv_len[0] = 100;
  sc.call.phase = SIEVE_PHASE_DECODE;
  EXPECT_EQ(api_->select(p, &sc.call, sel.get(), &stats), SIEVE_ERR_INVALID_ARGUMENT);
}

// Calibration: the tau it returns reaches the target recall of the exact mass on the calibration
// rows, and a slightly smaller tau does not (it is the smallest).
TEST(DpxaCalibrate, ReachesTargetOnCalibrationData) {
  DpxaScenario sc({768}, {768}, 16, 2, 1, 32, 11);
  const int32_t B = 64;
  const auto qd = sc.queries(0, 0), kd = sc.keys(0, 0);
  std::vector<float> q, k;
  for (const auto& r : qd) q.insert(q.end(), r.begin(), r.end());
  for (const auto& r : kd) k.insert(k.end(), r.begin(), r.end());
  sieve::dpxa::Config c;
  c.block = B;
  c.scale = 1.0f / std::sqrt(32.f);
  for (auto est : {sieve::dpxa::kDpxa, sieve::dpxa::kXattn}) {
    c.estimator = est;
    sieve::dpxa::Anchors qa, ka;
    sieve::dpxa::block_anchors(q.data(), 768, 32, B, 0.75f, qa);
    sieve::dpxa::block_anchors(k.data(), 768, 32, B, 0.75f, ka);
    sieve::dpxa::HeadScores s;
    sieve::dpxa::score_head(c, q.data(), 768, k.data(), 768, 32, &qa, &ka, s);
    std::vector<double> mass;
    sieve::dpxa::true_tile_mass(q.data(), 768, k.data(), 768, 32, B, c.scale, mass);
    std::vector<sieve::dpxa::CalibrationRow> rows;
    for (size_t t = 0; t < s.spans.size(); ++t) {
      sieve::dpxa::CalibrationRow r;
      r.span = s.spans[t];
      r.tiles.assign(s.tiles.begin() + s.row_start[t], s.tiles.begin() + s.row_start[t + 1]);
      r.mass.assign(mass.begin() + s.row_start[t], mass.begin() + s.row_start[t + 1]);
      double sum = 0;
      for (double m : r.mass) sum += m;
      // f64 sums: the row's normaliser (768 terms) and its 32 x 768 probabilities gathered into
      // tiles and summed here.
      EXPECT_NEAR(sum, 1.0,
                  tolerance::kSafety * tolerance::gamma(2 * 768 + B * 768, tolerance::kF64))
          << "exact tile masses of a row sum to 1";
      rows.push_back(std::move(r));
    }
    for (double target : {0.8, 0.9, 0.97}) {
      double got = 0;
      const float tau = sieve::dpxa::calibrate_tau(rows, target, &got);
      SCOPED_TRACE(::testing::Message() << sieve::dpxa::estimator_name(est) << " target " << target
                                        << " tau " << tau);
      EXPECT_GE(got, target);
      EXPECT_EQ(got, sieve::dpxa::mass_recall(rows, tau)) << "the same call on the same rows";
      if (tau > 0.001f) {
        EXPECT_LT(sieve::dpxa::mass_recall(rows, tau - 0.001f), target);
      }
    }
  }
}

// The generator's adjacent-key similarity and anchor keep ratios against the paper (§6, §4.3,
// Table 3) at the documented defaults (d = 128).
TEST(LongContext, AdjacentSimilarityMatchesThePaper) {
  sieve::reference::LongContextSpec s;
  s.n_q_heads = 8;
  s.n_kv_heads = 4;
  s.n_tokens = 1024;
  const auto c = sieve::reference::make_long_context(s);
  const auto k = sieve::reference::measure_adjacency(c.k, 1024, 4, 128, 512);
  EXPECT_GT(k.mean, 0.80);
  EXPECT_LT(k.mean, 0.95);
  EXPECT_GT(k.p10, 0.54) << "KVMerger's cos(1) lower bound";
  EXPECT_LT(k.far_mean, k.mean - 0.3) << "far keys are much less similar than neighbours";
  const double k75 = sieve::reference::measure_anchor_keep(c.k, 1024, 4, 128, 0.75);
  const double k83 = sieve::reference::measure_anchor_keep(c.k, 1024, 4, 128, 0.83);
  const double k88 = sieve::reference::measure_anchor_keep(c.k, 1024, 4, 128, 0.88);
  const double q75 = sieve::reference::measure_anchor_keep(c.q, 1024, 8, 128, 0.75);
  EXPECT_NEAR(k75, 0.20, 0.08);
  EXPECT_NEAR(k83, 0.49, 0.10);
  EXPECT_NEAR(k88, 0.70, 0.10);
  EXPECT_NEAR(q75, 0.20, 0.08);
  // Random normal keys (the plain Workload) have no such structure.
  std::vector<float> noise(size_t(1024) * 128);
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  for (float& x : noise) x = n(rng);
  EXPECT_LT(sieve::reference::measure_adjacency(noise, 1024, 1, 128).mean, 0.05);
  EXPECT_THROW(
      [] {
        sieve::reference::LongContextSpec bad;
        bad.key_adjacent_cos = 0.99;
        bad.key_drift_rho = 0.5;
        sieve::reference::make_long_context(bad);
      }(),
      std::invalid_argument);
}

// Through the layer runner on similar keys (the path `sieve attn --keys similar` takes): tau = 1
// is dense attention; a smaller tau attends less, with less true mass; hooks allocate nothing.
TEST(DpxaChains, ThroughTheLayerRunnerOnSimilarKeys) {
  using sieve::runtime::SyntheticReport;
  const sieve::runtime::Registry reg = registry_with();
  sieve::runtime::SyntheticSpec s = small_session(SIEVE_PHASE_PREFILL, 64, {512}, 512);
  s.n_q_heads = 4;  // the geometry this test was tuned on (small_session has 8)
  s.similar_keys = true;
  auto run = [&](const std::string& text) { return run_chain(s, text, reg); };
  const SyntheticReport all = run("prefill:*=dpxa(block=32,tau=1)");
  EXPECT_LT(all.rel_err, 1e-5);
  EXPECT_DOUBLE_EQ(all.attended_fraction, 1.0) << "a mean of ratios of equal key counts";
  for (const char* est : {"dpxa", "xattn", "stride"}) {
    SCOPED_TRACE(est);
    const SyntheticReport lo = run(std::string("prefill:*=dpxa(block=32,tau=0.5,estimator=") + est + ")");
    const SyntheticReport hi = run(std::string("prefill:*=dpxa(block=32,tau=0.95,estimator=") + est + ")");
    EXPECT_LT(lo.attended_fraction, hi.attended_fraction);
    EXPECT_LT(hi.attended_fraction, 0.999) << "tau 0.95 must drop some tile at 512 tokens";
    // lo keeps a prefix of hi's greedy order: a subset, so less f64 mass (512-term sums, a mean
    // over the rows).
    EXPECT_LE(lo.recall, hi.recall + tolerance::kSafety * tolerance::gamma(2 * 512, tolerance::kF64));
    EXPECT_GT(hi.recall, 0.7);
    EXPECT_GT(lo.rel_err, hi.rel_err);
    EXPECT_EQ(hi.hook_allocations, 0u);
    EXPECT_EQ(hi.non_finite, 0);
    bool reported = false;
    for (const auto& [name, m] : hi.metrics) reported |= name == "dpxa_density";
    EXPECT_TRUE(reported);
  }
}

TEST(DpxaConform, ConformancePasses) {
  sieve::runtime::ConformOptions o;
  o.isolate = false;
  const auto r = sieve::runtime::conform(std::string(SIEVE_PLUGIN_DIR) + "/libsieve_dpxa.so", o);
  for (const auto& c : r.checks) EXPECT_TRUE(c.passed || c.skipped) << c.name << ": " << c.detail;
  EXPECT_TRUE(r.passed());
}

}  // namespace
