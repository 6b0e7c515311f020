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
#include <utility>
#include <vector>

#include "attention_test_cases.hpp"
#include "cpu_loops.hpp"  // the kernel's private inner loops (core/kernels/cpu)
#include "decode_rows.hpp"
#include "sieve/kernels/attention_cpu.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve {
namespace {

using kernels::attend_cpu;
using kernels::CpuAttentionOptions;
using kernels::CpuIsa;
using reference::Workload;
using reference::WorkloadSpec;

using namespace attention_test;  // case lists, the cases the CUDA kernel runs too

// Runs attend_cpu on poisoned outputs and checks every output against the f64 reference.
void expect_matches_reference(Workload& w, const CpuAttentionOptions& opt = {}) {
  w.poison_outputs();
  std::string err;
  ASSERT_EQ(attend_cpu(w.args, opt, &err), SIEVE_OK) << err;
  expect_outputs_match(w);
}
// The same with the default options, for the shared cases.
void expect_on_cpu(Workload& w) { expect_matches_reference(w); }

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
      std::vector<float> q(ud), keys(unk * ud), p(unk), s(unk), acc(ud);
      std::vector<double> want(ud);
      for (float& x : q) x = normal(rng);
      for (float& x : keys) x = normal(rng);
      for (float& x : p) x = normal(rng);
      for (int i = 0; i < d; ++i) want[size_t(i)] = acc[size_t(i)] = normal(rng);
      kernels::cpu::score_row(q.data(), keys.data(), nk, d, s.data());
      kernels::cpu::accumulate_row(p.data(), keys.data(), nk, d, acc.data());
      // f32 sums in any order (vector lanes, FMA) against f64: gamma(terms) x sum |terms|.
      std::vector<double> acc_abs(ud);
      for (int i = 0; i < d; ++i) acc_abs[size_t(i)] = std::abs(want[size_t(i)]);
      for (int k = 0; k < nk; ++k) {
        double dot = 0, dot_abs = 0;
        for (int i = 0; i < d; ++i) {
          const double qk = double(q[size_t(i)]) * keys[size_t(k * d + i)];
          const double pv = double(p[size_t(k)]) * keys[size_t(k * d + i)];
          dot += qk;
          dot_abs += std::abs(qk);
          want[size_t(i)] += pv;
          acc_abs[size_t(i)] += std::abs(pv);
        }
        EXPECT_NEAR(s[size_t(k)], dot, tolerance::gamma(d, tolerance::kF32) * dot_abs)
            << "d " << d << " nk " << nk;
      }
      for (int i = 0; i < d; ++i)
        EXPECT_NEAR(acc[size_t(i)], want[size_t(i)],
                    tolerance::gamma(nk + 1, tolerance::kF32) * acc_abs[size_t(i)]);
    }
}

// The SIMD kernels' exp within 2 ulp (the error tests/common/tolerance.hpp allows exp) over the
// arguments softmax gives it, (-87.3, 0]; 0 gives exactly 1, and -inf about 1e-38 (its weight
// then multiplies an empty state).
TEST(AttentionCpuLoops, VectorExpWithinTwoUlp) {
  using Exp = void (*)(const float*, float*, int64_t);
  const std::vector<std::pair<CpuIsa, Exp>> variants = {
#ifdef SIEVE_X86_DECODE
      {CpuIsa::kAvx512, kernels::cpu::decode_exp_avx512},
      {CpuIsa::kAvx2, kernels::cpu::decode_exp_avx2},
#endif
  };
  std::vector<float> x;
  for (float v = -87.3f; v < 0.f; v += 1.37e-4f) x.push_back(v);
  for (float v : {-1e-30f, -1e-7f, -0.5f, -0.6931472f, -87.33f, -0.f, 0.f}) x.push_back(v);
  std::vector<float> y(x.size());
  int ran = 0;
  for (auto [isa, exp] : variants) {
    if (!kernels::cpu_isa_available(isa)) continue;
    ++ran;
    exp(x.data(), y.data(), int64_t(x.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const double want = std::exp(double(x[i]));
      const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
      ASSERT_LE(std::abs(double(y[i]) - want), 2 * ulp) << "x " << x[i] << ", isa " << int(isa);
    }
    EXPECT_EQ(y.back(), 1.f);
    const float neg_inf = -INFINITY;
    float tiny = 1.f;
    exp(&neg_inf, &tiny, 1);
    // -inf is clamped to ln(FLT_MIN) = -87.3365 (decode_loop.hpp): exp of that, to the same 2 ulp.
    const double at_clamp = std::exp(double(-87.3365f));
    EXPECT_LE(std::abs(double(tiny) - at_clamp), 2 * std::ldexp(1.0, std::ilogb(at_clamp) - 23));
  }
  if (ran == 0) GTEST_SKIP() << "no SIMD exp on this CPU or build";
}

// ---- decode -------------------------------------------------------------------------------------

TEST(AttentionCpuDecode, GqaGroups) {
  for (int32_t hkv : {8, 4, 2, 1}) {
    SCOPED_TRACE("n_kv_heads " + std::to_string(hkv));
    Workload w(make_spec(8, hkv, 64, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, 10 + hkv));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    expect_matches_reference(w);
  }
}

TEST(AttentionCpuDecode, HeadDimsAndPageSizes) {
  for (int32_t d : {8, 64, 128})
    for (int32_t ps : {16, 32, 64}) {
      SCOPED_TRACE("head_dim " + std::to_string(d) + ", page_size " + std::to_string(ps));
      Workload w(make_spec(4, 2, d, ps, {1, ps - 1, ps + 1, 3 * ps + 5}, SIEVE_PHASE_DECODE, {},
                           uint64_t(d * 100 + ps)));
      w.request_lse();
      expect_matches_reference(w);
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
      expect_matches_reference(w);
    }
    {  // everything in the half type
      WorkloadSpec s = make_spec(8, 2, 128, 32, kDecodeLens, SIEVE_PHASE_DECODE, {}, 3);
      s.kv_dtype = s.q_dtype = s.out_dtype = kv;
      Workload w(s);
      expect_matches_reference(w);
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
      expect_matches_reference(w, opt);
    }
  // Automatic: a single (sequence, KV head) with 2 threads splits on its own.
  Workload w(make_spec(8, 1, 64, 16, {2000}));
  CpuAttentionOptions opt;
  opt.threads = 2;
  expect_matches_reference(w, opt);
}

// The page-mass sweep runs in (sequence, column, run of pages) items, more runs the more threads:
// a page's value is its own tokens' alone, so every split gives the same bits.
TEST(AttentionCpuDecode, PageMassIsTheSameBitsWhateverTheThreads) {
  for (sieve_stats_request stats : {SIEVE_STATS_PAGE_MASS_ALL_HEADS, SIEVE_STATS_PAGE_MASS_PER_KV_HEAD}) {
    Workload w(make_spec(8, 2, 64, 16, {1500, 37, 600}));
    w.request_stats(stats);
    CpuAttentionOptions opt;
    opt.threads = 1;
    expect_matches_reference(w, opt);
    const HostTensor serial = w.page_mass;
    for (int threads : {2, 5}) {
      SCOPED_TRACE("stats " + std::to_string(stats) + ", threads " + std::to_string(threads));
      opt.threads = threads;
      expect_matches_reference(w, opt);
      for (int64_t i = 0; i < serial.numel(); ++i) ASSERT_EQ(w.page_mass.get(i), serial.get(i)) << "page " << i;
    }
  }
}

TEST(AttentionCpuDecode, BlockSelections) { decode_block_selections(expect_on_cpu); }

TEST(AttentionCpuDecode, SelectionOfEveryBlockEqualsDense) {
  Workload w(make_spec(8, 2, 64, 16, kDecodeLens));
  expect_matches_reference(w);
  const HostTensor dense = w.out;
  reference::SelectionRows all = w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 2, 1.0, 1);
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 2, all);
  expect_matches_reference(w);
  // The same pages in the same order through the same loops: the same roundings, bit for bit.
  for (int64_t i = 0; i < dense.numel(); ++i) ASSERT_EQ(w.out.get(i), dense.get(i)) << i;
}

TEST(AttentionCpuDecode, EverySelectionRowEmpty) {
  decode_every_selection_row_empty(32, expect_on_cpu);
}

TEST(AttentionCpuDecode, QRowsSubset) { decode_q_rows_subset(expect_on_cpu); }

TEST(AttentionCpuDecode, ExplicitScale) { decode_explicit_scale(expect_on_cpu); }

// ---- decode, each instruction set forced ------------------------------------------------------
// Whichever the CPU has runs; the others are skipped with a message. A head dim its vectors do not
// divide steps down (CpuIsa), so d = 8 and 24 run the AVX2 kernel under kAvx512 and d = 12 the
// loops under both.

class AttentionCpuDecodeIsa : public testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (!kernels::cpu_isa_available(GetParam()))
      GTEST_SKIP() << "this CPU lacks " << isa_name(GetParam()) << ": its kernels not run";
  }
  CpuAttentionOptions options() const {
    CpuAttentionOptions o;
    o.isa = GetParam();
    return o;
  }
  attention_test::Expect expect() const {
    return [o = options()](Workload& w) { expect_matches_reference(w, o); };
  }

 public:
  static std::string isa_name(CpuIsa isa) {
    return isa == CpuIsa::kAvx512Bf16 ? "AVX-512 BF16"
           : isa == CpuIsa::kAvx512   ? "AVX-512"
           : isa == CpuIsa::kAvx2     ? "AVX2"
                                      : "portable";
  }
};

TEST_P(AttentionCpuDecodeIsa, GroupsHeadDimsPageSizes) {
  // Bundles of 1-8 heads (head blocks of 4 and a remainder), head dims of 1-8 vectors (odd
  // counts: a vector outside bf16's pairs) and none, pages shorter and longer than a chunk of keys
  // (chunks then span pages); f32, bf16 K/V (read in pairs of vectors, dims reordered) and bf16
  // q, K/V and output (the BF16 dot products where the CPU has them).
  struct Geo {
    int32_t hq, hkv, d, ps;
  };
  for (auto [kv, qo] : {std::pair{kF32, kF32}, std::pair{kBF16, kF32}, std::pair{kBF16, kBF16}})
    for (Geo g : {Geo{8, 8, 128, 16}, Geo{8, 4, 64, 16}, Geo{8, 2, 128, 32}, Geo{8, 1, 16, 64},
                  Geo{6, 1, 128, 5}, Geo{3, 1, 64, 1}, Geo{10, 2, 32, 3}, Geo{4, 2, 8, 16},
                  Geo{4, 1, 24, 7}, Geo{5, 1, 48, 16}, Geo{4, 2, 12, 16}}) {
      SCOPED_TRACE(std::to_string(g.hq) + "q/" + std::to_string(g.hkv) + "kv, head_dim " +
                   std::to_string(g.d) + ", page_size " + std::to_string(g.ps) + ", kv " +
                   dtype_name(kv) + ", q/out " + dtype_name(qo));
      Workload w(make_spec(g.hq, g.hkv, g.d, g.ps, kDecodeLens, SIEVE_PHASE_DECODE, {},
                           uint64_t(g.hq * 1000 + g.d * 10 + g.ps), kv, qo));
      w.request_lse();
      w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
      expect_matches_reference(w, options());
    }
}

TEST_P(AttentionCpuDecodeIsa, StorageDtypes) {
  for (DLDataType kv : {kBF16, kF16}) {
    SCOPED_TRACE("kv " + dtype_name(kv));
    Workload w(make_spec(8, 2, 128, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, 7, kv));
    w.request_lse();
    expect_matches_reference(w, options());
    Workload h(make_spec(8, 2, 64, 32, kDecodeLens, SIEVE_PHASE_DECODE, {}, 8, kv, kv));
    expect_matches_reference(h, options());
  }
}

TEST_P(AttentionCpuDecodeIsa, SplitKv) {
  for (int splits : {3, 7}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    Workload w(make_spec(4, 1, 128, 16, {700, 5}, SIEVE_PHASE_DECODE, {}, 9, kBF16));
    w.request_lse();
    CpuAttentionOptions o = options();
    o.threads = 2;
    o.kv_splits = splits;
    expect_matches_reference(w, o);
  }
}

TEST_P(AttentionCpuDecodeIsa, BlockSelections) { decode_block_selections(expect()); }
TEST_P(AttentionCpuDecodeIsa, Bf16BlockSelections) {
  // The same page lists through the bf16 kernels: a bundle per KV head and single heads.
  for (uint32_t heads : {SIEVE_SEL_PER_KV_HEAD, SIEVE_SEL_PER_Q_HEAD}) {
    SCOPED_TRACE("heads " + std::to_string(heads));
    Workload w(
        make_spec(8, 2, 128, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, 11 + heads, kBF16, kBF16));
    w.set_selection(heads, 1, 3, rows_with_an_empty_one(w, heads, 1, 3, 0.5, 6));
    w.request_lse();
    expect_matches_reference(w, options());
  }
}
TEST_P(AttentionCpuDecodeIsa, EverySelectionRowEmpty) {
  decode_every_selection_row_empty(64, expect());
}
TEST_P(AttentionCpuDecodeIsa, QRowsSubset) { decode_q_rows_subset(expect()); }
TEST_P(AttentionCpuDecodeIsa, ExplicitScale) { decode_explicit_scale(expect()); }

INSTANTIATE_TEST_SUITE_P(Isa, AttentionCpuDecodeIsa,
                         testing::Values(CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512,
                                         CpuIsa::kAvx512Bf16),
                         [](const testing::TestParamInfo<CpuIsa>& i) {
                           std::string n = AttentionCpuDecodeIsa::isa_name(i.param);
                           std::erase_if(n, [](char ch) { return ch == '-' || ch == ' '; });
                           return n;
                         });

// ---- prefill ------------------------------------------------------------------------------------

// The prefill paths: the SIMD kernel (whichever this CPU has), and with isa = portable the BLAS
// tiles and the loops.
std::vector<std::pair<std::string, CpuAttentionOptions>> prefill_paths() {
  CpuAttentionOptions simd, blas, loops;
  blas.isa = loops.isa = CpuIsa::kPortable;
  loops.use_blas = false;
  return {{"simd", simd}, {"blas", blas}, {"loops", loops}};
}

TEST(AttentionCpuPrefill, GqaGroupsHeadDimsPageSizes) {
  struct Geo {
    int32_t hkv, d, ps;
  };
  for (Geo g : {Geo{8, 64, 16}, Geo{4, 128, 32}, Geo{2, 8, 64}, Geo{1, 64, 32}, Geo{2, 128, 16},
                Geo{8, 8, 16}})
    for (const auto& [path, opt] : prefill_paths()) {
      SCOPED_TRACE("n_kv_heads " + std::to_string(g.hkv) + ", head_dim " + std::to_string(g.d) +
                   ", page_size " + std::to_string(g.ps) + ", " + path);
      Workload w(make_spec(8, g.hkv, g.d, g.ps, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew,
                           uint64_t(g.hkv * 1000 + g.d + g.ps)));
      w.request_lse();
      expect_matches_reference(w, opt);
    }
}

TEST(AttentionCpuPrefill, StorageDtypes) {
  for (DLDataType kv : {kBF16, kF16}) {
    SCOPED_TRACE("kv " + dtype_name(kv));
    WorkloadSpec s = make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew);
    s.kv_dtype = kv;
    {
      Workload w(s);
      expect_matches_reference(w);
    }
    s.q_dtype = s.out_dtype = kv;
    Workload w(s);
    w.request_lse();
    expect_matches_reference(w);
  }
}

TEST(AttentionCpuPrefill, BlockSelections) { prefill_block_selections({16, 64}, expect_on_cpu); }

TEST(AttentionCpuPrefill, QRowsLikeDeltaCorrection) {
  Workload w(make_spec(8, 2, 64, 32, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew));
  w.set_q_rows(delta_anchor_rows(w));
  w.request_lse();
  expect_matches_reference(w);
  // Sparse rows of a block selection.
  w.set_selection(SIEVE_SEL_PER_Q_HEAD, 16, 1,
                  w.random_selection_rows(SIEVE_SEL_PER_Q_HEAD, 16, 1, 0.5, 4));
  expect_matches_reference(w);
}

TEST(AttentionCpuPrefill, ThreadCountDoesNotChangeTheResult) {
  Workload w(make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew));
  CpuAttentionOptions one;
  one.threads = 1;
  expect_matches_reference(w, one);
  const HostTensor serial = w.out;
  CpuAttentionOptions two;
  two.threads = 2;
  expect_matches_reference(w, two);
  // Same tiles, same arithmetic per row: bit-identical whichever thread ran a tile.
  for (int64_t i = 0; i < serial.numel(); ++i)
    ASSERT_EQ(w.out.get(i), serial.get(i)) << "element " << i;
}

// ---- prefill, each instruction set forced -----------------------------------------------------
// The SIMD tile kernel (prefill_rows.hpp): register blocks of 4 (AVX2: 2) rows and of 2-4 key /
// dim vectors with their remainders, key tiles padded to 16 and cut by the causal diagonal, row
// tiles of at most 256 rows (130 new tokens x 8 heads: five), every head bundle of a GQA group.

class AttentionCpuPrefillIsa : public AttentionCpuDecodeIsa {};

TEST_P(AttentionCpuPrefillIsa, GroupsHeadDimsPageSizes) {
  struct Geo {
    int32_t hq, hkv, d, ps;
  };
  // Groups 1-8 (3: rows not a multiple of the row block), head dims of 1-8 vectors, pages
  // shorter than, equal to and longer than a key tile.
  for (Geo g : {Geo{8, 8, 64, 16}, Geo{6, 2, 48, 8}, Geo{8, 2, 128, 64}, Geo{8, 1, 24, 16},
                Geo{4, 4, 8, 128}, Geo{16, 2, 80, 16}})
    for (DLDataType kv : {kF32, kBF16}) {
      SCOPED_TRACE(std::to_string(g.hq) + "q/" + std::to_string(g.hkv) + "kv, head_dim " +
                   std::to_string(g.d) + ", page_size " + std::to_string(g.ps) + ", kv " +
                   dtype_name(kv));
      Workload w(make_spec(g.hq, g.hkv, g.d, g.ps, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew,
                           uint64_t(g.hq * 100 + g.d + g.ps), kv, kv));
      w.request_lse();
      expect_matches_reference(w, options());
    }
}

TEST_P(AttentionCpuPrefillIsa, StorageDtypes) {
  for (DLDataType kv : {kF16, kBF16}) {
    SCOPED_TRACE("kv " + dtype_name(kv));
    WorkloadSpec s = make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew, 41);
    s.kv_dtype = kv;
    Workload w(s);
    w.request_lse();
    expect_matches_reference(w, options());
  }
}

TEST_P(AttentionCpuPrefillIsa, BlockSelections) { prefill_block_selections({16, 64}, expect()); }

TEST_P(AttentionCpuPrefillIsa, QRowsLikeDeltaCorrection) {
  Workload w(make_spec(8, 2, 64, 32, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew, 43));
  w.set_q_rows(delta_anchor_rows(w));
  w.request_lse();
  expect_matches_reference(w, options());
  w.set_selection(SIEVE_SEL_PER_Q_HEAD, 16, 1,
                  w.random_selection_rows(SIEVE_SEL_PER_Q_HEAD, 16, 1, 0.5, 4));
  expect_matches_reference(w, options());
}

TEST_P(AttentionCpuPrefillIsa, EverySelectionRowEmpty) {
  // Rows that attend nothing: output exactly 0 and lse -inf (expect_outputs_match).
  Workload w(make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew, 44));
  reference::SelectionRows rows = w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 16, 1, 0.5, 5);
  for (auto& r : rows) r.clear();
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 16, 1, rows);
  w.request_lse();
  expect_matches_reference(w, options());
}

INSTANTIATE_TEST_SUITE_P(Isa, AttentionCpuPrefillIsa,
                         testing::Values(CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const testing::TestParamInfo<CpuIsa>& i) {
                           std::string n = AttentionCpuDecodeIsa::isa_name(i.param);
                           std::erase_if(n, [](char ch) { return ch == '-' || ch == ' '; });
                           return n;
                         });

}  // namespace
}  // namespace sieve
