// Host-side launcher of the deltakv CUDA kernels (deltakv_cuda.cu): stages 1-2 and stage 3's
// description as the core kernel's attention variant. Plain types only, so the C++ half of the
// plugin needs no CUDA headers.
#pragma once
#include <cstdint>

#include "deltakv_math.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/page_layout.hpp"

namespace sieve::deltakv {

struct CudaLaunch {
  // the call (device arrays; lengths are read on the device)
  const int32_t* qo_indptr;      // [batch + 1]
  const int32_t* kv_indptr;      // [batch + 1]
  const int32_t* last_page_len;  // [batch]
  const int32_t* kv_indices;     // [kv_indices_len]
  int64_t kv_indices_len;
  const void* k;                 // pages [page_capacity, hkv, page_size, d] (data_ptr of the view's)
  const void* v;
  PageStrides kv_strides;        // their layout (view_page_strides: K and V share it)
  int64_t page_capacity;
  Storage kv_dt;
  int32_t batch, hq, hkv, d, page_size, max_seq_len, layer;
  int32_t max_kv_len;  // host mirror: grid sizes
  KeepRule keep_rule;
  // scratch (allocated in create)
  uint8_t* keep;           // [max_batch * hkv * max_seq_len]
  int32_t* chunk_anchors;  // [max_batch * hkv * chunks_per_seq], chunks_per_seq from max_seq_len
  int32_t* anchor;         // [max_batch * hkv * max_seq_len]
  int32_t* reach;          // same
  int32_t* anchor_page;    // same: physical page of each anchor (-1: bad page-table entry)
  int32_t* n_anchors;      // [max_batch * hkv]
  void* stream;            // cudaStream_t
};

// Stage 3's variant (sieve_attention_variant, rows per KV head): what launch_deltakv_spans writes.
struct CudaSpans {
  int32_t q_block;       // the rule's block of positions (safe anchors precede it)
  int32_t phase2;        // Phase2
  int32_t rows_q_block;  // query tokens per variant row (variant_q_block)
  int32_t* count;        // [max_batch * hkv * max_seq_len]: reach - anchor + 1 of each anchor
  int32_t* row_spans;    // [rows, 2]
  int32_t* spans;        // [2 * rows, 3]
};

// Stage 1 (keep mask) and stage 2 (anchors, reach, counts), enqueued on a.stream: no allocation,
// no synchronisation. NULL, or the CUDA error of a launch.
const char* launch_deltakv_pack(const CudaLaunch& a) noexcept;
// After launch_deltakv_pack: each anchor's count and each variant row's spans (variant_spans),
// enqueued on a.stream. The core kernel then attends them.
const char* launch_deltakv_spans(const CudaLaunch& a, const CudaSpans& s, int32_t max_new) noexcept;
// Copies n_anchors[0 .. batch * hkv) to host memory and waits for the stream (report=on only).
const char* read_anchor_counts(const CudaLaunch& a, int32_t* host) noexcept;

// Head dims the stage 1-2 kernels take (a lane holds up to four of 128 dimensions).
inline bool cuda_head_dim_supported(int32_t d) { return d >= 1 && d <= 128; }
inline const char* cuda_head_dims() { return "1 to 128"; }

}  // namespace sieve::deltakv
