// Host-side launcher of dpxa mode=deltax's CUDA description of its attention (deltax_spans.cu):
// per sequence, the packed keys of its key blocks and the spans of its rows, which the core
// kernel's attention variant then attends for the whole batch. Plain types only, so the C++ half
// of the plugin needs no CUDA headers.
#pragma once
#include <cstdint>

#include "cuda/dpxa_select.hpp"

namespace sieve::dpxa {

struct DeltaxLaunch {
  int32_t B, hq, hkv, max_seq_len;
  int32_t H;                  // selection heads per query block (hq, or hkv with rows=kv_head)
  bool rows_per_kv_head;
  int64_t n_new, kv_len;      // this sequence's
  int32_t QB, KB;             // query blocks, key blocks of the sequence
  int64_t sel_row0;           // selection row of (query block 0, head row 0)
  int64_t var_row0;           // variant row of (query block 0, q head 0): query blocks before x hq
  const int32_t* sel_indptr;  // the selection (device CSR)
  const int32_t* sel_indices;
  const uint32_t* exact_bits; // this sequence's [QB][hq][exact_words] (dpxa_select.hpp)
  int32_t exact_words;
  const uint8_t* anchor_off;  // [hkv][KB][B] packed anchors per key block (block_pack_cuda.hpp)
  const int32_t* n_anchors;   // [hkv][KB]
  // the variant (sieve_attention_variant), written here
  int64_t packed_base;        // this sequence's first packed key: b * hkv * max_seq_len
  int64_t span_base;          // this sequence's first span: b * hq * span_stride
  int64_t span_stride;        // spans per (sequence, q head): row_span_capacity
  int32_t* packed_pos;        // [max_batch][hkv][max_seq_len]: block j's anchors from j * B
  int32_t* packed_count;      // same
  int32_t* row_spans;         // [rows][2]
  int32_t* spans;             // [max_batch][hq][span_stride][3]: row (t, h)'s from its earlier query
                              // blocks' candidates (row_prefix), at most its own candidates
  void* stream;
};

// Spans one (sequence, q head) may need: Σ_t candidates(t) over its query blocks, at most
// KB(KB+1)/2 + KB for KB key blocks (a chunked prefill's blocks straddle key blocks).
inline int64_t row_span_capacity(int32_t B, int32_t max_seq_len) {
  const int64_t blocks = (int64_t(max_seq_len) + B - 1) / B;
  return blocks * (blocks + 3) / 2;
}

// Enqueue the sequence's packed keys and spans on a.stream (no allocation, no synchronisation).
// NULL, or the CUDA error string of a failed launch.
const char* launch_deltax_spans(const DeltaxLaunch& a) noexcept;

// After launch_sequence of a mode=deltax select (a.exact_bits set): which kept tiles of each
// (query block, q head) row are exact, into a.exact_bits (deltax_exact.cu). NULL, or the CUDA
// error string of a failed launch.
const char* launch_exact_tiles(const SequenceLaunch& a) noexcept;

}  // namespace sieve::dpxa
