// Batched top-k on CUDA (the layout and the rule of top_k.hpp's TopKBatch), writing a CSR
// selection on the host's stream: same items as top_k_batch_cpu, bit for bit.
//   kernel 1 (a block per row): the row's middle keys into shared memory, count the finite ones,
//                               find the k-th best order_key() by a block-wide binary search over
//                               the key space -> the row's plan (kept count, threshold, ties);
//   (more than 4096 rows: one block scans the kept counts -> selection indptr);
//   kernel 2 (a block per row): its offset (the kept counts before it), then every better item
//                               and the lowest-indexed ties, in ascending order (one block scan).
// No allocation and no synchronisation: the one scratch array (a plan per row) is sized at
// create with top_k_cuda_scratch_bytes(max_rows).
// Plain types only, so callers need no CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "sieve/selection/top_k.hpp"

namespace sieve::selection {

struct TopKCudaLaunch {
  const float* scores;        // device, laid out as `layout` says (top_k.hpp)
  ScoreLayout layout;
  const int32_t* seg_indptr;  // device [n_segments + 1] (e.g. the view's page-table indptr)
  int32_t n_segments;
  int32_t rows_per_segment;   // H; rows = n_segments * H
  int32_t head, tail, k;
  void* scratch;              // device, >= top_k_cuda_scratch_bytes(rows)
  int32_t* sel_indptr;        // device [rows + 1]
  int32_t* sel_indices;       // device [capacity]
  int64_t capacity;           // writes past it are dropped (the host checked the total)
  void* stream;               // cudaStream_t
  int32_t max_row_items = 0;  // optional hint: the longest row (sizes the shared key buffer;
                              // longer rows stay correct, read from global memory). 0: unknown
  const int32_t* seg_tail = nullptr;  // optional device [n_segments]: TopKBatch::seg_tail
};

size_t top_k_cuda_scratch_bytes(int64_t max_rows) noexcept;

// Enqueue the kernels on a.stream. Returns NULL, or the CUDA error string of a failed launch.
const char* launch_top_k_cuda(const TopKCudaLaunch& a) noexcept;

}  // namespace sieve::selection
