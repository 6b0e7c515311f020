// Host-side launcher of the dpxa plugin's CUDA selection (dpxa_select.cu), one sequence at a
// time. Plain types only, so the C++ half of the plugin needs no CUDA headers.
#pragma once
#include <cstddef>
#include <cstdint>

#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/page_layout.hpp"

namespace sieve::dpxa {

constexpr int32_t kCudaMaxQHeads = 256;

struct SequenceLaunch {
  // Method.
  int32_t estimator;  // Estimator
  int32_t B, S, d, hq, hkv, page_size;
  float q_threshold, k_threshold, scale, scale_over_s;
  bool rows_per_kv_head;
  float tau[kCudaMaxQHeads];  // per q head, for this layer
  // The sequence.
  const void* q;          // call.q [n_q_tokens, hq, d]
  Storage q_dtype;
  Storage kv_dtype;
  int64_t q_token0;       // this sequence's first row of q
  int64_t n_new, kv_len;
  const void* k_pages;    // [capacity, hkv, page_size, d] (data_ptr of the view's k_pages)
  PageStrides k_strides;  // ... laid out as these strides say (sieve/util/page_layout.hpp)
  const int32_t* pages;   // device: this sequence's physical page ids (view.indices + indptr[b])
  int32_t QB, KB;         // query blocks, candidate key blocks (ceil(kv_len / B))
  int64_t tiles_per_head; // Σ_t n_candidates(t)
  // Scratch (allocated in create, sized for one sequence of max_seq_len).
  uint8_t* q_anchors;  // [hq][QB][B]
  int32_t* q_counts;   // [hq][QB]
  uint8_t* k_anchors;  // [hkv][KB][B]
  int32_t* k_counts;   // [hkv][KB]
  float* tiles;        // [hq][tiles_per_head][2]: (m, s)
  uint8_t* keep;       // [hq][tiles_per_head]
  int32_t* row_counts; // [QB * H]
  // mode=deltax (NULL / 0 otherwise): the greedy kernel also writes each candidate's normalised
  // share w_j / Σw (as row_shares on the CPU) to shares [hq][tiles_per_head]; then a kernel ranks
  // each (query block, q head)'s kept off-diagonal non-sink tiles by share and sets the bits of the
  // top ceil(exact_top · n) in exact_bits: this sequence's [QB][hq][exact_words] words, bit j of a
  // row = key block j computed exactly (deltax.hpp exact_tiles; sink and diagonal not included).
  float* shares;
  uint32_t* exact_bits;
  int32_t exact_words;
  float exact_top;
  // The selection: this sequence's rows start at row0; the sequence before left indptr[row0].
  int32_t row0;
  int32_t* sel_indptr;
  int32_t* sel_indices;
  int64_t capacity;
  void* stream;
};

// Scratch bytes for one sequence of up to max_seq_len tokens.
struct ScratchSizes {
  size_t q_anchors, q_counts, k_anchors, k_counts, tiles, keep, row_counts;
};
ScratchSizes scratch_sizes(int32_t max_seq_len, int32_t B, int32_t hq, int32_t hkv);

// Enqueue the sequence's kernels on a.stream (no allocation, no synchronisation). Returns NULL or
// the CUDA error string of a failed launch.
const char* launch_sequence(const SequenceLaunch& a) noexcept;
// A call without queries: writes indptr[0] = 0 (the only entry of an empty selection).
const char* launch_empty(const SequenceLaunch& a) noexcept;

}  // namespace sieve::dpxa
