// Host-side launcher of the streaming plugin's CUDA selection kernels (streaming_select.cu).
// Plain types only, so the C++ half of the plugin needs no CUDA headers.
#pragma once
#include <cstdint>

namespace sieve::streaming {

struct SelectLaunch {
  const int32_t* qo_indptr;      // device int32 [batch + 1]: query tokens per sequence
  const int32_t* kv_indptr;      // device int32 [batch + 1]: the view's page-table indptr
  const int32_t* last_page_len;  // device int32 [batch]
  int32_t batch;
  int32_t page_size;
  int32_t q_block;  // page_size for prefill, 1 for decode
  int64_t sink;
  int64_t window;
  int32_t* row_start;    // device scratch int32 [batch + 1] (first row of each sequence)
  int32_t* sel_indptr;   // device int32 [n_rows + 1]
  int32_t* sel_indices;  // device int32 [capacity]
  int32_t n_rows;        // as the host computed it from the host mirrors
  int64_t capacity;
  void* stream;  // cudaStream_t
};

// Enqueue the two kernels on a.stream (no allocation, no synchronisation). Returns NULL, or the
// CUDA error string of a failed launch.
const char* launch_streaming_select(const SelectLaunch& a) noexcept;

}  // namespace sieve::streaming
