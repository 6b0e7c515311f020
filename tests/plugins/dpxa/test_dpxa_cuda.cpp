// The dpxa plugin's CUDA path against its CPU path, for every estimator, both row kinds, f32, f16
// and bf16, ragged batches with chunked prefill and a sequence without queries, and a long
// sequence at the paper's block size (B = 128, d = 128). Hooks allocate nothing. Skips without a
// CUDA device.
//   - f32 (and head dims that are not a multiple of 16): the scalar scoring kernel, the same CSR
//     as the CPU entry for entry.
//   - f16 / bf16: tile scores on tensor cores (mma, f32 accumulate, hardware exp), which round
//     differently from the CPU's sequential sums. The CSR must still equal the CPU's in all but a
//     few rows (<= 2%, each differing by <= 2 tiles), and every differing per-q-head row must be a
//     valid greedy cover of the plain f64 shares (forced blocks kept, covers tau, minimal, a top
//     set) to the f32 rounding of the shares (share_error, dpxa_scenario.hpp): the two
//     selections may differ only where shares are that close.
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include "math/dpxa_tiles.hpp"

#include "dpxa_device_call.hpp"
#include "dpxa_scenario.hpp"
#include "support/cuda_policy_test.hpp"
#include "support/host_selection.hpp"

namespace {

using namespace sieve::testing;
using ::testing::_;

class DpxaCuda : public CudaPolicyTest {
 protected:
  DpxaCuda() : CudaPolicyTest("dpxa") {}
  sieve_policy* create(const sieve_geometry& g, const DpxaArgs& a) {
    DpxaValues v(a);
    return create_policy(g, v.v, DpxaValues::kCount);
  }
  // CUDA CSR == CPU CSR (all rows, every entry; `exact` false: see the file comment).
  void compare(DpxaScenario& sc, const DpxaArgs& a, bool exact = true) {
    SCOPED_TRACE(::testing::Message() << a.estimator << " tau=" << a.tau << " rows=" << a.rows
                                      << " block=" << a.block);
    DeviceCall dc(sc);
    sieve_policy* cpu = create(sc.g, a);
    sieve_policy* gpu = create(dc.geometry, a);
    ASSERT_TRUE(cpu && gpu);
    const int64_t max_rows = int64_t(sc.w.n_q_tokens) * sc.g.n_q_heads;
    const int64_t capacity = 1 << 20;
    HostSelection host_sel(max_rows, capacity);
    DeviceSelection ds(max_rows, capacity);
    sieve_selection& dsel = ds.sel;
    uint32_t stats = 0;
    ASSERT_EQ(api_->select(cpu, &sc.call, host_sel.get(), &stats), SIEVE_OK) << api_->last_error(cpu);
    EXPECT_CALL(host_, alloc(_, _, _)).Times(0);  // hooks never allocate
    ASSERT_EQ(api_->select(gpu, &dc.call, &dsel, &stats), SIEVE_OK) << api_->last_error(gpu);
    ::testing::Mock::VerifyAndClearExpectations(&host_);
    SIEVE_CUDA_OK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(dsel.n_rows, host_sel.sel().n_rows);
    EXPECT_EQ(dsel.heads, host_sel.sel().heads);
    EXPECT_EQ(dsel.q_block, host_sel.sel().q_block);
    EXPECT_EQ(dsel.k_block_pages, host_sel.sel().k_block_pages);
    const auto indptr = ds.indptr.get<int32_t>(), indices = ds.indices.get<int32_t>();
    const int32_t n_rows = host_sel.sel().n_rows;
    ASSERT_GT(n_rows, 0);
    if (exact) {
      for (int32_t r = 0; r <= n_rows; ++r)
        ASSERT_EQ(indptr[size_t(r)], host_sel.indptr()[size_t(r)]) << "indptr[" << r << "]";
      const int32_t nnz = host_sel.indptr()[size_t(n_rows)];
      int32_t mismatches = 0;
      for (int32_t e = 0; e < nnz; ++e) mismatches += indices[size_t(e)] != host_sel.indices()[size_t(e)];
      EXPECT_EQ(mismatches, 0) << "of " << nnz << " entries";
      EXPECT_EQ(indices[size_t(nnz)], kSelectionPoison) << "wrote past the last row";
      return;
    }
    ASSERT_EQ(indptr[0], 0);
    for (int32_t r = 0; r < n_rows; ++r)
      ASSERT_TRUE(indptr[size_t(r)] <= indptr[size_t(r) + 1] && indptr[size_t(r) + 1] <= capacity)
          << "indptr[" << r + 1 << "] = " << indptr[size_t(r) + 1];
    EXPECT_EQ(indices[size_t(indptr[size_t(n_rows)])], kSelectionPoison) << "wrote past the last row";
    // Row r -> (sequence, query block, head) in the selection's order.
    const int32_t B = int32_t(a.block);
    const bool kv_rows = a.rows == "kv_head";
    const int32_t H = kv_rows ? sc.g.n_kv_heads : sc.g.n_q_heads;
    const int32_t S = a.stride ? int32_t(a.stride) : a.estimator == "xattn" ? 8 : 4;
    const double rounding = share_error(sc, a);
    int32_t row = 0, differing = 0, pruned = 0;
    for (int32_t b = 0; b < sc.w.batch; ++b)
      for (int32_t t = 0; t < sc.query_blocks(b, B); ++t)
        for (int32_t h = 0; h < H; ++h, ++row) {
          const std::set<int32_t> gpu(indices.begin() + indptr[size_t(row)],
                                      indices.begin() + indptr[size_t(row) + 1]);
          const std::set<int32_t> cpu(host_sel.indices().begin() + host_sel.indptr()[size_t(row)],
                                      host_sel.indices().begin() + host_sel.indptr()[size_t(row) + 1]);
          ASSERT_EQ(gpu.size(), size_t(indptr[size_t(row) + 1] - indptr[size_t(row)]))
              << "row " << row << " repeats a key block";
          const auto span = sieve::dpxa::row_span(sc.w.kv_len[size_t(b)], sc.w.n_new[size_t(b)], B, t);
          if (int32_t(cpu.size()) < span.n_candidates) ++pruned;
          if (gpu == cpu) continue;
          ++differing;
          std::vector<int32_t> sym;
          std::set_symmetric_difference(gpu.begin(), gpu.end(), cpu.begin(), cpu.end(),
                                        std::back_inserter(sym));
          EXPECT_LE(sym.size(), 2u) << "row " << row << " differs from the CPU's in " << sym.size()
                                    << " key blocks";
          if (kv_rows) continue;
          // A per-q-head row: a valid greedy cover of the f64 shares, to the f32 rounding.
          const auto q = sc.queries(b, h);
          const auto k = sc.keys(b, h / (sc.g.n_q_heads / sc.g.n_kv_heads));
          const auto w = plain_shares(a.estimator, q, k, B, t, S, a.threshold);
          expect_greedy_cover(w, gpu, [&](int32_t j) { return j == 0 || j >= span.diag_first; },
                              a.tau, rounding, row);
        }
    EXPECT_EQ(row, n_rows);
    EXPECT_LE(differing, std::max(1, n_rows / 50)) << "rows differing from the CPU's, of " << n_rows;
    EXPECT_GT(pruned, 0) << "some row must drop a tile, or the comparison checks little";
  }
};

TEST_F(DpxaCuda, RaggedBatchMatchesTheCpuPath) {
  // f32: the scalar kernel, exact. f16 / bf16: tensor cores; 8 q heads over 2 KV heads stacks all
  // 4 heads of a group in one CTA.
  for (DLDataType t : {sieve::kF32, sieve::kBF16, sieve::kF16}) {
    const bool exact = sieve::same_dtype(t, sieve::kF32);
    DpxaScenario sc({300, 200, 40, 64}, {300, 77, 40, 0}, 16, exact ? 4 : 8, 2, 32, 5, t);
    for (const char* est : {"dpxa", "xattn", "stride"})
      for (double tau : {0.5, 0.9})
        for (const char* rows : {"q_head", "kv_head"}) {
          SCOPED_TRACE(sieve::dtype_name(t));
          DpxaArgs a;
          a.estimator = est;
          a.tau = tau;
          a.rows = rows;
          compare(sc, a, exact);
        }
  }
}

// A bf16 head dim that is not a multiple of 16 takes the scalar kernel: exact.
TEST_F(DpxaCuda, OddHeadDimFallsBackToTheExactKernel) {
  DpxaScenario sc({260, 100}, {200, 100}, 16, 4, 2, 40, 11, sieve::kBF16);
  for (const char* est : {"dpxa", "xattn", "stride"}) {
    DpxaArgs a;
    a.estimator = est;
    compare(sc, a, true);
  }
}

// A chunked prefill starting one token into the first block, up to a max_seq_len the scratch is
// sized for: every query block straddles two key blocks, Σ_t candidates = 151 tiles per head
// (row_span), 15 more than the KB (KB + 1) / 2 = 136 of a whole prompt the tile scratch once held
// (the overrun is what compute-sanitizer memcheck flags, gpu/h-variant.sh).
TEST_F(DpxaCuda, ChunkedPrefillUpToMaxSeqLenFitsTheScratch) {
  for (DLDataType t : {sieve::kF32, sieve::kBF16}) {
    SCOPED_TRACE(sieve::dtype_name(t));
    const bool exact = sieve::same_dtype(t, sieve::kF32);
    DpxaScenario sc({512}, {511}, 16, exact ? 4 : 8, 2, 32, 13, t);
    sc.g.max_seq_len = 512;
    for (const char* est : {"dpxa", "xattn", "stride"}) {
      DpxaArgs a;
      a.estimator = est;
      compare(sc, a, exact);
    }
  }
}

TEST_F(DpxaCuda, LongSequenceAtThePapersBlockSize) {
  DpxaScenario sc({3000}, {3000}, 16, 8, 2, 128, 9, sieve::kBF16);
  sc.g.max_seq_len = 4096;
  for (const char* est : {"dpxa", "xattn", "stride"}) {
    DpxaArgs a;
    a.estimator = est;
    a.block = 128;
    a.tau = 0.9;
    compare(sc, a, false);
  }
}

}  // namespace
