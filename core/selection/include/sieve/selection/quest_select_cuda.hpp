// Quest's decode selection on CUDA in one kernel per layer: page bound -> order key -> top-k ->
// the selection CSR, as the attention kernel reads it. The same pages as page_bounds_cpu +
// top_k_batch_cpu with TopKBatch{head 0, tail 1, k = budget_pages - 1, fill = true}, bit for bit.
//
// One CTA per (sequence, KV head): it reads the min/max record of each of the sequence's pages for
// its KV head once, scores it for the group's query heads (one row per query head, or the group's
// max with group_max), keeps the order keys in shared memory (a global scratch when they do not
// fit), then per row finds the (budget_pages - 1)-th best key by a 4-pass radix select and writes
// the row: the chosen pages in ascending order, then the last page. Every row holds
// min(pages, budget_pages) entries (fill: non-finite bounds rank last, they are not dropped), so
// its offset follows from the page counts alone and the CTA writes its rows' indptr itself: no
// second kernel, no scan, no host synchronisation, nothing on the host proportional to the context.
// Plain types only, so callers need no CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "sieve/selection/page_bound_cuda.hpp"

namespace sieve::selection {

struct QuestSelectLaunch {
  const void* q;                // device [n_q_tokens, n_q_heads, head_dim]; each sequence's last query
  Storage q_dtype;
  const int32_t* qo_indptr;     // device [batch + 1]
  int32_t n_q_heads;
  const void* sidecar;          // device [capacity, n_kv_heads, 2 * head_dim] (page_bound.hpp)
  Storage kv_dtype;
  int32_t n_kv_heads, head_dim;
  const int32_t* kv_indptr;     // device [batch + 1]
  const int32_t* kv_indices;    // device
  int32_t batch;
  int32_t max_pages;            // largest page count of the call (host mirror): key buffer size
  bool group_max;               // rows per KV head (max over the group), else per query head
  int32_t budget_pages;         // pages a row keeps (>= 1): the last one + the best others
  uint32_t* keys;               // device scratch of quest_select_scratch_keys() entries (may be
                                // NULL when that is 0); max_pages must not exceed its max_pages
  int32_t* sel_indptr;          // device [batch * rows per sequence + 1]
  int32_t* sel_indices;         // device [capacity]
  int64_t capacity;             // entries the host checked (writes past it are dropped)
  void* stream;                 // cudaStream_t
};

// Scratch keys (uint32) for calls of up to max_batch sequences of up to max_pages pages: 0 when a
// CTA's keys always fit its shared memory (e.g. 32q/8kv, per query head, up to 3073 pages).
size_t quest_select_scratch_keys(int32_t max_batch, int32_t n_q_heads, int32_t n_kv_heads, bool group_max,
                                 int32_t max_pages) noexcept;

// Enqueue the kernel on a.stream. Returns NULL, or what is wrong (bad head counts, a CUDA error).
const char* launch_quest_select(const QuestSelectLaunch& a) noexcept;

}  // namespace sieve::selection
