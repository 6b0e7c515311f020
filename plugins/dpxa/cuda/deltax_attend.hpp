// Host-side launcher of dpxa mode=deltax's CUDA attention (deltax_attend.cu), one sequence at a
// time. Plain types only, so the C++ half of the plugin needs no CUDA headers.
#pragma once
#include <cstdint>

#include "cuda/dpxa_select.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/page_layout.hpp"

namespace sieve::dpxa {

struct DeltaxLaunch {
  int32_t B, d, hq, hkv, page_size;
  int32_t H;                  // selection heads per query block (hq, or hkv with rows=kv_head)
  bool rows_per_kv_head;
  float scale;                // 1/sqrt(d)
  const void* q;              // call.q [n_q_tokens, hq, d]
  Storage q_dtype;
  int64_t q_token0;           // this sequence's first row of q / out
  int64_t n_new, kv_len;
  const void* k_pages;        // [capacity, hkv, page_size, d] (data_ptr of the view's pages)
  const void* v_pages;
  PageStrides kv_strides;     // the layout of both (view_page_strides: K and V share it)
  Storage kv_dtype;
  const int32_t* pages;       // device: this sequence's physical page ids
  void* out;                  // [n_q_tokens, hq, d]
  Storage out_dtype;
  int32_t QB, KB;             // query blocks, key blocks of the sequence
  int64_t sel_row0;           // selection row of (query block 0, head row 0)
  const int32_t* sel_indptr;  // the selection (device CSR)
  const int32_t* sel_indices;
  const uint32_t* exact_bits; // this sequence's [QB][hq][exact_words] (dpxa_select.hpp)
  int32_t exact_words;
  const uint8_t* anchor_off;  // [hkv][KB][B] packed anchors per key block (block_pack_cuda.hpp)
  const int32_t* n_anchors;   // [hkv][KB]
  void* stream;
};

// Enqueue the sequence's attention on a.stream (no allocation, no synchronisation). NULL, or the
// CUDA error string of a failed launch.
const char* launch_deltax_attend(const DeltaxLaunch& a) noexcept;

// After launch_sequence of a mode=deltax select (a.exact_bits set): which kept tiles of each
// (query block, q head) row are exact, into a.exact_bits (deltax_exact.cu). NULL, or the CUDA
// error string of a failed launch.
const char* launch_exact_tiles(const SequenceLaunch& a) noexcept;

}  // namespace sieve::dpxa
