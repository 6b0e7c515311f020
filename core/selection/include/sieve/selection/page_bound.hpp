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
// bits (and hence the same selections): lane l of 32 accumulates channels l, l + 32, ... in
// increasing order; the lanes then combine as a butterfly (lane i += lane i + off, off = 16, 8, 4,
// 2, 1). Each term is max(q·min, q·max) with both products rounded (no fused multiply-add).
#pragma once
#include <sieve/policy.h>

#include <cstdint>

#include "sieve/selection/top_k.hpp"

namespace sieve::selection {

inline constexpr const char* kMinMaxSidecar = "quest.minmax";
inline constexpr int kBoundLanes = 32;

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

SIEVE_SELECTION_HD float bound_term(float q, float mn, float mx) {
  const float a = mul_rn(q, mn);
  const float b = mul_rn(q, mx);
  return a > b ? a : b;
}

// The canonical bound on the CPU: q, mn, mx are [d] floats.
inline float page_bound(const float* q, const float* mn, const float* mx, int32_t d) {
  float lane[kBoundLanes];
  for (int l = 0; l < kBoundLanes; ++l) {
    float acc = 0.0f;
    for (int32_t c = l; c < d; c += kBoundLanes) acc += bound_term(q[c], mn[c], mx[c]);
    lane[l] = acc;
  }
  for (int off = kBoundLanes / 2; off > 0; off /= 2)
    for (int l = 0; l < off; ++l) lane[l] = lane[l] + lane[l + off];
  return lane[0];
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
// group's query heads). `scratch` holds (n_q_heads + 2) * head_dim floats (no allocation here).
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
