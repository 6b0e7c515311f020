// The seer plugin's CUDA path against its CPU path and the f64 gate: the same random sequences
// (same seeds) run through a CPU session and a CUDA session (the core's CUDA paged store); the
// K-compression cache matches the f64 recomputation, blocks become visible at the same step, the
// budget (core/selection top-k) and threshold selections list the same blocks as the CPU (a
// difference is allowed only at an f64 near-tie). Skips without a CUDA device.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "gate/gate_file.hpp"
#include "seer_reference.hpp"
#include "seer_session.hpp"

namespace {

using namespace sieve::testing;
namespace sg = sieve::seer;

bool have_cuda() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_CUDA() \
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device: the seer CUDA path is checked on the GPU machine"

std::string gate_file(const sieve_geometry& g, int32_t block, int32_t gate_dim, bool rms, const std::string& name) {
  const std::string path = temp_path(name);
  sg::write_gate(path, sg::random_gate(seer_shape(g, block, gate_dim, rms), 13));
  return path;
}

TEST(SeerCuda, CacheMatchesF64) {
  REQUIRE_CUDA();
  for (bool rms : {false, true}) {
    const sieve_geometry g = seer_geometry({kDLCUDA, 0}, 8, 2, 64, 16);
    SeerParams p;
    p.block = 32;
    p.rmsnorm = rms;
    p.weights = gate_file(g, 32, 32, rms, "cuda_cache");
    const sg::GateWeights w = sg::read_gate(p.weights);
    SeerSession s(g, p);
    ASSERT_TRUE(s.ok()) << s.create_error();
    const int32_t a = s.add_sequence(), b = s.add_sequence();
    ASSERT_EQ(s.step(1, {a, b}, {100, 70}, SIEVE_PHASE_PREFILL), SIEVE_OK) << s.last_error();
    int64_t pages = 0;
    const std::vector<float> cache = s.cache(1, &pages);
    for (auto [seq, complete] : {std::pair{a, 3}, std::pair{b, 2}})
      for (int32_t j = 0; j < complete; ++j)
        for (int32_t h = 0; h < 2; ++h) {
          const float* e = cache.data() + (size_t(s.physical_page(1, seq, 2 * j)) * 2 + h) * 33;
          ASSERT_EQ(e[32], 1.f) << "block " << j;
          std::vector<double> bound;  // the f32 arithmetic's, any order (ref_gate_bound)
          const std::vector<double> ref = ref_gate_key(w, 1, h, s.seq(seq).k_pre, j, &bound);
          for (int32_t i = 0; i < 32; ++i) EXPECT_NEAR(e[i], ref[size_t(i)], bound[size_t(i)]);
        }
  }
}

// CPU and CUDA sessions over the same sequences: identical selections step by step (or an f64
// near-tie), for budget and threshold, with blocks completing along the way.
// Budget mode runs twice: the fused kernels (default) and the split ones (fused=false).
TEST(SeerCuda, SameBlocksAsCpu) {
  REQUIRE_CUDA();
  for (uint32_t variant : {0u, 1u, 2u})
    for (int32_t block : {16, 64}) {
      const uint32_t mode = variant == 1 ? 1u : 0u;
      const bool fused = variant != 2;
      SCOPED_TRACE(::testing::Message() << "mode " << mode << " fused " << fused << " block " << block);
      const sieve_geometry gc = seer_geometry(sieve::kCpu, 16, 4, 32, 16, 4, 1024);
      sieve_geometry gd = gc;
      gd.device = {kDLCUDA, 0};
      SeerParams p;
      p.block = block;
      p.mode = mode;
      p.token_budget = 3 * block;
      p.threshold = 0.05;
      p.fused = fused;
      p.weights = gate_file(gc, block, 32, false, "cuda_same");
      const sg::GateWeights w = sg::read_gate(p.weights);
      SeerSession cpu(gc, p, 99), gpu(gd, p, 99);
      ASSERT_TRUE(cpu.ok()) << cpu.create_error();
      ASSERT_TRUE(gpu.ok()) << gpu.create_error();
      std::vector<int32_t> ids;
      for (int i = 0; i < 3; ++i) {
        ids.push_back(cpu.add_sequence());
        gpu.add_sequence();
      }
      const std::vector<int32_t> prompt = {block - 3, 5 * block + 7, 9 * block};
      ASSERT_EQ(cpu.step(0, ids, prompt, SIEVE_PHASE_PREFILL), SIEVE_OK) << cpu.last_error();
      ASSERT_EQ(gpu.step(0, ids, prompt, SIEVE_PHASE_PREFILL), SIEVE_OK) << gpu.last_error();
      for (int32_t it = 0; it < 8; ++it) {
        ASSERT_EQ(cpu.step(0, ids, {1, 1, 1}, SIEVE_PHASE_DECODE), SIEVE_OK) << cpu.last_error();
        ASSERT_EQ(gpu.step(0, ids, {1, 1, 1}, SIEVE_PHASE_DECODE), SIEVE_OK) << gpu.last_error();
        ASSERT_EQ(gpu.selection.n_rows, cpu.selection.n_rows);
        EXPECT_EQ(gpu.selection.k_block_pages, block / 16);
        ASSERT_EQ(gpu.rows.size(), cpu.rows.size());
        for (size_t r = 0; r < cpu.rows.size(); ++r) {
          if (gpu.rows[r] == cpu.rows[r]) continue;
          // Only a near-tie in f64 may differ.
          const int32_t seq = int32_t(r / 4), h = int32_t(r % 4);
          const auto& sq = cpu.seq(ids[size_t(seq)]);
          const int64_t len = int64_t(sq.k_pre.size()) / (4 * 32);
          const int32_t nb = int32_t((len + block - 1) / block), complete = int32_t(len / block);
          const RefScores ref = ref_block_scores(w, 0, h, sq.q_pre_last, sq.k_pre, len, complete);
          const std::vector<double>& scores = ref.score;
          if (mode == 0) {  // to the f32 rounding of two scores (ref_score_bound)
            expect_top_k_row(gpu.rows[r], scores, nb, 2, 2 * ref.worst);
            continue;
          }
          // Threshold: a block may differ only when its f64 probability is at the threshold.
          double mx = -INFINITY, z = 0;
          for (double v : scores) mx = std::max(mx, v);
          for (double v : scores) z += std::exp(v - mx);
          for (int32_t j = 0; j + 1 < nb; ++j) {
            const bool in_cpu = std::count(cpu.rows[r].begin(), cpu.rows[r].end(), j) > 0;
            const bool in_gpu = std::count(gpu.rows[r].begin(), gpu.rows[r].end(), j) > 0;
            const double prob = std::exp(scores[size_t(j)] - mx) / z;
            if (in_cpu != in_gpu) {  // each side's f32 probability within prob_bound of it
              EXPECT_NEAR(prob, 0.05, 2 * ref.prob_bound(prob)) << "block " << j << " row " << r;
            }
          }
        }
      }
    }
}

// Equal scores everywhere (W_q = 0: every gate query is zero): the top-k takes the lowest-indexed
// blocks, on CPU and CUDA alike (the radix select's ties: every key equals the threshold), with
// budgets keeping only the last block, a few blocks, or every block.
// Engine page layouts (ABI 1.1 strided views) on the device: the same pre-RoPE keys laid out HND,
// NHD and as combined pools give bit-identical K-compression caches and selections (fused and
// split kernels) to the store's compact pages.
TEST(SeerCuda, EngineLayoutsGiveBitIdenticalCachesAndSelections) {
  REQUIRE_CUDA();
  for (const bool fused : {true, false}) {
    sieve_geometry g = seer_geometry(sieve::kCpu, 16, 4, 32, 16, 4, 1024);
    g.device = {kDLCUDA, 0};
    SeerParams p;
    p.block = 32;
    p.token_budget = 96;
    p.fused = fused;
    p.weights = gate_file(g, 32, 32, false, "cuda_layouts");
    auto run = [&](std::optional<sieve::KvLayout> layout, std::vector<std::vector<int32_t>>* rows) {
      SeerSession s(g, p, 71);
      s.view_layout = layout;
      EXPECT_TRUE(s.ok()) << s.create_error();
      std::vector<int32_t> ids;
      for (int i = 0; i < 3; ++i) ids.push_back(s.add_sequence());
      EXPECT_EQ(s.step(0, ids, {29, 167, 288}, SIEVE_PHASE_PREFILL), SIEVE_OK) << s.last_error();
      for (int32_t it = 0; it < 4; ++it) {
        EXPECT_EQ(s.step(0, ids, {1, 1, 1}, SIEVE_PHASE_DECODE), SIEVE_OK) << s.last_error();
        rows->insert(rows->end(), s.rows.begin(), s.rows.end());
      }
      int64_t pages = 0;
      return s.cache(0, &pages);
    };
    std::vector<std::vector<int32_t>> want_rows;
    const std::vector<float> want_cache = run(std::nullopt, &want_rows);
    ASSERT_FALSE(want_rows.empty());
    for (const sieve::KvLayout layout : sieve::kKvLayouts) {
      SCOPED_TRACE(::testing::Message() << "fused " << fused << ", " << sieve::kv_layout_name(layout));
      std::vector<std::vector<int32_t>> rows;
      const std::vector<float> cache = run(layout, &rows);
      EXPECT_EQ(rows, want_rows);
      ASSERT_EQ(cache.size(), want_cache.size());
      EXPECT_EQ(std::memcmp(cache.data(), want_cache.data(), cache.size() * 4), 0) << "K-compression cache differs";
    }
  }
}

TEST(SeerCuda, TiesTakeTheLowestBlocks) {
  REQUIRE_CUDA();
  for (bool fused : {true, false})
    for (int64_t budget : {16, 64, 160, 4096}) {
      SCOPED_TRACE(::testing::Message() << "fused " << fused << " budget " << budget);
      const sieve_geometry gc = seer_geometry(sieve::kCpu, 8, 2, 16, 16, 3, 4096);
      sieve_geometry gd = gc;
      gd.device = {kDLCUDA, 0};
      SeerParams p;
      p.block = 16;
      p.token_budget = budget;
      p.fused = fused;
      sg::GateWeights w = sg::random_gate(seer_shape(gc, 16, 16, false), 5);
      std::fill(w.wq.begin(), w.wq.end(), 0.f);
      p.weights = temp_path("cuda_ties");
      sg::write_gate(p.weights, w);
      SeerSession cpu(gc, p, 3), gpu(gd, p, 3);
      ASSERT_TRUE(cpu.ok()) << cpu.create_error();
      ASSERT_TRUE(gpu.ok()) << gpu.create_error();
      std::vector<int32_t> ids;
      for (int i = 0; i < 3; ++i) {
        ids.push_back(cpu.add_sequence());
        gpu.add_sequence();
      }
      const std::vector<int32_t> prompt = {3000, 17, 1200};
      ASSERT_EQ(cpu.step(0, ids, prompt, SIEVE_PHASE_PREFILL), SIEVE_OK) << cpu.last_error();
      ASSERT_EQ(gpu.step(0, ids, prompt, SIEVE_PHASE_PREFILL), SIEVE_OK) << gpu.last_error();
      for (int32_t it = 0; it < 3; ++it) {
        ASSERT_EQ(cpu.step(0, ids, {1, 1, 1}, SIEVE_PHASE_DECODE), SIEVE_OK) << cpu.last_error();
        ASSERT_EQ(gpu.step(0, ids, {1, 1, 1}, SIEVE_PHASE_DECODE), SIEVE_OK) << gpu.last_error();
        ASSERT_EQ(gpu.rows.size(), cpu.rows.size());
        for (size_t r = 0; r < cpu.rows.size(); ++r) {
          EXPECT_EQ(gpu.rows[r], cpu.rows[r]) << "row " << r;
          const int32_t len = prompt[r / 2] + it + 1, nb = (len + 15) / 16, k = int32_t(budget / 16 - 1);
          std::vector<int32_t> want;
          for (int32_t j = 0; j < (nb <= 1 + k ? nb - 1 : k); ++j) want.push_back(j);
          want.push_back(nb - 1);
          EXPECT_EQ(cpu.rows[r], want) << "row " << r;
        }
      }
    }
}

// fused=true fills the cache in select (the decode step's on_append launches nothing once the
// layer has been filled): a decode step whose token completes a block makes the block's entry
// (f64-checked) appear; decode appends without a select leave their blocks for the next select,
// which fills all of them (back to the first filled block).
TEST(SeerCuda, DecodeStepFillsTheCompletedBlock) {
  REQUIRE_CUDA();
  const sieve_geometry g = seer_geometry({kDLCUDA, 0}, 8, 2, 64, 16);
  SeerParams p;
  p.block = 16;
  p.token_budget = 32;
  p.weights = gate_file(g, 16, 32, false, "cuda_decode_fill");
  const sg::GateWeights w = sg::read_gate(p.weights);
  SeerSession s(g, p);
  ASSERT_TRUE(s.ok()) << s.create_error();
  const int32_t a = s.add_sequence();
  ASSERT_EQ(s.step(1, {a}, {45}, SIEVE_PHASE_PREFILL), SIEVE_OK) << s.last_error();
  int64_t pages = 0;
  for (int32_t t = 45; t < 48; ++t) {
    {
      const std::vector<float> cache = s.cache(1, &pages);
      EXPECT_NE(cache[(size_t(s.physical_page(1, a, 2)) * 2 + 0) * 33 + 32], 1.f) << "block 2 before token " << t;
    }
    ASSERT_EQ(s.step(1, {a}, {1}, SIEVE_PHASE_DECODE), SIEVE_OK) << s.last_error();
  }
  auto expect_filled = [&](int32_t blocks) {
    const std::vector<float> cache = s.cache(1, &pages);
    for (int32_t j = 0; j < blocks; ++j)
      for (int32_t h = 0; h < 2; ++h) {
        const float* e = cache.data() + (size_t(s.physical_page(1, a, j)) * 2 + h) * 33;
        ASSERT_EQ(e[32], 1.f) << "block " << j;
        std::vector<double> bound;  // the f32 arithmetic's, any order (ref_gate_bound)
        const std::vector<double> ref = ref_gate_key(w, 1, h, s.seq(a).k_pre, j, &bound);
        for (int32_t i = 0; i < 32; ++i) EXPECT_NEAR(e[i], ref[size_t(i)], bound[size_t(i)]);
      }
  };
  expect_filled(3);
  // Tokens 48..80 appended without a select: blocks 3 and 4 complete, unfilled until the select.
  for (int32_t t = 48; t < 81; ++t) ASSERT_EQ(s.step(1, {a}, {1}, SIEVE_PHASE_DECODE, false), SIEVE_OK) << s.last_error();
  {
    const std::vector<float> cache = s.cache(1, &pages);
    for (int32_t j : {3, 4}) EXPECT_NE(cache[(size_t(s.physical_page(1, a, j)) * 2 + 1) * 33 + 32], 1.f) << "block " << j;
  }
  ASSERT_EQ(s.step(1, {a}, {1}, SIEVE_PHASE_DECODE), SIEVE_OK) << s.last_error();
  expect_filled(5);
}

// STATIC_SHAPES: a decode step's select captures into a CUDA graph (no synchronisation or
// allocation in the hook; fused=true's cache catch-up included, a block completing in a captured
// step), and the graph's launch selects exactly what the eager hook selects (same kernels).
TEST(SeerCuda, SelectCapturesIntoACudaGraph) {
  REQUIRE_CUDA();
  for (bool fused : {true, false}) {
    SCOPED_TRACE(::testing::Message() << "fused " << fused);
    const sieve_geometry gd = seer_geometry({kDLCUDA, 0}, 8, 2, 32, 16, 2, 512);
    SeerParams p;
    p.block = 16;
    p.token_budget = 48;
    p.fused = fused;
    p.weights = gate_file(gd, 16, 16, false, "cuda_graph");
    SeerSession eager(gd, p, 21), graph(gd, p, 21);
    ASSERT_TRUE(eager.ok()) << eager.create_error();
    ASSERT_TRUE(graph.ok()) << graph.create_error();
    const std::vector<int32_t> ids = {eager.add_sequence(), eager.add_sequence()};
    graph.add_sequence();
    graph.add_sequence();
    ASSERT_EQ(eager.step(0, ids, {140, 95}, SIEVE_PHASE_PREFILL), SIEVE_OK) << eager.last_error();
    ASSERT_EQ(graph.step(0, ids, {140, 95}, SIEVE_PHASE_PREFILL), SIEVE_OK) << graph.last_error();
    for (int32_t it = 0; it < 4; ++it) {  // sequence 1 completes block 5 at token 96 (it = 0)
      ASSERT_EQ(eager.step(0, ids, {1, 1}, SIEVE_PHASE_DECODE), SIEVE_OK) << eager.last_error();
      ASSERT_EQ(graph.step(0, ids, {1, 1}, SIEVE_PHASE_DECODE, true, true), SIEVE_OK) << graph.last_error();
      ASSERT_EQ(graph.rows.size(), eager.rows.size());
      ASSERT_EQ(graph.rows.size(), 4u);
      for (size_t r = 0; r < eager.rows.size(); ++r) {
        EXPECT_EQ(graph.rows[r], eager.rows[r]) << "step " << it << " row " << r;
        EXPECT_EQ(graph.rows[r].size(), 3u) << "step " << it << " row " << r;  // 48 tokens = 3 blocks
      }
    }
  }
}

}  // namespace
