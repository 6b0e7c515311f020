// Host-side launchers of the delta plugin's CUDA half (delta_select.cu). Plain types only, so
// the C++ half of the plugin needs no CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>

namespace sieve::delta {

// One Δ-layer's selection from the core kernel's page statistics.
struct ObserveLaunch {
  const float* page_mass;        // device f32 [nnz_pages, heads]: S_u per (page, row head)
  const int32_t* kv_indptr;      // device int32 [batch + 1]: the view's page-table indptr
  const int32_t* last_page_len;  // device int32 [batch]
  int32_t batch;
  int32_t heads;          // selection rows per sequence (1, or n_kv_heads)
  int32_t page_size;
  int64_t recent;         // L
  int32_t budget_pages;   // K / P
  int32_t max_pages;      // pages of a max_seq_len sequence (scores scratch stride bound)
  int32_t nnz_pages;      // the view's page count (host mirror)
  int32_t max_seq_pages;  // the longest sequence's pages in this call (host mirror)
  float* scores;          // device scratch f32 [max_batch * max_pages * heads]
  void* topk_scratch;     // device scratch for core/selection's top-k
  size_t topk_scratch_bytes;
  int32_t* sel_indptr;    // device int32 [batch * heads + 1]: the stored selection
  int32_t* sel_indices;   // device int32 [capacity]
  int64_t capacity;
  void* stream;           // cudaStream_t
};

// Scratch the top-k needs for max_batch * heads rows (0: none).
size_t delta_topk_scratch_bytes(int32_t max_batch, int32_t heads, int32_t max_pages) noexcept;

// Enqueue: scores = page_mass with the page that holds the start of a straddling recency window
// forced to +inf, then the batched top-k (tail = ceil(L/P) pages, k = budget_pages - that) into
// the stored selection. No allocation, no synchronisation. NULL or the CUDA error string.
const char* launch_delta_observe(const ObserveLaunch& a) noexcept;

// Enqueue the copy of the stored selection (n_rows + 1 offsets, nnz indices) into the chain's
// selection (one kernel). NULL or the CUDA error string.
const char* copy_delta_selection(int32_t* dst_indptr, int32_t* dst_indices,
                                 const int32_t* src_indptr, const int32_t* src_indices,
                                 int32_t n_rows, int64_t nnz, void* stream) noexcept;

}  // namespace sieve::delta
