// Delta-KV's delta keep walk (cosine) on the GPU with one chunk per key block, over one sequence's
// paged keys: the packing dpxa's mode=deltax attends through. Plain types only, so C++ callers
// need no CUDA headers (sieve_packing_cuda; core/packing/cuda/block_pack.cu).
//
// The decisions are bit-identical to packing::keep_mask (keep_rule.hpp) with
// KeepRule{kDelta, kCos, threshold, ., ., chunk = B} over the same keys converted to f32: a warp
// walks a block, lane l sums dimensions l, l + 32, ... with fused multiply-adds and the partial
// sums meet in the xor butterfly that key_sums reproduces on the host.
#pragma once
#include <cstdint>

#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/page_layout.hpp"

namespace sieve::packing {

struct BlockPackLaunch {
  const void* k_pages;   // [capacity, hkv, page_size, d] (data_ptr of the view's k_pages)
  PageStrides k_strides; // ... laid out as these strides say (page_strides)
  Storage kv_dtype;
  const int32_t* pages;  // device: the sequence's physical page ids, in order
  int32_t hkv, d, page_size;
  int64_t n;             // keys of the sequence
  int32_t B;             // block (= chunk) length, 1..256: anchor offsets are bytes
  float threshold;       // a key with cosine < threshold to its run's anchor becomes an anchor
  uint8_t* keep;         // optional [hkv][n]: 1 for anchors (tests compare it with keep_mask)
  uint8_t* anchor_off;   // [hkv][ceil(n / B)][B]: offsets in the block of its anchors, ascending
  int32_t* n_anchors;    // [hkv][ceil(n / B)]: anchors per block (>= 1)
  void* stream;          // cudaStream_t
};

constexpr int32_t kBlockPackMaxD = 256;

// Enqueue the walk on a.stream (no allocation, no synchronisation). NULL, or why it could not.
const char* launch_block_pack(const BlockPackLaunch& a) noexcept;

}  // namespace sieve::packing
