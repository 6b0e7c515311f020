// Host-side launchers of the delta_correction CUDA kernels (delta_apply.cu). Plain types only, so
// the C++ half of the plugin needs no CUDA headers. Every launcher enqueues on a.stream, allocates
// nothing and never synchronises; it returns NULL or the CUDA error string of a failed launch.
#pragma once
#include <cstdint>

#include "sieve/util/dtype_dispatch.hpp"

namespace sieve::delta_correction {

struct ApplyLaunch {
  const int32_t* qo_indptr;  // device int32 [batch + 1]
  int32_t batch;
  int32_t n_tokens;          // qo_indptr_host[batch]
  int64_t gamma;
  int64_t tail;
  bool interpolate;
  int64_t row_elems;         // n_q_heads * head_dim
  void* out;                 // [n_tokens, row_elems] in out_dtype
  Storage out_dtype;
  int32_t* q_rows;           // device int32 [n_dense]: written by launch_rows
  int64_t n_dense;           // as the host computed it from its mirror
  int32_t* anchor_tokens;    // device int32 [n_anchors]: written by launch_rows
  int64_t n_anchors;
  int32_t* seq_offsets;      // device int32 [2 (batch + 1)]: first dense row, first anchor per sequence
  float* saved;              // device f32 [n_anchors, row_elems]: O*(anchor), then Δ
  void* stream;              // cudaStream_t
};

// The dense rows (anchors then tail, per sequence) -> q_rows, each anchor's token ->
// anchor_tokens, per-sequence offsets -> seq_offsets.
const char* launch_rows(const ApplyLaunch& a) noexcept;
// saved[k] = O*(anchor k), read from out (before the dense call overwrites it).
const char* launch_save_anchors(const ApplyLaunch& a) noexcept;
// After the dense call: saved[k] = out(anchor k) − saved[k] (Δ), then every corrected row
// += its anchor's Δ (or the interpolated blend).
const char* launch_apply(const ApplyLaunch& a) noexcept;

}  // namespace sieve::delta_correction

namespace sieve::delta_correction {

// The tiled anchor path: an anchor's dense row is split at the first anchor of its block of
// `anchor_block` anchors into bulk keys (every whole key block before that anchor, common to the whole
// block) and near keys (the rest, up to the anchor itself). The bulk of all anchors runs as ONE
// causal prefill of the compacted anchor queries through the core's tiled tensor-core kernel
// (the block's anchors share every K/V tile; no bulk key is past any anchor's causal limit), the
// near keys through the core's row kernel on the original queries (exact causality), and the two
// partial outputs are merged by their log-sum-exp. The tail rows run as one causal prefill of
// the compacted tail queries. Launch pieces (delta_apply.cu), in stream order:
//   launch_tiled_setup     lists, compacted-query offsets, both selections (CSR), on the device
//   launch_tiled_gather    q of the anchors -> q_anchor, q of the tail rows -> q_tail
//   (host: three core attention calls)
//   launch_tiled_finish    merge -> out at the anchors (and Δ into saved in delta mode), tail
//                          rows scattered into out, then the corrected rows updated (delta mode)
struct TiledLaunch {
  ApplyLaunch base;            // q_rows unused; anchor_tokens, seq_offsets, saved as in ApplyLaunch
  const int32_t* kv_indptr;    // device int32 [batch + 1]: the view's page table
  const int32_t* last_page_len;  // device int32 [batch]
  int32_t page_size;
  int32_t anchor_block;        // anchors per bulk selection row (and per near-key row block)
  int32_t k_block_pages;       // pages per key block of the bulk selection
  int32_t* tail_tokens;        // device int32 [n_tail]
  int64_t n_tail;
  int32_t* qo_anchor;          // device int32 [batch + 1]: compacted anchors per sequence
  int32_t* qo_tail;            // device int32 [batch + 1]
  int32_t* bulk_indptr;        // device int32 [n_bulk_rows + 1]
  int32_t* bulk_indices;       // device int32 [bulk_capacity]
  int32_t n_bulk_rows;
  int64_t bulk_capacity;
  int32_t* near_indptr;        // device int32 [n_near_rows + 1]
  int32_t* near_indices;       // device int32 [near_capacity]
  int32_t n_near_rows;
  int64_t near_capacity;
  int32_t* row_bases;          // device int32 [2 (batch + 1)]: first bulk row, first near row
  const void* q;               // [n_tokens, row_elems] in q_dtype
  Storage q_dtype;
  void* q_anchor;              // [n_anchors, row_elems] in q_dtype
  void* q_tail;                // [n_tail, row_elems] in q_dtype
  const float* out_bulk;       // f32 [n_anchors, row_elems]
  const float* lse_bulk;       // f32 [n_anchors, n_q_heads]
  const float* lse_near;       // f32 [n_tokens, n_q_heads] (rows of the anchors)
  const void* out_tail;        // [n_tail, row_elems] in out_dtype
  int32_t n_q_heads;
  int32_t head_dim;
  bool delta;                  // mode=delta (else recompute)
};

const char* launch_tiled_setup(const TiledLaunch& t) noexcept;
const char* launch_tiled_gather(const TiledLaunch& t) noexcept;
const char* launch_tiled_finish(const TiledLaunch& t) noexcept;

}  // namespace sieve::delta_correction
