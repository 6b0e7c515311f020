// The CPU attention kernel and the f64 reference over engine page layouts (ABI 1.1 strided views):
// the same K/V laid out HND (explicit strides), NHD, and as the halves of a combined pool (NHD
// and HND inside), with V at a non-zero byte_offset in every layout, gives bit-identical outputs,
// lse and page statistics to the compact pool: the arithmetic order does not depend on where a
// row lives. Every case draws fresh random data (its own seed), ragged sequences and shuffled
// page ids with NaN in spare pages and page tails (reference::Workload), and poisons the outputs
// before each call, so a row read from the wrong place, or an output left unwritten, shows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "attention_test_cases.hpp"
#include "sieve/kernels/attention_cpu.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/page_pool.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve {
namespace {

using kernels::attend_cpu;
using kernels::CpuAttentionOptions;
using kernels::CpuIsa;
using reference::LaidOutPool;
using reference::Workload;
using reference::WorkloadSpec;
using namespace attention_test;

// The bytes of every output of one call.
struct Outputs {
  std::vector<unsigned char> out, lse, page_mass;
};
std::vector<unsigned char> bytes_of(const HostTensor& t) {
  const auto* p = t.data<unsigned char>();
  return p ? std::vector<unsigned char>(p, p + t.nbytes()) : std::vector<unsigned char>{};
}
Outputs run(Workload& w, const CpuAttentionOptions& opt) {
  w.poison_outputs();
  std::string err;
  EXPECT_EQ(attend_cpu(w.args, opt, &err), SIEVE_OK) << err;
  return {bytes_of(w.out), w.args.lse ? bytes_of(w.lse) : std::vector<unsigned char>{},
          w.args.page_mass ? bytes_of(w.page_mass) : std::vector<unsigned char>{}};
}

// Runs `w` over its compact pool, checks that against the f64 reference (so the comparison is
// with a right answer), then over each engine layout: outputs and reference bit-identical.
void expect_same_in_every_layout(Workload& w, const CpuAttentionOptions& opt = {}) {
  const sieve_paged_kv compact = w.kv;
  const Outputs want = run(w, opt);
  expect_outputs_match(w);
  const reference::RefAttention ref = reference::attend_reference(w.args);
  for (KvLayout layout : kKvLayouts) {
    SCOPED_TRACE(kv_layout_name(layout));
    LaidOutPool pool(w.k_pages.dl(), w.v_pages.dl(), layout);
    pool.install(w.kv);
    const Outputs got = run(w, opt);
    EXPECT_TRUE(got.out == want.out) << "out differs from the compact pool's";
    EXPECT_TRUE(got.lse == want.lse) << "lse differs";
    EXPECT_TRUE(got.page_mass == want.page_mass) << "page_mass differs";
    const reference::RefAttention r = reference::attend_reference(w.args);
    EXPECT_TRUE(r.out == ref.out && r.lse == ref.lse && r.page_mass == ref.page_mass)
        << "the f64 reference differs";
    w.kv = compact;
  }
}

// The paths of the CPU kernel: the SIMD decode kernel (when this CPU has one) and the portable
// loops, split-KV on and off; prefill through the SIMD tile kernel (when this CPU has one), BLAS
// tiles and the loops.
std::vector<CpuAttentionOptions> decode_paths() {
  CpuAttentionOptions simd, loops, split;
  loops.isa = CpuIsa::kPortable;
  split.kv_splits = 3;
  split.isa = CpuIsa::kPortable;
  return {simd, loops, split};
}
std::vector<CpuAttentionOptions> prefill_paths() {
  CpuAttentionOptions simd, blas, loops;
  blas.isa = loops.isa = CpuIsa::kPortable;
  loops.use_blas = false;
  return {simd, blas, loops};
}

const DLDataType kStorage[] = {kF32, kF16, kBF16};

TEST(AttentionLayouts, DenseDecodeWithStatistics) {
  uint64_t seed = 100;
  for (DLDataType kv : kStorage)
    for (const CpuAttentionOptions& opt : decode_paths()) {
      SCOPED_TRACE(dtype_name(kv) + " isa " + std::to_string(int(opt.isa)) + " splits " +
                   std::to_string(opt.kv_splits));
      Workload w(make_spec(8, 2, 64, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, ++seed, kv, kv));
      w.request_lse();
      w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
      expect_same_in_every_layout(w, opt);
    }
}

TEST(AttentionLayouts, BlockSparseDecodeEveryHeadKind) {
  uint64_t seed = 200;
  for (uint32_t heads : kSelectionHeads)
    for (const CpuAttentionOptions& opt : decode_paths()) {
      SCOPED_TRACE("heads " + std::to_string(heads));
      Workload w(make_spec(8, 2, 64, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, ++seed, kBF16, kF32));
      w.set_selection(heads, 1, 2, rows_with_an_empty_one(w, heads, 1, 2, 0.5, seed));
      w.request_lse();
      w.request_stats(heads == SIEVE_SEL_PER_Q_HEAD ? SIEVE_STATS_PAGE_MASS_ALL_HEADS
                                                    : SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
      expect_same_in_every_layout(w, opt);
    }
}

TEST(AttentionLayouts, DecodeOddShapesAndQRows) {
  // One KV head (its stride unread), page size 1 and 5, head dim 8 (no SIMD width fits some).
  Workload a(make_spec(4, 1, 8, 5, {1, 7, 23}, SIEVE_PHASE_DECODE, {}, 301, kF16, kF16));
  a.request_lse();
  expect_same_in_every_layout(a);
  Workload b(make_spec(4, 4, 16, 1, {3, 9}, SIEVE_PHASE_DECODE, {}, 302));
  b.set_q_rows({1});
  b.request_lse();
  b.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  expect_same_in_every_layout(b);
}

TEST(AttentionLayouts, DensePrefill) {
  uint64_t seed = 400;
  for (DLDataType kv : kStorage)
    for (const CpuAttentionOptions& opt : prefill_paths()) {
      SCOPED_TRACE(dtype_name(kv) + " isa " + std::to_string(int(opt.isa)) +
                   (opt.use_blas ? " blas" : " loops"));
      Workload w(make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew, ++seed,
                           kv, kF32));
      w.request_lse();
      expect_same_in_every_layout(w, opt);
    }
}

TEST(AttentionLayouts, BlockSparsePrefillAndQRows) {
  uint64_t seed = 500;
  for (uint32_t heads : kSelectionHeads)
    for (const CpuAttentionOptions& opt : prefill_paths()) {
      SCOPED_TRACE("heads " + std::to_string(heads));
      Workload w(make_spec(8, 2, 32, 8, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew, ++seed,
                           kF32, kF32));
      w.set_selection(heads, 16, 2, rows_with_an_empty_one(w, heads, 16, 2, 0.5, seed));
      w.set_q_rows(delta_anchor_rows(w));
      w.request_lse();
      expect_same_in_every_layout(w, opt);
    }
}

}  // namespace
}  // namespace sieve
