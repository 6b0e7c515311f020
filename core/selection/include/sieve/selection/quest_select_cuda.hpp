// Quest's decode selection on CUDA in one kernel per layer: page bound -> order key -> top-k ->
// the selection CSR, as the attention kernel reads it. The same pages as page_bounds_cpu +
// top_k_batch_cpu with TopKBatch{head 0, tail 1, k = budget_pages - 1, fill = true}, bit for bit.
//
// CTAs per (sequence, KV head): its pages are cut into slices (enough CTAs to fill the GPU, at
// least 256 pages each); a slice reads the min/max record of each of its pages for its KV head
// once (staged through shared memory by cp.async), scores it for the group's query heads (one row
// per query head, or the group's max with group_max) and writes the order keys to a global
// scratch; the last slice to finish (an arrival counter) finds each row's (budget_pages - 1)-th
// best key by a 4-pass radix select and writes the row: the chosen pages in ascending order, then
// the last page. Every row holds min(pages, budget_pages) entries (fill: non-finite bounds rank
// last, they are not dropped), so its offset follows from the page counts alone and the kernel
// writes the indptr itself: no second kernel, no scan, no host synchronisation, nothing on the
// host proportional to the context. Plain types only, so callers need no CUDA headers.
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
  void* scratch;                // device, quest_select_scratch_bytes() for scratch_batch sequences
                                // of up to max_pages pages, zeroed once (quest_select_scratch_init)
  int32_t scratch_batch;        // the max_batch it was sized for (>= batch)
  int32_t* sel_indptr;          // device [batch * rows per sequence + 1]
  int32_t* sel_indices;         // device [capacity]
  int64_t capacity;             // entries the host checked (writes past it are dropped)
  void* stream;                 // cudaStream_t
};

// Scratch for calls of up to max_batch sequences of up to max_pages pages: arrival counters and
// the order keys. Zero it once before the first call (quest_select_scratch_init: a memset, then
// that stream is synchronised — create time); every call leaves the counters at zero again.
size_t quest_select_scratch_bytes(int32_t max_batch, int32_t n_q_heads, int32_t n_kv_heads, bool group_max,
                                  int32_t max_pages) noexcept;
const char* quest_select_scratch_init(void* scratch, size_t bytes, void* stream) noexcept;

// Enqueue the kernel on a.stream. Returns NULL, or what is wrong (bad head counts, a CUDA error).
const char* launch_quest_select(const QuestSelectLaunch& a) noexcept;

}  // namespace sieve::selection
