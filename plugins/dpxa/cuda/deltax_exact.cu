// DeltaX's exact tiles on CUDA (dpxa mode=deltax): after dpxa's select of one sequence, which of
// each row's kept tiles DeltaXAttention computes exactly (deltax_attention.hpp), ranked on the
// device from the shares the select's greedy kernel left.
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cmath>

#include "cuda/deltax_spans.hpp"
#include "cuda/select_device.cuh"
#include "math/dpxa_tiles.hpp"

namespace sieve::dpxa {
namespace {

// deltax: per (query block t, q head h), the tiles of h's selection row (its own kept tiles, or
// the group's union with rows=kv_head) that are neither sink nor diagonal, ranked by h's share
// with ties to the lower block (the order key of the greedy, over shares), as deltax.hpp's
// exact_tiles on the CPU; the first ceil(exact_top · n) get their bit set. A bitonic sort in
// shared memory as in greedy_kernel; bits are gathered with shared atomics, then stored whole.
__global__ void __launch_bounds__(kGreedyThreads) exact_kernel(const SequenceLaunch a) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Reduce = cub::BlockReduce<int32_t, kGreedyThreads>;
  __shared__ typename Reduce::TempStorage reduce_temp;
  __shared__ int32_t n_rank;
  const auto [t, h, r, n, pow2, keys] = sort_row(a, smem);
  uint32_t* words = reinterpret_cast<uint32_t*>(keys + pow2);    // [exact_words]
  const int64_t prefix = row_prefix(a, t);
  const int32_t hrow = a.rows_per_kv_head ? h / (a.hq / a.hkv) : h;
  const float* shares = a.shares + int64_t(h) * a.tiles_per_head + prefix;
  int32_t members = 0;
  for (int32_t j = threadIdx.x; j < pow2; j += blockDim.x) {
    const bool member = j < n && !forced(r, j) && row_keeps(a, t, hrow, prefix, j);
    members += member ? 1 : 0;
    keys[j] = member ? order_key(shares[j], j) : 0ull;  // members' keys are never 0
  }
  for (int32_t i = threadIdx.x; i < a.exact_words; i += blockDim.x) words[i] = 0u;
  members = Reduce(reduce_temp).Sum(members);
  if (threadIdx.x == 0) {
    // exact_tiles' count: ceil in double, the 1e-6 absorbing products like 0.3 · 10.
    const int32_t top = int32_t(ceil(double(a.exact_top) * members - 1e-6));
    n_rank = top < members ? top : members;
  }
  __syncthreads();
  sort_descending(keys, pow2);
  for (int32_t i = threadIdx.x; i < n_rank; i += blockDim.x) {
    const int32_t j = order_index(keys[i]);
    atomicOr(&words[j >> 5], 1u << (j & 31));
  }
  __syncthreads();
  uint32_t* out = a.exact_bits + (int64_t(t) * a.hq + h) * a.exact_words;
  for (int32_t i = threadIdx.x; i < a.exact_words; i += blockDim.x) out[i] = words[i];
}

}  // namespace

const char* launch_exact_tiles(const SequenceLaunch& a) noexcept {
  const size_t bytes = size_t(pow2_at_least(a.KB)) * 8 + size_t(a.exact_words) * 4;
  if (const cudaError_t e = cudaFuncSetAttribute(exact_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
      e != cudaSuccess)
    return cudaGetErrorString(e);
  exact_kernel<<<dim3(unsigned(a.QB), unsigned(a.hq)), kGreedyThreads, bytes, static_cast<cudaStream_t>(a.stream)>>>(a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace sieve::dpxa
