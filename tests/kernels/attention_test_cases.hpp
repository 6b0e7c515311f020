// What the attention kernel tests share (CPU kernel here, CUDA kernel in tests/cuda): the ragged
// case lists, workload specs, the check of a call's outputs against the f64 reference,
// and the cases both backends run unchanged. A case takes the backend's `Expect`: run the kernel
// on the workload's (NaN-poisoned) outputs and check them with expect_outputs_match.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "common/attention_tolerance.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/fidelity.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve::attention_test {

using reference::RefAttention;
using reference::Workload;
using reference::WorkloadSpec;

// Decode kv lengths: a single token, just under / at / over a page, and longer ragged ones.
inline const std::vector<int32_t> kDecodeLens = {1, 15, 16, 17, 100, 333};
// Ragged prefill: an empty sequence, one token, a chunk appended to a cached prefix (n_new <
// kv_len) and a full prompt longer than a key tile.
inline const std::vector<int32_t> kPrefillLens = {0, 1, 77, 130};
inline const std::vector<int32_t> kPrefillNew = {0, 1, 30, 130};
// Every kind of selection head.
inline constexpr uint32_t kSelectionHeads[] = {SIEVE_SEL_PER_SEQUENCE, SIEVE_SEL_PER_KV_HEAD,
                                               SIEVE_SEL_PER_Q_HEAD};

inline WorkloadSpec make_spec(int32_t hq, int32_t hkv, int32_t d, int32_t ps,
                              std::vector<int32_t> lens, sieve_phase phase = SIEVE_PHASE_DECODE,
                              std::vector<int32_t> n_new = {}, uint64_t seed = 1,
                              DLDataType kv = kF32, DLDataType qo = kF32) {
  WorkloadSpec s;
  s.n_q_heads = hq;
  s.n_kv_heads = hkv;
  s.head_dim = d;
  s.page_size = ps;
  s.kv_lens = std::move(lens);
  s.phase = phase;
  s.n_new = std::move(n_new);
  s.seed = seed;
  s.kv_dtype = kv;
  s.q_dtype = s.out_dtype = qo;
  return s;
}

// Key-block lists with one row forced empty, so empty rows are always exercised.
inline reference::SelectionRows rows_with_an_empty_one(const Workload& w, uint32_t heads,
                                                       int32_t q_block, int32_t kbp, double keep,
                                                       uint64_t seed) {
  reference::SelectionRows rows = w.random_selection_rows(heads, q_block, kbp, keep, seed);
  rows[rows.size() / 2].clear();
  return rows;
}

// Every 7th query row of each sequence plus its last, as a Δ-correction anchor pass asks.
inline std::vector<int32_t> delta_anchor_rows(const Workload& w) {
  std::vector<int32_t> rows;
  for (int32_t b = 0; b < w.batch; ++b) {
    const int32_t begin = w.qo_indptr.data<int32_t>()[b], end = w.qo_indptr.data<int32_t>()[b + 1];
    for (int32_t t = begin; t < end; ++t)
      if ((t - begin) % 7 == 0 || t == end - 1) rows.push_back(t);
  }
  return rows;
}

// Checks the outputs now in `w` (written by a kernel over NaN-poisoned outputs) against the f64
// reference: written exactly where the call computes and untouched elsewhere, a row that attends
// nothing exactly 0, then accuracy of out, lse and page statistics within the bounds of the
// arithmetic (common/attention_tolerance.hpp): f32 sums, and where q and K/V share a 16-bit dtype
// the softmax weights rounded to it for P.V (the CUDA tensor-core kernels do; the bound allows
// it for every backend there).
inline void expect_outputs_match(const Workload& w) {
  const RefAttention ref = reference::attend_reference(w.args);
  const int32_t hq = w.spec.n_q_heads, d = w.spec.head_dim;
  const bool narrow = same_dtype(w.spec.q_dtype, w.spec.kv_dtype) && w.spec.kv_dtype.bits == 16;
  const auto bound = tolerance::attention_bound(
      w, tolerance::kF32, narrow ? tolerance::unit_roundoff(w.spec.kv_dtype) : 0);
  int64_t unwritten = 0, overwritten = 0;
  double worst_row = 0;  // the largest ||o - o*||_2 of a row
  for (int32_t t = 0; t < w.n_q_tokens; ++t)
    for (int32_t h = 0; h < hq; ++h) {
      double row_err = 0;
      for (int32_t i = 0; i < d; ++i) {
        const double o = w.out.get((int64_t(t) * hq + h) * d + i);
        unwritten += ref.computed[size_t(t)] && std::isnan(o);
        overwritten += !ref.computed[size_t(t)] && !std::isnan(o);
        row_err += std::pow(o - ref.out_row(t, h)[size_t(i)], 2);
      }
      if (ref.computed[size_t(t)]) worst_row = std::max(worst_row, std::sqrt(row_err));
      if (ref.computed[size_t(t)] && std::isinf(ref.lse[size_t(t) * hq + h])) {  // attends nothing
        for (int32_t i = 0; i < d; ++i)
          EXPECT_EQ(w.out.get((int64_t(t) * hq + h) * d + i), 0.f) << "empty row " << t << "," << h;
      }
    }
  EXPECT_EQ(unwritten, 0) << "output elements the kernel did not write";
  EXPECT_EQ(overwritten, 0) << "output elements of rows outside q_rows that the kernel wrote";

  const reference::OutputError e = reference::compare_output(ref, w.out.dl());
  EXPECT_EQ(e.non_finite, 0);
  EXPECT_LE(worst_row, bound.row) << "worst relative row: token " << e.worst_token << ", head "
                                  << e.worst_head << " (max_row_rel " << e.max_row_rel
                                  << ", rel_l2 " << e.rel_l2 << ")";
  if (w.args.lse) {
    EXPECT_LE(reference::max_lse_error(ref, w.lse.dl()), bound.lse);
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
              tolerance::page_mass(w.args));
  }
}

// ---- cases both backends run ----------------------------------------------------------------

// Runs the backend's kernel on `w` and checks the outputs against the reference.
using Expect = std::function<void(Workload& w)>;

// Decode over block selections of every head kind, k_block_pages 1 and 3, keeping 30% / 70% of
// the blocks, one row empty; lse and the page statistics the head kind allows.
inline void decode_block_selections(const Expect& expect) {
  for (uint32_t heads : kSelectionHeads)
    for (int32_t kbp : {1, 3})
      for (double keep : {0.3, 0.7}) {
        SCOPED_TRACE("heads " + std::to_string(heads) + ", k_block_pages " + std::to_string(kbp) +
                     ", keep " + std::to_string(keep));
        Workload w(make_spec(8, 2, 64, 16, kDecodeLens, SIEVE_PHASE_DECODE, {}, heads * 10 + kbp));
        w.set_selection(heads, 1, kbp, rows_with_an_empty_one(w, heads, 1, kbp, keep, 5));
        w.request_lse();
        w.request_stats(heads == SIEVE_SEL_PER_Q_HEAD ? SIEVE_STATS_PAGE_MASS_ALL_HEADS
                                                      : SIEVE_STATS_PAGE_MASS_PER_KV_HEAD);
        expect(w);
      }
}

// Decode where every selection row is empty: zero output, lse -inf, no page mass.
inline void decode_every_selection_row_empty(int32_t head_dim, const Expect& expect) {
  Workload w(make_spec(4, 2, head_dim, 16, {5, 40}));
  w.set_selection(SIEVE_SEL_PER_Q_HEAD, 1, 1,
                  reference::SelectionRows(size_t(w.selection_rows(SIEVE_SEL_PER_Q_HEAD, 1))));
  w.request_lse();
  w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  expect(w);
  for (int64_t i = 0; i < w.lse.numel(); ++i) EXPECT_EQ(w.lse.get(i), -INFINITY);
  for (int64_t i = 0; i < w.page_mass.numel(); ++i) EXPECT_EQ(w.page_mass.get(i), 0.f);
}

// Decode of two of five sequences (q_rows out of order), dense and over a block selection.
inline void decode_q_rows_subset(const Expect& expect) {
  Workload w(make_spec(8, 4, 64, 16, {20, 1, 64, 100, 33}));
  w.set_q_rows({3, 1});
  w.request_lse();
  w.request_stats(SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  expect(w);
  EXPECT_EQ(w.page_mass.get(0), 0.f);  // sequence 0 is not computed: its pages have no mass
  w.set_selection(SIEVE_SEL_PER_KV_HEAD, 1, 1,
                  w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 1, 1, 0.5, 9));
  expect(w);
}

// Decode with a scale other than 1/sqrt(head_dim).
inline void decode_explicit_scale(const Expect& expect) {
  WorkloadSpec s = make_spec(8, 2, 64, 16, kDecodeLens);
  s.scale = 0.37f;
  Workload w(s);
  w.request_lse();
  expect(w);
}

// Prefill over block selections of every head kind, these query block sizes and k_block_pages 1
// and 2, keeping half the blocks, one row empty.
inline void prefill_block_selections(const std::vector<int32_t>& q_blocks, const Expect& expect) {
  for (uint32_t heads : kSelectionHeads)
    for (int32_t q_block : q_blocks)
      for (int32_t kbp : {1, 2}) {
        SCOPED_TRACE("heads " + std::to_string(heads) + ", q_block " + std::to_string(q_block) +
                     ", k_block_pages " + std::to_string(kbp));
        Workload w(make_spec(8, 2, 64, 16, kPrefillLens, SIEVE_PHASE_PREFILL, kPrefillNew,
                             heads * 100 + q_block + kbp));
        w.set_selection(heads, q_block, kbp,
                        rows_with_an_empty_one(w, heads, q_block, kbp, 0.5, q_block + kbp));
        w.request_lse();
        expect(w);
      }
}

}  // namespace sieve::attention_test
