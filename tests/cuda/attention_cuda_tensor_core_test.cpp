// The CUDA attention kernel's tensor-core paths (q and K/V in one 16-bit dtype, head_dim 64/128)
// against the f64 reference: which kernel the plan picks, decode on the mma.sync row kernel (GQA
// groups, page sizes, selections, split-KV sizing and merging), the tiled prefill (mma.sync and,
// where built and present, Hopper's wgmma), q_rows, bad entries, CUDA graph capture, and engine
// page layouts giving bit-identical outputs. The FMA kernels are in attention_cuda_test.cpp.
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
using reference::WorkloadSpec;

using namespace attention_test;  // tolerances, case lists, the cases the CPU kernel runs too
using cuda_test::AttentionCuda;
using cuda_test::dt;

// ---- tensor-core kernels (q and K/V in one 16-bit dtype, head_dim 64/128) -------------------
// The same checks against the f64 reference, on the mma.sync paths: the row kernel (decode,
// q_rows) and the tiled prefill. Each case first asserts which kernel the plan picks, so a test
// cannot silently pass on the FMA kernels.

class AttentionCudaTensorCores : public AttentionCuda {
 protected:
  // The plan attend_cuda makes for the device copy of `w`.
  kernels::CudaAttentionPlan plan_for(Workload& w, const CudaAttentionOptions& opt = {}) {
    DeviceCall call(w);
    std::string err;
    kernels::CudaAttentionPlan plan;
    EXPECT_EQ(kernels::cuda_attention_plan(call.args, opt, &plan, &err), SIEVE_OK) << err;
    return plan;
  }
  // Asserts the kernel family, then runs the reference comparison.
  void expect_on_kernel(Workload& w, const std::string& kernel, const CudaAttentionOptions& opt = {}) {
    ASSERT_EQ(plan_for(w, opt).kernel, kernel);
    expect_matches_reference(w, opt);
  }
};

// The tiled tensor-core prefill kernel attend_cuda picks for head_dim d and page size ps: the
// Hopper one (wgmma + TMA) where this build has it (SIEVE_CUDA_HOPPER), device 0 is compute
// capability 9.0, the options allow it and the shape fits; else the mma.sync one. Stated here
// independently of the library's own check, so a wrong choice there fails the tests.
std::string prefill_tc_kernel(int32_t d, int32_t ps, const CudaAttentionOptions& opt = {}) {
#if SIEVE_CUDA_HOPPER
  int major = 0, minor = 0;
  const bool sm90 = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess &&
                    major == 9 && minor == 0;
  if (opt.hopper && sm90 && d == 128 && ps >= 8 && ps <= 128 && 128 % ps == 0) return "prefill-wgmma";
#else
  (void)d, (void)ps, (void)opt;
#endif
  return "prefill-mma";
}

// A half workload: q, K/V and out all of `dt`.
WorkloadSpec half_spec(int32_t hq, int32_t hkv, int32_t d, int32_t ps, std::vector<int32_t> lens, DLDataType dt,
                       uint64_t seed, sieve_phase phase = SIEVE_PHASE_DECODE, std::vector<int32_t> n_new = {}) {
  return make_spec(hq, hkv, d, ps, std::move(lens), phase, std::move(n_new), seed, dt, dt);
}

TEST_F(AttentionCudaTensorCores, PathSelection) {
  struct P {
    DLDataType q, kv;
    int32_t d;
    bool tc;
    const char* row;
    const char* prefill;
  };
  for (P c : {P{kBF16, kBF16, 128, true, "row-mma", "prefill-mma"}, P{kF16, kF16, 64, true, "row-mma", "prefill-mma"},
              P{kF32, kBF16, 128, true, "row-fma", "prefill-fma"}, P{kBF16, kF16, 128, true, "row-fma", "prefill-fma"},
              P{kBF16, kBF16, 8, true, "row-fma", "prefill-fma"}, P{kBF16, kBF16, 128, false, "row-fma", "prefill-fma"},
              P{kF32, kF32, 128, true, "row-fma", "prefill-fma"}}) {
    SCOPED_TRACE("q " + dt(c.q) + ", kv " + dt(c.kv) + ", d " + std::to_string(c.d) + (c.tc ? "" : ", tensor_cores off"));
    CudaAttentionOptions opt;
    opt.tensor_cores = c.tc;
    Workload dec(make_spec(8, 2, c.d, 16, {40}, SIEVE_PHASE_DECODE, {}, 1, c.kv, c.q));
    EXPECT_EQ(plan_for(dec, opt).kernel, std::string(c.row));
    Workload pf(make_spec(8, 2, c.d, 16, {40}, SIEVE_PHASE_PREFILL, {}, 1, c.kv, c.q));
    const std::string prefill = c.prefill == std::string("prefill-mma") ? prefill_tc_kernel(c.d, 16) : c.prefill;
    EXPECT_EQ(plan_for(pf, opt).kernel, prefill);
    CudaAttentionOptions no_hopper = opt;
    no_hopper.hopper = false;
    EXPECT_EQ(plan_for(pf, no_hopper).kernel, std::string(c.prefill));
    pf.set_q_rows({0, 39});  // prefill rows listed in q_rows take the row kernel
    EXPECT_EQ(plan_for(pf, opt).kernel, std::string(c.row));
  }
}

TEST_F(AttentionCudaTensorCores, DecodeGqaGroupsHeadDimsDtypes) {
  // Groups 1, 2, 3, 4, 8, 16 (one CTA's 16 MMA rows) and 32 (two CTAs per KV head).
  struct G {
    int32_t hq, hkv;
  };
  for (G g : {G{8, 8}, G{8, 4}, G{6, 2}, G{8, 2}, G{8, 1}, G{16, 1}, G{32, 1}})
    for (int32_t d : {64, 128})
      for (DLDataType t : {kBF16, kF16}) {
        SCOPED_TRACE("hq " + std::to_string(g.hq) + ", hkv " + std::to_string(g.hkv) + ", d " + std::to_string(d) + ", " + dt(t));
        Workload w(half_spec(g.hq, g.hkv, d, 16, kDecodeLens, t, uint64_t(g.hq * 7 + g.hkv + d)));
        w.request_lse();
        w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
        expect_on_kernel(w, "row-mma");
      }
}

TEST_F(AttentionCudaTensorCores, DecodePageSizes) {
  // The stores' page sizes, and sizes that are not powers of two (a tile then straddles pages).
  for (int32_t ps : {8, 16, 32, 64, 24, 200}) {
    SCOPED_TRACE("page_size " + std::to_string(ps));
    Workload w(half_spec(8, 2, 128, ps, {1, ps - 1, ps + 1, 3 * ps + 5, 700}, kBF16, uint64_t(ps)));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
    expect_on_kernel(w, "row-mma");
    w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 2, rows_with_an_empty_one(w, SIEVE_SEL_PER_KV_HEAD, 1, 2, 0.5, 3));
    expect_on_kernel(w, "row-mma");
  }
}

TEST_F(AttentionCudaTensorCores, DecodeBlockSelections) {
  for (uint32_t heads : kSelectionHeads)
    for (int32_t kbp : {1, 3})
      for (double keep : {0.3, 0.7}) {
        SCOPED_TRACE("heads " + std::to_string(heads) + ", k_block_pages " + std::to_string(kbp) + ", keep " +
                     std::to_string(keep));
        Workload w(half_spec(8, 2, 128, 16, kDecodeLens, kBF16, heads * 10 + kbp));
        w.set_selection(heads, 1, kbp, rows_with_an_empty_one(w, heads, 1, kbp, keep, 5));
        w.request_lse();
        w.request_stats(heads == SIEVE_SEL_PER_Q_HEAD ? SIEVE_STATS_PAGE_MASS_ALL_HEADS
                                                      : SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
        expect_on_kernel(w, "row-mma");
      }
}

TEST_F(AttentionCudaTensorCores, DecodeSplitsFollowTheSelectedKeys) {
  // One long sequence: the automatic split count comes from its dense length; a sparse row uses
  // only the splits its selected keys need (the others hold empty states the combine skips).
  for (double keep : {1.0, 0.3, 0.05}) {
    SCOPED_TRACE("keep " + std::to_string(keep));
    Workload w(half_spec(8, 2, 128, 16, {20000, 3}, kBF16, uint64_t(keep * 100)));
    if (keep < 1) w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 1, keep, 8));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    const kernels::CudaAttentionPlan plan = plan_for(w);
    EXPECT_GT(plan.kv_splits, 1);
    EXPECT_EQ(plan.heads_per_cta, 4);
    expect_on_kernel(w, "row-mma");
    CudaAttentionOptions fine;  // many short splits: every tile boundary case
    fine.split_min_keys = 64;
    expect_on_kernel(w, "row-mma", fine);
  }
}

TEST_F(AttentionCudaTensorCores, DecodeSplitKvForced) {
  // Up to 8 splits merge on a thread-block cluster on sm_90 (distributed shared memory; this
  // grid's 4 clusters are always resident at once), more in the combine kernel; 2 and 8 are the
  // cluster's edges, 9 the first split count past them.
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
  for (int splits : {1, 2, 3, 7, 8, 9, 64}) {
    SCOPED_TRACE("splits " + std::to_string(splits));
    Workload w(half_spec(8, 2, 64, 16, {700, 5}, kF16, uint64_t(splits)));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    CudaAttentionOptions opt;
    opt.kv_splits = splits;
    ASSERT_EQ(splits_for(w, opt), splits);
    const std::string merge = splits == 1 ? "none" : major >= 9 && splits <= 8 ? "cluster" : "combine";
    EXPECT_EQ(plan_for(w, opt).merge, merge);
    expect_on_kernel(w, "row-mma", opt);
    w.set_selection(SIEVE_SEL_PER_Q_HEAD, 1, 2, w.random_selection_rows(SIEVE_SEL_PER_Q_HEAD, 1, 2, 0.4, 3));
    expect_on_kernel(w, "row-mma", opt);
  }
}

TEST_F(AttentionCudaTensorCores, DecodeQRowsAndEmptyRows) {
  Workload w(half_spec(8, 4, 64, 16, {20, 1, 64, 100, 33}, kBF16, 4));
  w.set_q_rows({3, 1});
  w.request_lse();
  w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  expect_on_kernel(w, "row-mma");
  EXPECT_EQ(w.page_mass.get(0), 0.f);  // sequence 0 is not computed
  w.clear_q_rows();
  w.set_selection(SIEVE_SEL_PER_Q_HEAD, 1, 1, reference::SelectionRows(size_t(w.selection_rows(SIEVE_SEL_PER_Q_HEAD, 1))));
  expect_on_kernel(w, "row-mma");
  for (int64_t i = 0; i < w.lse.numel(); ++i) EXPECT_EQ(w.lse.get(i), -INFINITY);
}

TEST_F(AttentionCudaTensorCores, DecodeRaggedBatchWithIdleSplits) {
  // 16 ragged sequences of ~3K keys and one of 7: the automatic plan takes 2..8 splits; sparse and
  // short rows leave some of them idle (empty states the combine skips). Also through a CUDA graph,
  // as an engine would replay it.
  std::vector<int32_t> lens;
  for (int32_t b = 0; b < 16; ++b) lens.push_back(b == 5 ? 7 : 2600 + 37 * b);
  for (double keep : {1.0, 0.3, 0.05}) {
    SCOPED_TRACE("keep " + std::to_string(keep));
    Workload w(half_spec(8, 2, 128, 16, lens, kBF16, uint64_t(keep * 1000) + 11));
    if (keep < 1) w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, rows_with_an_empty_one(w, SIEVE_SEL_PER_KV_HEAD, 1, 1, keep, 12));
    w.request_lse();
    w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    const kernels::CudaAttentionPlan plan = plan_for(w);
    EXPECT_GE(plan.kv_splits, 2);
    EXPECT_LE(plan.kv_splits, 8);
    expect_on_kernel(w, "row-mma");

    DeviceCall call(w);
    std::string err;
    ASSERT_NO_FATAL_FAILURE(call.run_captured(stream_, {}, &err));
    ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_OK) << err;
    expect_outputs_match(w);
  }
}

TEST_F(AttentionCudaTensorCores, DecodeSplitSizingLongAndRagged) {
  // Batch 1 at a long context (Llama-3-8B's 32q/8kv): 8 (row, KV head) CTAs alone would leave most
  // SMs idle, so the plan splits the keys over many CTAs; then a ragged batch where one sequence
  // holds a single key and others are shorter than one split, next to a long one that sets the
  // split count (their extra splits hold empty states). Dense and 90%-sparse, lse checked too.
  struct C {
    std::vector<int32_t> lens;
    int min_splits;
  };
  for (const C& c : {C{{40000}, 16}, C{{1, 17, 250, 30000}, 2}, C{{30000, 1}, 2}})
    for (double keep : {1.0, 0.1}) {
      SCOPED_TRACE("sequences " + std::to_string(c.lens.size()) + ", keep " + std::to_string(keep));
      Workload w(half_spec(32, 8, 128, 16, c.lens, kBF16, uint64_t(c.lens.size() * 100 + keep * 10)));
      if (keep < 1) w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 4, w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 4, keep, 21));
      w.request_lse();
      EXPECT_GE(plan_for(w).kv_splits, c.min_splits);
      expect_on_kernel(w, "row-mma");
    }
}

TEST_F(AttentionCudaTensorCores, DecodeSplitCrossesSlotChunks) {
  // One split over ~20K keys: its page ids are resolved in chunks of 510 pages (63 tiles at page 8,
  // 127 at page 16, 1593 at 200), so the split crosses several chunk boundaries mid-stream; dense
  // and over a 50% block selection.
  for (int32_t ps : {8, 16, 200})
    for (double keep : {1.0, 0.5}) {
      SCOPED_TRACE("page_size " + std::to_string(ps) + ", keep " + std::to_string(keep));
      Workload w(half_spec(8, 2, 128, ps, {20011, 70}, kBF16, uint64_t(ps * 10 + keep * 2)));
      if (keep < 1) w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 1, keep, 31));
      w.request_lse();
      CudaAttentionOptions one;
      one.kv_splits = 1;
      expect_on_kernel(w, "row-mma", one);
      CudaAttentionOptions three;
      three.kv_splits = 3;
      expect_on_kernel(w, "row-mma", three);
    }
}

// Longer prompts than the FMA cases: several 64-key tiles and 128-row query tiles per sequence.
const std::vector<int32_t> kLongPrefillLens = {0, 1, 77, 130, 300};
const std::vector<int32_t> kLongPrefillNew = {0, 1, 30, 130, 300};

// Groups 1-32; group 24 (16 heads per CTA: a second head unit of 8) leaves a CTA's last rows to
// heads outside its unit, which must not be stored.
TEST_F(AttentionCudaTensorCores, PrefillGqaHeadDimsPageSizes) {
  struct Geo {
    int32_t hq, hkv, d, ps;
  };
  for (Geo g : {Geo{8, 8, 64, 16}, Geo{8, 4, 128, 32}, Geo{8, 1, 64, 32}, Geo{8, 2, 128, 16}, Geo{16, 1, 128, 64},
                Geo{32, 1, 64, 16}, Geo{6, 2, 128, 24}, Geo{8, 2, 64, 8}, Geo{24, 1, 128, 16}})
    for (DLDataType t : {kBF16, kF16}) {
      SCOPED_TRACE("hq " + std::to_string(g.hq) + ", hkv " + std::to_string(g.hkv) + ", d " + std::to_string(g.d) +
                   ", page_size " + std::to_string(g.ps) + ", " + dt(t));
      Workload w(half_spec(g.hq, g.hkv, g.d, g.ps, kLongPrefillLens, t, uint64_t(g.hq * 100 + g.hkv * 10 + g.d + g.ps),
                           SIEVE_PHASE_PREFILL, kLongPrefillNew));
      w.request_lse();
      expect_on_kernel(w, prefill_tc_kernel(g.d, g.ps));
      // The mma.sync kernel stays the fallback: on Hopper builds it is checked here too.
      CudaAttentionOptions mma_sync;
      mma_sync.hopper = false;
      if (prefill_tc_kernel(g.d, g.ps) != "prefill-mma") expect_on_kernel(w, "prefill-mma", mma_sync);
    }
}

TEST_F(AttentionCudaTensorCores, PrefillBlockSelections) {
  for (uint32_t heads : kSelectionHeads)
    for (int32_t q_block : {1, 16, 50, 128})
      for (int32_t kbp : {1, 2, 4}) {
        SCOPED_TRACE("heads " + std::to_string(heads) + ", q_block " + std::to_string(q_block) + ", k_block_pages " +
                     std::to_string(kbp));
        Workload w(half_spec(8, 2, 128, 16, kLongPrefillLens, kBF16, heads * 1000 + q_block * 10 + kbp,
                             SIEVE_PHASE_PREFILL, kLongPrefillNew));
        w.set_selection(heads, q_block, kbp, rows_with_an_empty_one(w, heads, q_block, kbp, 0.5, q_block + kbp));
        w.request_lse();
        expect_on_kernel(w, prefill_tc_kernel(128, 16));
      }
}

// Long prompts: many key tiles per CTA, so a pipelined kernel reuses every shared-memory stage
// many times (the Hopper kernel's mbarrier phases wrap), ragged last pages (2100 = 131 x 16 + 4),
// a prompt appended to earlier context, and a selection over the long rows.
// Many key tiles per query tile (the rings wrap) and, on Hopper, 1 and 3 persistent CTAs walking
// every query tile of both sequences (the hand-over of rings, Q buffers and MMA turns between
// tiles, dense and with block selections of uneven lengths), besides the default one per SM; bf16
// only for those (each case costs seconds of f64 reference).
TEST_F(AttentionCudaTensorCores, PrefillLongPromptsManyTiles) {
  for (DLDataType t : {kBF16, kF16})
    for (int ctas : {0, 1, 3}) {
      if (ctas != 0 && t.code != kBF16.code) continue;
      SCOPED_TRACE(dt(t) + ", hopper_ctas " + std::to_string(ctas));
      CudaAttentionOptions opt;
      opt.hopper_ctas = ctas;
      Workload w(half_spec(8, 2, 128, 16, {2100, 1500}, t, 21, SIEVE_PHASE_PREFILL, {2100, 700}));
      w.request_lse();
      expect_on_kernel(w, prefill_tc_kernel(128, 16), opt);
      w.set_selection(SIEVE_SEL_PER_KV_HEAD, 128, 4, w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 128, 4, 0.5, 5));
      expect_on_kernel(w, prefill_tc_kernel(128, 16), opt);
    }
}

// The Hopper kernel takes each row's maximum before scaling, which is right for positive scales
// only: a negative one must run (correctly) on the mma.sync kernel, a positive one on Hopper's.
TEST_F(AttentionCudaTensorCores, PrefillScaleSignPicksTheKernel) {
  for (float scale : {0.37f, -0.37f}) {
    SCOPED_TRACE("scale " + std::to_string(scale));
    WorkloadSpec s = half_spec(8, 2, 128, 16, {300, 200}, kBF16, 23, SIEVE_PHASE_PREFILL, {300, 150});
    s.scale = scale;
    Workload w(s);
    w.request_lse();
    expect_on_kernel(w, scale > 0 ? prefill_tc_kernel(128, 16) : "prefill-mma");
  }
}

TEST_F(AttentionCudaTensorCores, PrefillQRowsLikeDeltaCorrection) {
  Workload w(half_spec(8, 2, 128, 32, kLongPrefillLens, kBF16, 9, SIEVE_PHASE_PREFILL, kLongPrefillNew));
  w.set_q_rows(delta_anchor_rows(w));
  w.request_lse();
  expect_on_kernel(w, "row-mma");
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 16, 1, w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 16, 1, 0.5, 4));
  CudaAttentionOptions opt;
  opt.kv_splits = 3;
  expect_on_kernel(w, "row-mma", opt);
}

TEST_F(AttentionCudaTensorCores, BadEntriesAreSkippedAndReported) {
  {
    Workload w(half_spec(8, 2, 128, 16, {40, 100}, kBF16, 2));
    w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1, w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 1, 1.0, 1));
    w.sel_indices.data<int32_t>()[w.sel_indptr.data<int32_t>()[2] + 2] = 1000;
    ASSERT_EQ(plan_for(w).kernel, std::string("row-mma"));
    DeviceCall call(w);
    std::string err;
    ASSERT_EQ(call.run(stream_, {}, &err), SIEVE_OK) << err;
    ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(err, testing::HasSubstr("selection row 2: key block 1000"));
    for (int64_t i = 0; i < w.out.numel(); ++i) ASSERT_TRUE(std::isfinite(w.out.get(i))) << i;
  }
  {
    Workload w(half_spec(8, 2, 128, 16, {40, 200}, kBF16, 3, SIEVE_PHASE_PREFILL));
    w.kv_indices.data<int32_t>()[1] = 1 << 20;  // beyond the pool
    ASSERT_EQ(plan_for(w).kernel, prefill_tc_kernel(128, 16));
    DeviceCall call(w);
    std::string err;
    ASSERT_EQ(call.run(stream_, {}, &err), SIEVE_OK) << err;
    ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(err, testing::HasSubstr("physical page 1048576 (sequence 0, logical page 1)"));
    for (int64_t i = 0; i < w.out.numel(); ++i) ASSERT_TRUE(std::isfinite(w.out.get(i))) << i;
  }
}

TEST_F(AttentionCudaTensorCores, CapturesIntoACudaGraph) {
  for (sieve_phase phase : {SIEVE_PHASE_DECODE, SIEVE_PHASE_PREFILL}) {
    SCOPED_TRACE(phase == SIEVE_PHASE_DECODE ? "decode" : "prefill");
    Workload w(half_spec(8, 2, 128, 16, {3000, 40}, kBF16, 6, phase, phase == SIEVE_PHASE_PREFILL ? std::vector<int32_t>{200, 40} : std::vector<int32_t>{}));
    if (phase == SIEVE_PHASE_DECODE) w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    DeviceCall call(w);
    std::string err;
    ASSERT_EQ(call.run(stream_, {}, &err), SIEVE_OK) << err;  // first use sets the device up
    ASSERT_NO_FATAL_FAILURE(call.run_captured(stream_, {}, &err));
    expect_outputs_match(w);
  }
}

// ---- engine page layouts (ABI 1.1 strided views) --------------------------------------------------

// The bytes of the outputs now in `w`.
std::vector<unsigned char> output_bytes(const Workload& w) {
  std::vector<unsigned char> b(w.out.data<unsigned char>(), w.out.data<unsigned char>() + w.out.nbytes());
  if (w.args.lse) b.insert(b.end(), w.lse.data<unsigned char>(), w.lse.data<unsigned char>() + w.lse.nbytes());
  if (w.args.page_mass)
    b.insert(b.end(), w.page_mass.data<unsigned char>(), w.page_mass.data<unsigned char>() + w.page_mass.nbytes());
  return b;
}

// The same K/V laid out HND (explicit strides), NHD and as combined pools (V at a byte_offset)
// give bit-identical outputs to the compact pool on every kernel family (FMA and tensor-core row
// and prefill kernels, the statistics pass): the strides change addresses, not arithmetic.
TEST_F(AttentionCudaTensorCores, EngineLayoutsGiveBitIdenticalOutputs) {
  struct Case {
    WorkloadSpec spec;
    uint32_t heads;  // selection heads, or 99 for dense
    bool stats;
  };
  const std::vector<Case> cases = {
      {make_spec(8, 2, 128, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, 901, kF32), 99, true},  // row-fma
      {half_spec(8, 2, 128, 16, kDecodeLens, kBF16, 902), 99, true},                          // row-mma
      {half_spec(8, 2, 64, 16, kDecodeLens, kF16, 903), SIEVE_SEL_PER_KV_HEAD, true},
      {make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew, 904, kF32), 99, false},
      {half_spec(8, 2, 128, 16, kPrefillLens, kBF16, 905, SIEVE_PHASE_PREFILL, kPrefillNew), SIEVE_SEL_PER_Q_HEAD,
       false},
      {make_spec(4, 1, 8, 32, {5, 70}, SIEVE_PHASE_DECODE, {}, 906, kBF16), 99, true},  // one KV head, d 8
  };
  for (const Case& c : cases) {
    Workload w(c.spec);
    if (c.heads != 99) w.set_selection(c.heads, c.spec.phase == SIEVE_PHASE_PREFILL ? 16 : 1, 1,
                                       rows_with_an_empty_one(w, c.heads, c.spec.phase == SIEVE_PHASE_PREFILL ? 16 : 1,
                                                              1, 0.5, c.spec.seed));
    w.request_lse();
    if (c.stats) w.request_stats(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
    SCOPED_TRACE("seed " + std::to_string(c.spec.seed) + ", kernel " + plan_for(w).kernel);
    expect_matches_reference(w);
    const std::vector<unsigned char> want = output_bytes(w);
    for (KvLayout layout : kKvLayouts) {
      SCOPED_TRACE(kv_layout_name(layout));
      reference::LaidOutPool pool(w.k_pages.dl(), w.v_pages.dl(), layout);
      DeviceCall call(w, &pool);
      std::string err;
      ASSERT_EQ(call.run(stream_, {}, &err), SIEVE_OK) << err;
      ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_OK) << err;
      EXPECT_TRUE(output_bytes(w) == want) << "outputs differ from the compact pool's";
    }
  }
}

}  // namespace
}  // namespace sieve
