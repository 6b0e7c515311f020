// The CPU attention kernel against the f64 reference: decode and causal prefill, GQA groups,
// head dims, page sizes, ragged sequences and last pages, storage dtypes, block selections of
// every head kind, q_rows, lse and page statistics, split-KV and the BLAS / loop paths.
// Outputs are poisoned with NaN before every call: every row that should be written must be, and
// every row that should not must still hold NaN. The K/V pools hold NaN in spare pages and past
// each sequence's last token, so reading a token the kernel must not read shows up as NaN.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu_loops.hpp"  // the kernel's private inner loops (core/kernels/cpu)
#include "sieve/kernels/attention_cpu.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/fidelity.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve {
namespace {

using kernels::attend_cpu;
using kernels::CpuAttentionOptions;
using reference::RefAttention;
using reference::Workload;
using reference::WorkloadSpec;

constexpr double kTolF32 = 1e-5;   // f32 accumulation, f32 output
constexpr double kTolHalf = 1e-2;  // f16 / bf16 queries and output
constexpr double kLseTol = 2e-5;   // absolute; lse values are O(1..10)
constexpr double kMassTol = 1e-5;  // relative

WorkloadSpec make_spec(int32_t hq, int32_t hkv, int32_t d, int32_t ps, std::vector<int32_t> lens,
                       sieve_phase phase = SIEVE_PHASE_DECODE, std::vector<int32_t> n_new = {},
                       uint64_t seed = 1) {
  WorkloadSpec s;
  s.n_q_heads = hq;
  s.n_kv_heads = hkv;
  s.head_dim = d;
  s.page_size = ps;
  s.kv_lens = std::move(lens);
  s.phase = phase;
  s.n_new = std::move(n_new);
  s.seed = seed;
  return s;
}

// Runs attend_cpu on poisoned outputs and checks every output against the f64 reference.
void expect_matches_reference(Workload& w, double tol, const CpuAttentionOptions& opt = {}) {
  w.poison_outputs();
  std::string err;
  ASSERT_EQ(attend_cpu(w.args, opt, &err), SIEVE_OK) << err;
  const RefAttention ref = reference::attend_reference(w.args);
  const int32_t hq = w.spec.n_q_heads, d = w.spec.head_dim;

  // Written exactly where the call computes, untouched elsewhere.
  int64_t unwritten = 0, overwritten = 0, empty_rows = 0;
  for (int32_t t = 0; t < w.n_q_tokens; ++t)
    for (int32_t h = 0; h < hq; ++h) {
      for (int32_t i = 0; i < d; ++i) {
        const bool nan = std::isnan(w.out.get((int64_t(t) * hq + h) * d + i));
        unwritten += ref.computed[size_t(t)] && nan;
        overwritten += !ref.computed[size_t(t)] && !nan;
      }
      // A row that attends nothing is exactly 0.
      if (ref.computed[size_t(t)] && std::isinf(ref.lse[size_t(t) * hq + h])) {
        ++empty_rows;
        for (int32_t i = 0; i < d; ++i)
          EXPECT_EQ(w.out.get((int64_t(t) * hq + h) * d + i), 0.f) << "empty row " << t << "," << h;
      }
    }
  EXPECT_EQ(unwritten, 0) << "output elements the kernel did not write";
  EXPECT_EQ(overwritten, 0) << "output elements of rows outside q_rows that the kernel wrote";

  const reference::OutputError e = reference::compare_output(ref, w.out.dl());
  EXPECT_EQ(e.non_finite, 0);
  EXPECT_LE(e.max_row_rel, tol) << "worst row: token " << e.worst_token << ", head "
                                << e.worst_head << " (rel_l2 " << e.rel_l2 << ")";

  if (w.args.lse) {
    EXPECT_LE(reference::max_lse_error(ref, w.lse.dl()), kLseTol);
    int64_t lse_overwritten = 0;
    for (int32_t t = 0; t < w.n_q_tokens; ++t)
      for (int32_t h = 0; h < hq; ++h)
        lse_overwritten += !ref.computed[size_t(t)] && !std::isnan(w.lse.get(int64_t(t) * hq + h));
    EXPECT_EQ(lse_overwritten, 0) << "lse rows outside q_rows were written";
  }
  if (w.args.stats != SIEVE_STATS_NONE) {
    const int64_t n = w.page_mass.numel();
    ASSERT_EQ(size_t(n), ref.page_mass.size());
    for (int64_t i = 0; i < n; ++i) ASSERT_FALSE(std::isnan(w.page_mass.get(i))) << "page_mass " << i;
    EXPECT_LE(reference::max_relative_error(ref.page_mass.data(), w.page_mass.dl(), n, 1e-6),
              kMassTol);
  }
}

// Key-block lists with one row forced empty, so empty rows are always exercised.
reference::SelectionRows rows_with_an_empty_one(const Workload& w, uint32_t heads, int32_t q_block,
                                                int32_t kbp, double keep, uint64_t seed) {
  reference::SelectionRows rows = w.random_selection_rows(heads, q_block, kbp, keep, seed);
  rows[rows.size() / 2].clear();
  return rows;
}

// ---- inner loops ----------------------------------------------------------------------------

TEST(AttentionCpuLoops, BranchFreeF16ConversionIsExact) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float want = f16_to_f32(uint16_t(h)), got = kernels::cpu::f16_to_f32_select(uint16_t(h));
    uint32_t wb, gb;
    std::memcpy(&wb, &want, 4);
    std::memcpy(&gb, &got, 4);
    ASSERT_EQ(gb, wb) << "f16 bits 0x" << std::hex << h;
  }
}

TEST(AttentionCpuLoops, ScoreAndAccumulateRows) {
  // Key counts around the 4-key unroll, head dims that are not a multiple of the vector width.
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (int d : {1, 7, 64})
    for (int nk : {0, 1, 3, 4, 5, 9}) {
      const size_t ud = static_cast<size_t>(d), unk = static_cast<size_t>(nk);
      std::vector<float> q(ud), keys(unk * ud), p(unk), s(unk), acc(ud), want(ud);
      for (float& x : q) x = normal(rng);
      for (float& x : keys) x = normal(rng);
      for (float& x : p) x = normal(rng);
      for (int i = 0; i < d; ++i) want[size_t(i)] = acc[size_t(i)] = normal(rng);
      kernels::cpu::score_row(q.data(), keys.data(), nk, d, s.data());
      kernels::cpu::accumulate_row(p.data(), keys.data(), nk, d, acc.data());
      for (int k = 0; k < nk; ++k) {
        double dot = 0;
        for (int i = 0; i < d; ++i) {
          dot += double(q[size_t(i)]) * keys[size_t(k * d + i)];
          want[size_t(i)] += p[size_t(k)] * keys[size_t(k * d + i)];
        }
        EXPECT_NEAR(s[size_t(k)], dot, 1e-5 * (1 + std::abs(dot))) << "d " << d << " nk " << nk;
      }
      for (int i = 0; i < d; ++i)
        EXPECT_NEAR(acc[size_t(i)], want[size_t(i)], 1e-5 * (1 + std::abs(want[size_t(i)])));
    }
}

// ---- decode -------------------------------------------------------------------------------------

// kv lengths: a single token, just under / at / over a page, and longer ragged ones.
const std::vector<int32_t> kDecodeLens = {1, 15, 16, 17, 100, 333};

TEST(AttentionCpuDecode, GqaGroups) {
  for (int32_t hkv : {8, 4, 2, 1}) {
    SCOPED_TRACE("n_kv_heads " + std::to_string(hkv));
    Workload w(make_spec(8, hkv, 64, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, 10 + hkv));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    expect_matches_reference(w, kTolF32);
  }
}

TEST(AttentionCpuDecode, HeadDimsAndPageSizes) {
  for (int32_t d : {8, 64, 128})
    for (int32_t ps : {16, 32, 64}) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", page_size " + std::to_string(ps));
      Workload w(make_spec(4, 2, d, ps, {1, ps - 1, ps + 1, 3 * ps + 5}, SIEVE_PHASE_DECODE, {},
                           uint64_t(d * 100 + ps)));
      w.request_lse();
      expect_matches_reference(w, kTolF32);
    }
}

TEST(AttentionCpuDecode, StorageDtypes) {
  for (DLDataType kv : {kBF16, kF16}) {
    SCOPED_TRACE("kv " + dtype_name(kv));
    {  // half storage, f32 queries and output: only the kernel's arithmetic differs
      WorkloadSpec s = make_spec(8, 2, 64, 16, kDecodeLens);
      s.kv_dtype = kv;
      Workload w(s);
      w.request_lse();
      w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
      expect_matches_reference(w, kTolF32);
    }
    {  // everything in the half type
      WorkloadSpec s = make_spec(8, 2, 128, 32, kDecodeLens, SIEVE_PHASE_DECODE, {}, 3);
      s.kv_dtype = s.q_dtype = s.out_dtype = kv;
      Workload w(s);
      expect_matches_reference(w, kTolHalf);
    }
  }
}

TEST(AttentionCpuDecode, SplitKvMergesByLogSumExp) {
  // One long and one short sequence: splits of the short one are mostly empty.
  for (int threads : {1, 2})
    for (int splits : {1, 3, 7}) {
      SCOPED_TRACE("threads " + std::to_string(threads) + ", splits " + std::to_string(splits));
      Workload w(make_spec(4, 1, 64, 16, {700, 5}));
      w.request_lse();
      w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
      CpuAttentionOptions opt;
      opt.threads = threads;
      opt.kv_splits = splits;
      expect_matches_reference(w, kTolF32, opt);
    }
  // Automatic: a single (sequence, KV head) with 2 threads splits on its own.
  Workload w(make_spec(8, 1, 64, 16, {2000}));
  CpuAttentionOptions opt;
  opt.threads = 2;
  expect_matches_reference(w, kTolF32, opt);
}

TEST(AttentionCpuDecode, BlockSelections) {
  for (uint32_t heads : {SIEVE_SEL_PER_SEQUENCE, SIEVE_SEL_PER_KV_HEAD, SIEVE_SEL_PER_Q_HEAD})
    for (int32_t kbp : {1, 3})
      for (double keep : {0.3, 0.7}) {
        SCOPED_TRACE("heads " + std::to_string(heads) + ", k_block_pages " + std::to_string(kbp) +
                     ", keep " + std::to_string(keep));
        Workload w(make_spec(8, 2, 64, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, heads * 10 + kbp));
        w.set_selection(heads, 1, kbp, rows_with_an_empty_one(w, heads, 1, kbp, keep, 5));
        w.request_lse();
        w.request_stats(heads == SIEVE_SEL_PER_Q_HEAD ? SIEVE_STATS_PAGE_MASS_ALL_HEADS
                                                      : SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
        expect_matches_reference(w, kTolF32);
      }
}

TEST(AttentionCpuDecode, SelectionOfEveryBlockEqualsDense) {
  Workload w(make_spec(8, 2, 64, 16, kDecodeLens));
  expect_matches_reference(w, kTolF32);
  const HostTensor dense = w.out;
  reference::SelectionRows all = w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 2, 1.0, 1);
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 2, all);
  expect_matches_reference(w, kTolF32);
  for (int64_t i = 0; i < dense.numel(); ++i) ASSERT_NEAR(w.out.get(i), dense.get(i), 1e-6);
}

TEST(AttentionCpuDecode, EverySelectionRowEmpty) {
  Workload w(make_spec(4, 2, 32, 16, {5, 40}));
  w.set_selection(SIEVE_SEL_PER_Q_HEAD, 1, 1,
                  reference::SelectionRows(size_t(w.selection_rows(SIEVE_SEL_PER_Q_HEAD, 1))));
  w.request_lse();
  w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  expect_matches_reference(w, kTolF32);
  for (int64_t i = 0; i < w.lse.numel(); ++i) EXPECT_EQ(w.lse.get(i), -INFINITY);
  for (int64_t i = 0; i < w.page_mass.numel(); ++i) EXPECT_EQ(w.page_mass.get(i), 0.f);
}

TEST(AttentionCpuDecode, QRowsSubset) {
  Workload w(make_spec(8, 4, 64, 16, {20, 1, 64, 100, 33}));
  w.set_q_rows({3, 1});
  w.request_lse();
  w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  expect_matches_reference(w, kTolF32);
  // Sequences whose query is not computed attend nothing: their pages have no mass.
  EXPECT_EQ(w.page_mass.get(0), 0.f);
  // ... and with a selection.
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1,
                  w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 1, 0.5, 9));
  expect_matches_reference(w, kTolF32);
}

TEST(AttentionCpuDecode, ExplicitScale) {
  WorkloadSpec s = make_spec(8, 2, 64, 16, kDecodeLens);
  s.scale = 0.37f;
  Workload w(s);
  w.request_lse();
  expect_matches_reference(w, kTolF32);
}

// ---- prefill ------------------------------------------------------------------------------------

// Ragged prefill: an empty sequence, one token, a chunk appended to a cached prefix (n_new <
// kv_len) and a full prompt longer than a key tile.
const std::vector<int32_t> kPrefillLens = {0, 1, 77, 130};
const std::vector<int32_t> kPrefillNew = {0, 1, 30, 130};

TEST(AttentionCpuPrefill, GqaGroupsHeadDimsPageSizes) {
  struct Geo {
    int32_t hkv, d, ps;
  };
  for (Geo g : {Geo{8, 64, 16}, Geo{4, 128, 32}, Geo{2, 8, 64}, Geo{1, 64, 32}, Geo{2, 128, 16},
                Geo{8, 8, 16}})
    for (bool blas : {true, false}) {
      SCOPED_TRACE("n_kv_heads " + std::to_string(g.hkv) + ", head_dim " + std::to_string(g.d) +
                   ", page_size " + std::to_string(g.ps) + (blas ? ", blas" : ", loops"));
      Workload w(make_spec(8, g.hkv, g.d, g.ps, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew,
                           uint64_t(g.hkv * 1000 + g.d + g.ps)));
      w.request_lse();
      CpuAttentionOptions opt;
      opt.use_blas = blas;
      expect_matches_reference(w, kTolF32, opt);
    }
}

TEST(AttentionCpuPrefill, StorageDtypes) {
  for (DLDataType kv : {kBF16, kF16}) {
    SCOPED_TRACE("kv " + dtype_name(kv));
    WorkloadSpec s = make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew);
    s.kv_dtype = kv;
    {
      Workload w(s);
      expect_matches_reference(w, kTolF32);
    }
    s.q_dtype = s.out_dtype = kv;
    Workload w(s);
    w.request_lse();
    expect_matches_reference(w, kTolHalf);
  }
}

TEST(AttentionCpuPrefill, BlockSelections) {
  for (uint32_t heads : {SIEVE_SEL_PER_SEQUENCE, SIEVE_SEL_PER_KV_HEAD, SIEVE_SEL_PER_Q_HEAD})
    for (int32_t q_block : {16, 64})
      for (int32_t kbp : {1, 2}) {
        SCOPED_TRACE("heads " + std::to_string(heads) + ", q_block " + std::to_string(q_block) +
                     ", k_block_pages " + std::to_string(kbp));
        Workload w(make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew,
                             heads * 100 + q_block + kbp));
        w.set_selection(heads, q_block, kbp,
                        rows_with_an_empty_one(w, heads, q_block, kbp, 0.5, q_block + kbp));
        w.request_lse();
        expect_matches_reference(w, kTolF32);
      }
}

TEST(AttentionCpuPrefill, QRowsLikeDeltaCorrection) {
  // Every 7th query row of each sequence plus its last, as a Δ-correction anchor pass would ask.
  Workload w(make_spec(8, 2, 64, 32, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew));
  std::vector<int32_t> rows;
  for (int32_t b = 0; b < w.batch; ++b) {
    const int32_t begin = w.qo_indptr.data<int32_t>()[b], end = w.qo_indptr.data<int32_t>()[b + 1];
    for (int32_t t = begin; t < end; ++t)
      if ((t - begin) % 7 == 0 || t == end - 1) rows.push_back(t);
  }
  w.set_q_rows(rows);
  w.request_lse();
  expect_matches_reference(w, kTolF32);
  // Sparse rows of a block selection.
  w.set_selection(SIEVE_SEL_PER_Q_HEAD, 16, 1,
                  w.random_selection_rows(SIEVE_SEL_PER_Q_HEAD, 16, 1, 0.5, 4));
  expect_matches_reference(w, kTolF32);
}

TEST(AttentionCpuPrefill, ThreadCountDoesNotChangeTheResult) {
  Workload w(make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew));
  CpuAttentionOptions one;
  one.threads = 1;
  expect_matches_reference(w, kTolF32, one);
  const HostTensor serial = w.out;
  CpuAttentionOptions two;
  two.threads = 2;
  expect_matches_reference(w, kTolF32, two);
  // Same tiles, same arithmetic per row: bit-identical whichever thread ran a tile.
  for (int64_t i = 0; i < serial.numel(); ++i)
    ASSERT_EQ(w.out.get(i), serial.get(i)) << "element " << i;
}

}  // namespace
}  // namespace sieve
