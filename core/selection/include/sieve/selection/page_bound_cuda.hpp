// CUDA versions of page_bound.hpp: the min/max sidecar update fused into one kernel per append,
// and the page-bound estimate (canonical summation order, so the same bits as the CPU).
// Plain types only, so callers need no CUDA headers. Everything is enqueued on the given stream,
// reads lengths from the device page table, allocates nothing.
#pragma once
#include <sieve/abi.h>

#include <cstdint>

#include "sieve/selection/top_k.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/page_layout.hpp"

namespace sieve::selection {

struct MinMaxAppendLaunch {
  const void* k_pages;          // device [capacity, n_kv_heads, page_size, head_dim] (data_ptr)
  PageStrides k_strides;        // ... laid out as these strides say (page_strides)
  void* sidecar;                // device [capacity, n_kv_heads, 2 * head_dim], same dtype
  Storage kv_dtype;
  int32_t n_kv_heads, page_size, head_dim;
  const int32_t* kv_indptr;     // device [batch + 1] page table of the view
  const int32_t* kv_indices;    // device physical page ids
  const int32_t* last_page_len; // device [batch]
  const int32_t* new_indptr;    // device [batch + 1]: new tokens per sequence (qo_indptr);
                                // NULL: every resident token is new (recompute)
  int32_t batch;
  int32_t max_pages_touched;    // max over b of the pages that received new tokens (host mirror)
  void* stream;
};
const char* launch_minmax_append(const MinMaxAppendLaunch& a) noexcept;

struct PageBoundLaunch {
  const void* q;                // device [n_q_tokens, n_q_heads, head_dim]
  Storage q_dtype;
  const int32_t* qo_indptr;     // device [batch + 1]; the last query of each sequence is scored
  int32_t n_q_heads;
  const void* sidecar;          // device [capacity, n_kv_heads, 2 * head_dim]
  Storage kv_dtype;
  int32_t n_kv_heads, head_dim;
  const int32_t* kv_indptr;     // device [batch + 1]
  const int32_t* kv_indices;    // device
  int32_t batch;
  int32_t max_pages;            // max pages of a sequence (host mirror): grid size
  bool group_max;               // scores [nnz, n_kv_heads] (max over the group) else [nnz, n_q_heads]
  float* scores;                // device, page j / head h at j * item_stride + h * head_stride
  ScoreLayout layout;
  void* stream;
  int32_t page_blocks = 0;      // blocks along the pages: 0 = one wave of the device (the vector
                                // kernel) or ~16 pages a half-warp; tests set 1 for long walks
};
const char* launch_page_bounds(const PageBoundLaunch& a) noexcept;

}  // namespace sieve::selection
