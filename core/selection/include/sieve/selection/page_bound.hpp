// Quest's page bound (Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
// Inference", §3): per page and KV head, the channel-wise minimum and maximum of the page's
// (post-RoPE) keys; for a query q, Σ_d max(q_d·min_d, q_d·max_d) >= q·k for every key k of the
// page — an upper bound of the page's largest logit (unscaled), used to rank pages.
//
// Sidecar "quest.minmax": [page_capacity, n_kv_heads, 2 * head_dim] in the KV storage dtype —
// min_0..min_{d-1}, max_0..max_{d-1}. The min/max of stored keys are stored keys' values, so the
// KV dtype holds them exactly (and f16/bf16 halve the metadata the bound reads).
// Maintenance is incremental: an append that reaches a page's first token (offset 0) initialises
// the page from its new tokens, any later append folds its new tokens into the stored min/max.
// Keys are read back from the store's pages after the append, i.e. exactly as stored.
//
// The sum has ONE canonical order, shared by the CPU and the CUDA code so both produce the same
// bits (and hence the same selections). The channels come in chunks of 8 (kBoundChunk: one 16-byte
// load of a 16-bit sidecar); partial p of 16 (kBoundPartials) accumulates, from 0, the channels of
// chunks p, p + 16, p + 32, ... in increasing channel order; the partials then combine as a
// butterfly (partial i += partial i + off, off = 8, 4, 2, 1). On the GPU a half-warp holds one
// (page, KV head): lane p loads chunk p with one vector load and sums its 8 channels. Each step is
// acc + max(q·min, q·max) = fma(q, q >= 0 ? max : min, acc), one rounding (bound_step). The group max (gqa_share)
// is group_max_step over the group's heads in order, on both sides.
#pragma once
#include <sieve/policy.h>

#include <cmath>
#include <cstdint>

#include "sieve/selection/top_k.hpp"

namespace sieve::selection {

inline constexpr const char* kMinMaxSidecar = "quest.minmax";
inline constexpr int kBoundLanes = 32;      // (the order before 2026-11-22; kept for callers)
inline constexpr int kBoundChunk = 8;       // channels a partial sums in a row
inline constexpr int kBoundPartials = 16;   // partials of the canonical sum

// Rounded multiply / add that no compiler fuses into an FMA (nvcc contracts by default), so the
// device computes exactly the host's bits.
SIEVE_SELECTION_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SIEVE_SELECTION_HD float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// max(q·min, q·max) as one product: q >= 0 picks max, q < 0 picks min. Rounding is monotonic, so
// for finite values this is the larger of the two rounded products (bit for bit, but for the sign
// of a zero when both underflow); NaN q gives NaN either way.
SIEVE_SELECTION_HD float bound_term(float q, float mn, float mx) {
  return mul_rn(q, q >= 0.0f ? mx : mn);
}

// One step of the canonical sum: acc + q·(q >= 0 ? max : min) with a single rounding (fused
// multiply-add, IEEE fma on both sides: __fmaf_rn / std::fma), i.e. acc + max(q·min, q·max).
SIEVE_SELECTION_HD float bound_step(float acc, float q, float mn, float mx) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(q, q >= 0.0f ? mx : mn, acc);
#else
  return std::fma(q, q >= 0.0f ? mx : mn, acc);
#endif
}

// The running max of a group's bounds (gqa_share): the first head's bound, then any larger one.
// Spelled out (not fmaxf / std::max) so both sides treat NaN alike.
SIEVE_SELECTION_HD float group_max_step(float best, float s, bool first) {
  return first ? s : (s > best ? s : best);
}

// The canonical bound on the CPU: q, mn, mx are [d] floats.
inline float page_bound(const float* q, const float* mn, const float* mx, int32_t d) {
  float partial[kBoundPartials];
  for (int p = 0; p < kBoundPartials; ++p) {
    float acc = 0.0f;
    for (int32_t chunk = p; chunk * kBoundChunk < d; chunk += kBoundPartials)
      for (int32_t c = chunk * kBoundChunk; c < d && c < (chunk + 1) * kBoundChunk; ++c)
        acc = bound_step(acc, q[c], mn[c], mx[c]);
    partial[p] = acc;
  }
  for (int off = kBoundPartials / 2; off > 0; off /= 2)
    for (int p = 0; p < off; ++p) partial[p] = add_rn(partial[p], partial[p + off]);
  return partial[0];
}

// The order page_bounds_cpu reads q and a page's min and max in ("bound order"): rounds of L
// chunks x 8 channels, step i of chunk p at [round][i][p], zero past head_dim, with L = 16 (the
// partials) or 8 where head_dim <= 64 (partials 8-15 would hold nothing). Floats of one row:
inline int32_t bound_order_lanes(int32_t head_dim) {
  return head_dim <= kBoundChunk * kBoundPartials / 2 ? kBoundPartials / 2 : kBoundPartials;
}
inline int64_t bound_order_floats(int32_t head_dim) {
  const int32_t round = bound_order_lanes(head_dim) * kBoundChunk;
  return int64_t((head_dim + round - 1) / round) * round;
}
// The scratch page_bounds_cpu needs, in floats.
inline int64_t page_bounds_scratch_floats(int32_t n_q_heads, int32_t head_dim) {
  return (int64_t(n_q_heads) + 2) * bound_order_floats(head_dim);
}

// ---- CPU maintenance and scoring over a call's view ----------------------------------------
// `new_tokens` (host [batch + 1], CSR like token_indptr / qo_indptr): the last
// new_tokens[b+1]-new_tokens[b] resident tokens of sequence b are new. Updates the sidecar
// (CPU tensor [capacity, n_kv_heads, 2 * head_dim], dtype == the pages' dtype) of every page that
// received a new token. Throws std::invalid_argument on a shape or dtype mismatch.
void minmax_on_append_cpu(const sieve_paged_kv& view, const int32_t* new_tokens,
                          const DLTensor& sidecar);

// Recompute one (physical page, KV head)'s min/max from its first `tokens` keys (tests).
void minmax_recompute_cpu(const sieve_paged_kv& view, int32_t physical_page, int32_t kv_head,
                          int32_t tokens, float* mn, float* mx);

// Bounds of every resident page for each sequence's last query (decode: its only query).
// q: CPU [n_q_tokens, n_q_heads, head_dim] f32/f16/bf16; qo_indptr_host [batch + 1].
// scores: f32, page j of the view's page table (j = indptr[b] + logical page) and head h at
// scores[j * layout.item_stride + h * layout.head_stride] (top_k.hpp's ScoreLayout), with
// H = n_q_heads (one bound per query head) or, when group_max, H = n_kv_heads (the max over the
// group's query heads). `scratch` holds page_bounds_scratch_floats(n_q_heads, head_dim) floats (no
// allocation here).
void page_bounds_cpu(const sieve_paged_kv& view, const DLTensor& sidecar, const DLTensor& q,
                     const int32_t* qo_indptr_host, int32_t n_q_heads, bool group_max,
                     float* scores, ScoreLayout layout, float* scratch);

}  // namespace sieve::selection

namespace sieve::selection {

// The checks a page-scoring policy makes on a decode call before it reads anything: phase is
// decode, one query per sequence, batch within max_batch, a view of the call's sequences with
// the policy's page size and host mirrors, kv_len_host equal to the view's tokens. Throws
// sieve::Error(INVALID_ARGUMENT) naming the first problem. Returns the largest page count.
int32_t check_decode_call(const sieve_layer_call& call, const sieve_geometry& g);

}  // namespace sieve::selection
