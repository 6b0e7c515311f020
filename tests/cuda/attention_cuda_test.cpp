// The CUDA attention kernel's FMA paths against the f64 reference: decode (row kernel, GQA chunks,
// split-KV) and causal prefill (tiled kernel), head dims 8/64/128, page sizes 16/32/64, ragged
// sequences and last pages, f32/f16/bf16 storage, block selections of every head kind (empty rows,
// k_block_pages > 1), q_rows, lse and page statistics; the device-side content checks; argument
// refusals; and that a call can be captured in a CUDA graph (so it never synchronises). The
// tensor-core kernels get the same checks in attention_cuda_tensor_core_test.cpp.
// Every call runs on NaN-poisoned device outputs: rows that should be written must be, rows that
// should not must still hold NaN. The K/V pools hold NaN in spare pages and past each sequence's
// last token (reference::Workload), so reading a key the kernel must not read shows up as NaN.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../kernels/attention_test_cases.hpp"
#include "attention_cuda_fixture.hpp"
#include "cuda_test_util.hpp"
#include "device_call.hpp"
#include "sieve/kernels/attention_cuda.hpp"
#include "sieve/kernels/attention_cuda_checks.hpp"
#include "sieve/reference/page_pool.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve {
namespace {

using cuda_test::DeviceCall;
using kernels::CudaAttentionOptions;
using reference::Workload;

using namespace attention_test;  // tolerances, case lists, the cases the CPU kernel runs too
using cuda_test::AttentionCuda;
using cuda_test::dt;

// ---- decode -------------------------------------------------------------------------------------

TEST_F(AttentionCuda, DecodeGqaGroups) {
  // Groups 1/2/4/8, plus 3 (odd), 16 (more heads than one CTA takes: chunked).
  struct G {
    int32_t hq, hkv;
  };
  for (G g : {G{8, 8}, G{8, 4}, G{8, 2}, G{8, 1}, G{6, 2}, G{16, 1}})
    for (DLDataType kv : {kF32, kBF16}) {
      SCOPED_TRACE("hq " + std::to_string(g.hq) + ", hkv " + std::to_string(g.hkv) + ", kv " + dt(kv));
      Workload w(make_spec(g.hq, g.hkv, 128, 16, kDecodeLens, SIEVE_PHASE_DECODE, {},
                           uint64_t(10 + g.hq * 3 + g.hkv), kv));
      w.request_lse();
      w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
      expect_matches_reference(w);
    }
}

TEST_F(AttentionCuda, DecodeHeadDimsPageSizesDtypes) {
  for (int32_t d : {8, 64, 128})
    for (int32_t ps : {16, 32, 64})
      for (DLDataType kv : {kF32, kF16, kBF16}) {
        SCOPED_TRACE("head_dim " + std::to_string(d) + ", page_size " + std::to_string(ps) + ", " + dt(kv));
        // Half storage with half queries and output; f32 storage all f32 (q and out take kv's dtype).
        Workload w(make_spec(8, 2, d, ps, {1, ps - 1, ps + 1, 3 * ps + 5}, SIEVE_PHASE_DECODE, {},
                             uint64_t(d * 100 + ps + kv.code), kv, kv));
        w.request_lse();
        expect_matches_reference(w);
      }
}

TEST_F(AttentionCuda, DecodeHalfStorageF32Queries) {
  // Only the storage is half: the kernel's arithmetic is f32, so f32 accuracy holds.
  for (DLDataType kv : {kBF16, kF16}) {
    SCOPED_TRACE(dt(kv));
    Workload w(make_spec(8, 2, 64, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, 7, kv));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
    expect_matches_reference(w);
  }
}

TEST_F(AttentionCuda, DecodeBlockSelections) { decode_block_selections(expect_on_device()); }

TEST_F(AttentionCuda, DecodeEverySelectionRowEmpty) {
  decode_every_selection_row_empty(64, expect_on_device());
}

TEST_F(AttentionCuda, DecodeSplitKvForced) {
  // One long and one short sequence: most splits of the short one are empty.
  for (int splits : {1, 3, 7, 64}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    Workload w(make_spec(8, 2, 64, 16, {700, 5}, SIEVE_PHASE_DECODE, {}, uint64_t(splits)));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    CudaAttentionOptions opt;
    opt.kv_splits = splits;
    ASSERT_EQ(splits_for(w, opt), splits);
    expect_matches_reference(w, opt);
    // ... and over a block selection (split by selected blocks).
    w.set_selection(SIEVE_SEL_PER_Q_HEAD, 1, 2, w.random_selection_rows(SIEVE_SEL_PER_Q_HEAD, 1, 2, 0.4, 3));
    expect_matches_reference(w, opt);
  }
}

TEST_F(AttentionCuda, DecodeLongContextSplitsAutomatically) {
  // Batch 1 at 20K tokens: too few CTAs without splitting, so the heuristic splits.
  for (DLDataType kv : {kF32, kBF16}) {
    SCOPED_TRACE(dt(kv));
    Workload w(make_spec(8, 2, 128, 16, {20000}, SIEVE_PHASE_DECODE, {}, 20, kv));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    ASSERT_GT(splits_for(w, {}), 1);
    expect_matches_reference(w);
  }
}

TEST_F(AttentionCuda, DecodeQRowsSubset) { decode_q_rows_subset(expect_on_device()); }

TEST_F(AttentionCuda, DecodeExplicitScale) { decode_explicit_scale(expect_on_device()); }

// ---- prefill ------------------------------------------------------------------------------------

TEST_F(AttentionCuda, PrefillGqaHeadDimsPageSizes) {
  struct Geo {
    int32_t hkv, d, ps;
  };
  for (Geo g : {Geo{8, 64, 16}, Geo{4, 128, 32}, Geo{2, 8, 64}, Geo{1, 64, 32}, Geo{2, 128, 16},
                Geo{8, 8, 16}, Geo{1, 128, 64}})
    for (DLDataType kv : {kF32, kBF16, kF16}) {
      SCOPED_TRACE("n_kv_heads " + std::to_string(g.hkv) + ", head_dim " + std::to_string(g.d) +
                   ", page_size " + std::to_string(g.ps) + ", " + dt(kv));
      Workload w(make_spec(8, g.hkv, g.d, g.ps, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew,
                           uint64_t(g.hkv * 1000 + g.d + g.ps + kv.code), kv, kv));
      w.request_lse();
      expect_matches_reference(w);
    }
}

TEST_F(AttentionCuda, PrefillHalfStorageF32Queries) {
  for (DLDataType kv : {kBF16, kF16}) {
    SCOPED_TRACE(dt(kv));
    Workload w(make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew, 5, kv));
    w.request_lse();
    expect_matches_reference(w);
  }
}

TEST_F(AttentionCuda, PrefillBlockSelections) {
  prefill_block_selections({1, 16, 50}, expect_on_device());
}

TEST_F(AttentionCuda, PrefillQRowsLikeDeltaCorrection) {
  Workload w(make_spec(8, 2, 64, 32, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew));
  w.set_q_rows(delta_anchor_rows(w));
  w.request_lse();
  expect_matches_reference(w);
  // ... rows of a block selection with q_block > 1 (the row kernel finds each row's query block),
  // split over KV.
  w.set_selection(SIEVE_SEL_PER_Q_HEAD, 16, 1, w.random_selection_rows(SIEVE_SEL_PER_Q_HEAD, 16, 1, 0.5, 4));
  CudaAttentionOptions opt;
  opt.kv_splits = 3;
  expect_matches_reference(w, opt);
}

TEST_F(AttentionCuda, PageSizesThatAreNotPowersOfTwo) {
  // The attention ABI takes any page size (the stores use 16/32/64): the kernels divide instead
  // of shifting, and a 200-token page gives the statistics pass several tokens per thread.
  for (int32_t ps : {24, 200}) {
    SCOPED_TRACE("page_size " + std::to_string(ps));
    Workload w(make_spec(8, 2, 64, ps, {1, ps - 1, 2 * ps + 3, 5 * ps}, SIEVE_PHASE_DECODE, {}, uint64_t(ps)));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
    expect_matches_reference(w);
    w.set_selection(SIEVE_SEL_PER_Q_HEAD, 1, 2, w.random_selection_rows(SIEVE_SEL_PER_Q_HEAD, 1, 2, 0.5, 2));
    expect_matches_reference(w);
    Workload pf(make_spec(8, 2, 64, ps, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew, uint64_t(ps) + 1));
    pf.request_lse();
    expect_matches_reference(pf);
  }
}

// ---- bad contents found on the device, refusals, graph capture -------------------------------

TEST_F(AttentionCuda, OutOfRangeSelectionIsSkippedAndReported) {
  Workload w(make_spec(8, 2, 64, 16, {40, 100}));
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 1, 1.0, 1));
  // Row 2 (sequence 1, KV head 0) lists all 7 blocks; make its third one 1000.
  const int32_t e = w.sel_indptr.data<int32_t>()[2] + 2;
  w.sel_indices.data<int32_t>()[e] = 1000;
  DeviceCall call(w);
  std::string err;
  ASSERT_EQ(call.run(stream_, {}, &err), SIEVE_OK) << err;  // the host cannot see device contents
  ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err, testing::HasSubstr("selection row 2: key block 1000"));
  for (int64_t i = 0; i < w.out.numel(); ++i) ASSERT_TRUE(std::isfinite(w.out.get(i))) << i;
  // Read and cleared: the next check is clean.
  EXPECT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_OK) << err;
}

TEST_F(AttentionCuda, BadPageIdAndQRowAreReported) {
  {
    Workload w(make_spec(4, 2, 64, 16, {40}));
    w.kv_indices.data<int32_t>()[1] = 1 << 20;  // beyond the pool
    DeviceCall call(w);
    std::string err;
    ASSERT_EQ(call.run(stream_, {}, &err), SIEVE_OK) << err;
    ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(err, testing::HasSubstr("physical page 1048576 (sequence 0, logical page 1)"));
  }
  {
    Workload w(make_spec(4, 2, 64, 16, {40, 12}));
    w.set_q_rows({1, 7});
    DeviceCall call(w);
    std::string err;
    ASSERT_EQ(call.run(stream_, {}, &err), SIEVE_OK) << err;
    ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(err, testing::HasSubstr("q_rows[1]: query token 7"));
  }
}

TEST_F(AttentionCuda, Refusals) {
  std::string err;
  {  // host tensors
    Workload w(make_spec(4, 2, 64, 16, {40}));
    EXPECT_EQ(kernels::attend_cuda(w.args, stream_, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(err, testing::HasSubstr("needs every tensor on a CUDA device"));
  }
  {  // a head dim the kernels are not built for
    Workload w(make_spec(4, 2, 32, 16, {40}));
    DeviceCall call(w);
    EXPECT_EQ(kernels::attend_cuda(call.args, stream_, &err), SIEVE_ERR_UNSUPPORTED);
    EXPECT_THAT(err, testing::HasSubstr("head_dim: 32"));
  }
  {  // malformed arguments go through the shared checker
    Workload w(make_spec(4, 2, 64, 16, {40}));
    DeviceCall call(w);
    call.args.n_kv_heads = 3;
    EXPECT_EQ(kernels::attend_cuda(call.args, stream_, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(err, testing::HasSubstr("n_kv_heads"));
  }
  {  // a negative count of Hopper CTAs
    Workload w(make_spec(4, 2, 64, 16, {40}, SIEVE_PHASE_PREFILL));
    DeviceCall call(w);
    kernels::CudaAttentionOptions opt;
    opt.hopper_ctas = -1;
    EXPECT_EQ(kernels::attend_cuda(call.args, opt, stream_, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(err, testing::HasSubstr("options.hopper_ctas: -1"));
  }
  {  // prefill statistics are not in v1
    Workload w(make_spec(4, 2, 64, 16, {40}, SIEVE_PHASE_PREFILL));
    w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    DeviceCall call(w);
    EXPECT_EQ(kernels::attend_cuda(call.args, stream_, &err), SIEVE_ERR_UNSUPPORTED);
  }
}

TEST_F(AttentionCuda, CapturesIntoACudaGraph) {
  // Stream capture refuses any synchronisation (and device-wide allocation) inside the captured
  // region, so a capture that succeeds shows attend_cuda only enqueues work. Split-KV and
  // statistics without lse use pool scratch, which must be capturable too.
  Workload w(make_spec(8, 2, 64, 16, {3000, 40}));
  w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
  DeviceCall call(w);
  CudaAttentionOptions opt;
  opt.kv_splits = 5;
  std::string err;
  ASSERT_EQ(call.run(stream_, opt, &err), SIEVE_OK) << err;  // first use sets the device up
  ASSERT_NO_FATAL_FAILURE(call.run_captured(stream_, opt, &err));
  expect_outputs_match(w);
}

// Rows the kernels cannot load as 16-byte vectors are refused with one line, nothing written.
TEST_F(AttentionCuda, MisalignedPageRowsAreRefused) {
  Workload w(make_spec(8, 2, 64, 16, {40}, SIEVE_PHASE_DECODE, {}, 907, kBF16));
  reference::LaidOutPool pool(w.k_pages.dl(), w.v_pages.dl(), kKvLayouts[1]);
  DeviceCall call(w, &pool);
  call.kv().v_pages.byte_offset += 2;  // one bf16 element: a whole element, but rows off 16-byte boundaries
  std::string err;
  EXPECT_EQ(call.run(stream_, {}, &err), SIEVE_ERR_UNSUPPORTED);
  EXPECT_THAT(err, ::testing::StartsWith("kv.v_pages: data + byte_offset is not 16-byte aligned"));
  for (int64_t i = 0; i < w.out.numel(); ++i) ASSERT_TRUE(std::isnan(w.out.get(i)));
}

}  // namespace
}  // namespace sieve
