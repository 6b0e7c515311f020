// Device helpers of dpxa's selection kernels (dpxa_select.cu) that DeltaX's exact-tile ranking
// (deltax_exact.cu) shares: element reads of Q and the paged K, the closed-form tile offset of a
// query block, the kept flag of a selection row, and the per-row start (sort_row) and CTA-wide
// bitonic sort the greedy cover and the ranking both use. Included by .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/dpxa_select.hpp"
#include "math/dpxa_tiles.hpp"

namespace sieve::dpxa {
namespace {

constexpr int kGreedyThreads = 256;  // CTA width of the per-row kernels (greedy, offsets, exact)

template <class T>
__device__ const T* key_row_t(const SequenceLaunch& a, int32_t kvh, int64_t pos) {
  return static_cast<const T*>(a.k_pages) + a.k_strides.row(a.pages[pos / a.page_size], kvh, pos % a.page_size);
}
template <class T>
__device__ const T* query_row_t(const SequenceLaunch& a, int32_t h, int64_t i) {
  return static_cast<const T*>(a.q) + ((a.q_token0 + i) * a.hq + h) * a.d;
}

// Tiles of query blocks 0 .. t-1 of one head of the sequence (dpxa_tiles.hpp's row_prefix).
__device__ __forceinline__ int64_t row_prefix(const SequenceLaunch& a, int32_t t) {
  return sieve::dpxa::row_prefix(a.kv_len, a.n_new, a.B, t);
}

// The power of two the bitonic sort of n keys spans (1 for n <= 1).
__host__ __device__ __forceinline__ int32_t pow2_at_least(int32_t n) {
  int32_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

// What a per-row kernel (greedy cover, exact ranking) starts from: its row (query block t =
// blockIdx.x, head h = blockIdx.y), the row's candidates and the sort keys at the start of its
// dynamic shared memory, sized for its own candidates rounded up to a power of two.
struct SortRow {
  int32_t t, h;
  RowSpan r;
  int32_t n, pow2;
  uint64_t* keys;  // [pow2]
};
__device__ __forceinline__ SortRow sort_row(const SequenceLaunch& a, unsigned char* smem) {
  SortRow s;
  s.t = blockIdx.x;
  s.h = blockIdx.y;
  s.r = row_span(a.kv_len, a.n_new, a.B, s.t);
  s.n = s.r.n_candidates;
  s.pow2 = pow2_at_least(s.n);
  s.keys = reinterpret_cast<uint64_t*>(smem);
  return s;
}

// Block-wide bitonic sort of keys[0 .. pow2) (a power of two), descending; every thread of the
// CTA calls it, and it ends on a barrier.
__device__ void sort_descending(uint64_t* keys, int32_t pow2) {
  for (int32_t size = 2; size <= pow2; size <<= 1)  // bitonic sort, descending
    for (int32_t stride = size >> 1; stride > 0; stride >>= 1) {
      for (int32_t i = threadIdx.x; i < pow2; i += blockDim.x) {
        const int32_t p = i ^ stride;
        if (p > i) {
          const bool desc = (i & size) == 0;
          const uint64_t x = keys[i], y = keys[p];
          if (desc ? x < y : x > y) {
            keys[i] = y;
            keys[p] = x;
          }
        }
      }
      __syncthreads();
    }
}

// Kept flag of key block j in local selection row (t, hrow).
__device__ bool row_keeps(const SequenceLaunch& a, int32_t t, int32_t hrow, int64_t prefix,
                          int32_t j) {
  if (!a.rows_per_kv_head) return a.keep[int64_t(hrow) * a.tiles_per_head + prefix + j] != 0;
  const int32_t group = a.hq / a.hkv;
  for (int32_t h = hrow * group; h < (hrow + 1) * group; ++h)
    if (a.keep[int64_t(h) * a.tiles_per_head + prefix + j]) return true;
  return false;
}

}  // namespace
}  // namespace sieve::dpxa
