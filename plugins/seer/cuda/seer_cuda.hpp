// Host-side launchers of the seer plugin's CUDA kernels (seer_kernels.cu). Plain types only, so
// the C++ half of the plugin needs no CUDA headers. Every launch is enqueued on `stream` with no
// allocation and no synchronisation; lengths come from the view's device page table.
#pragma once
#include <cstddef>
#include <cstdint>

#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/page_layout.hpp"

namespace sieve::seer {

struct SeerCudaCommon {
  const int32_t* kv_indptr;      // device [batch + 1]: the view's page-table indptr
  const int32_t* kv_pages;       // device [nnz]: physical page ids
  const int32_t* last_page_len;  // device [batch]
  int32_t batch, n_q_heads, n_kv_heads, head_dim, page_size, block, gate_dim;
  bool rmsnorm;
  float rope_theta;
  float* cache;       // device sidecar [page_capacity, n_kv_heads, gate_dim + 1] f32
  PageStrides k_pre_strides;  // where a pre-RoPE key row lives (the view's layout), when k_pre is read
  void* stream;       // cudaStream_t
};

// K-compression cache: every complete block whose entry is not filled yet (grid z strides over
// blocks up to `max_complete`, the host's bound from its mirrors).
struct FillCacheLaunch {
  SeerCudaCommon c;
  const void* k_pre;  // device pre-RoPE key pages [cap, hkv, P, d]
  Storage k_elem;
  const float* wk;    // device [hkv, gate_dim, 3d] of this layer
  int32_t max_complete;
};
const char* launch_fill_cache(const FillCacheLaunch& a) noexcept;

// Scores of one decode step: block_indptr (per sequence), then per (sequence, KV head) the gate
// query and its scores over the complete blocks, scores [total blocks, hkv]; the last block of
// each sequence is -inf (forced, not ranked). `softmax`: scores become softmax probabilities over
// the complete blocks (threshold mode).
struct GateScoresLaunch {
  SeerCudaCommon c;
  const void* q_pre;  // device [batch, n_q_heads, d] (decode: one query per sequence)
  Storage q_elem;
  const float* wq;    // device [hkv, gate_dim, g*d] of this layer
  int32_t* block_indptr;  // device [batch + 1] (written)
  float* scores;          // device [max total blocks, hkv] (written)
  float* q_raw;           // device scratch [batch, hkv, gate_dim]
  float* last_score;      // device scratch [batch, hkv] (threshold mode: a complete last block)
  int32_t max_blocks;     // the host's bound on blocks per sequence (grid size)
  bool softmax;
  // fused=true: gate_query_raw also writes block_indptr (no block_offsets launch) and, with
  // catch_up, fills the cache entries of the blocks completed since the last fill (the decode
  // step's on_append launches nothing); k_pre / k_elem / wk as in FillCacheLaunch.
  bool fold_offsets = false;
  bool catch_up = false;
  const void* k_pre = nullptr;
  Storage k_elem = Storage::f32;
  const float* wk = nullptr;
};
const char* launch_gate_scores(const GateScoresLaunch& a) noexcept;

// Threshold selection: per (sequence, KV head) row, every block with score > threshold plus the
// last block, as CSR (rows = batch * hkv).
struct ThresholdLaunch {
  const int32_t* block_indptr;
  const float* scores;
  int32_t batch, n_kv_heads;
  float threshold;
  int32_t* sel_indptr;
  int32_t* sel_indices;
  int64_t capacity;
  void* stream;
};
const char* launch_threshold_select(const ThresholdLaunch& a) noexcept;

// Upload host data to a device buffer (create time only: synchronous).
const char* copy_to_device(void* dst, const void* src, size_t bytes) noexcept;

}  // namespace sieve::seer
