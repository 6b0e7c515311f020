// Host-side launcher of the deltakv CUDA kernels (deltakv_cuda.cu). Plain types only, so the C++
// half of the plugin needs no CUDA headers.
#pragma once
#include <cstdint>

#include "deltakv_math.hpp"
#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/page_layout.hpp"

namespace sieve::deltakv {

struct CudaAttendRule {
  int32_t q_block;
  int32_t phase2;           // Phase2
  int32_t count_weighting;  // 0 / 1
  float scale;
};

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
  const void* q;                 // [n_q_tokens, hq, d]
  Storage q_dt;
  void* out;
  Storage out_dt;
  int32_t batch, hq, hkv, d, page_size, max_seq_len, layer;
  int32_t max_kv_len;  // host mirrors: grid sizes
  int32_t max_new;
  KeepRule keep_rule;
  CudaAttendRule attend;
  // scratch (allocated in create)
  uint8_t* keep;           // [max_batch * hkv * max_seq_len]
  int32_t* chunk_anchors;  // [max_batch * hkv * chunks_per_seq], chunks_per_seq from max_seq_len
  int32_t* anchor;         // [max_batch * hkv * max_seq_len]
  int32_t* reach;          // same
  int32_t* anchor_page;    // same: physical page of each anchor (-1: bad page-table entry), so the
                           // tensor-core loader gathers K̂/V̂ rows with one independent load per key
  int32_t* n_anchors;      // [max_batch * hkv]
  void* stream;            // cudaStream_t
};

// Stage 1 (keep mask), stage 2 (anchors, reach, counts) and stage 3 (attention into out), all
// enqueued on a.stream: no allocation, no synchronisation. NULL, or the CUDA error of a launch.
const char* launch_deltakv(const CudaLaunch& a) noexcept;
// Stages 1 and 2 only (tests compare them with the CPU's).
const char* launch_deltakv_pack(const CudaLaunch& a) noexcept;
// Copies n_anchors[0 .. batch * hkv) to host memory and waits for the stream (report=on only).
const char* read_anchor_counts(const CudaLaunch& a, int32_t* host) noexcept;

// Head dims the attention kernel is compiled for.
inline bool cuda_head_dim_supported(int32_t d) {
  return d == 8 || d == 16 || d == 32 || d == 64 || d == 128;
}
inline const char* cuda_head_dims() { return "8, 16, 32, 64 or 128"; }

}  // namespace sieve::deltakv
