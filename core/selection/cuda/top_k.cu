// Batched CUDA top-k (top_k_cuda.hpp). One block per row; the k-th best key of a row is found by
// a 4 x 8-bit radix select over order_key() (MSB first) in shared memory, so the chosen set —
// every key above the threshold plus the lowest-indexed keys equal to it — is exactly the CPU's
// (key desc, index asc) top k. Ordered writes come from block-wide exclusive scans.
#include <cuda_runtime.h>

#include <climits>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "sieve/selection/top_k_cuda.hpp"

namespace sieve::selection {
namespace {

constexpr int kThreads = 256;
constexpr int kScanThreads = 1024;
constexpr int kMaxRowBlocks = 65535;

struct RowInfo {
  ClippedRow c;
  const float* scores;  // item j at scores[j * item_stride]
  int64_t item_stride;
};

__device__ RowInfo row_info(const TopKCudaLaunch& a, int32_t r) {
  const int32_t s = r / a.rows_per_segment, h = r % a.rows_per_segment;
  const int32_t begin = a.seg_indptr[s];
  RowInfo info;
  info.c = clip({a.seg_indptr[s + 1] - begin, a.head, a.tail, a.k});
  info.scores = a.scores + int64_t(begin) * a.layout.item_stride + int64_t(h) * a.layout.head_stride;
  info.item_stride = a.layout.item_stride;
  return info;
}

__device__ __forceinline__ uint32_t key_at(const RowInfo& row, int32_t j) {
  return order_key(row.scores[int64_t(j) * row.item_stride]);
}

// Kernel 1: kept entries per row.
__global__ void __launch_bounds__(kThreads) top_k_counts(TopKCudaLaunch a, int32_t n_rows) {
  using Reduce = cub::BlockReduce<int32_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  auto* counts = static_cast<int32_t*>(a.scratch);
  for (int32_t r = int32_t(blockIdx.x); r < n_rows; r += int32_t(gridDim.x)) {
    const RowInfo row = row_info(a, r);
    int32_t finite = 0;
    if (!row.c.keeps_all())
      for (int32_t j = row.c.middle_begin() + int32_t(threadIdx.x); j < row.c.middle_end();
           j += kThreads)
        finite += key_at(row, j) != 0u;
    const int32_t total = Reduce(temp).Sum(finite);
    if (threadIdx.x == 0) counts[r] = kept_count(row.c, total);
    __syncthreads();  // temp reuse
  }
}

// Kernel 2: counts -> CSR indptr (one block, chunked scan).
__global__ void __launch_bounds__(kScanThreads) top_k_offsets(TopKCudaLaunch a, int32_t n_rows) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  const auto* counts = static_cast<const int32_t*>(a.scratch);
  int32_t running = 0;
  for (int32_t base = 0; base < n_rows; base += kScanThreads) {
    const int32_t r = base + int32_t(threadIdx.x);
    const int32_t v = r < n_rows ? counts[r] : 0;
    int32_t prefix, total;
    Scan(temp).ExclusiveSum(v, prefix, total);
    if (r < n_rows) a.sel_indptr[r] = running + prefix;
    running += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) a.sel_indptr[n_rows] = running;
}

__device__ __forceinline__ void put(const TopKCudaLaunch& a, int64_t at, int32_t v) {
  if (at < a.capacity) a.sel_indices[at] = v;
}

// Kernel 3: the kept indices of each row, ascending.
__global__ void __launch_bounds__(kThreads) top_k_write(TopKCudaLaunch a, int32_t n_rows) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int32_t hist[256];
  __shared__ uint32_t s_prefix;
  __shared__ int32_t s_remaining;
  const auto* counts = static_cast<const int32_t*>(a.scratch);
  for (int32_t r = int32_t(blockIdx.x); r < n_rows; r += int32_t(gridDim.x)) {
    const RowInfo row = row_info(a, r);
    const ClippedRow& c = row.c;
    const int64_t out = a.sel_indptr[r];
    if (c.keeps_all()) {
      for (int32_t j = int32_t(threadIdx.x); j < c.n; j += kThreads) put(a, out + j, j);
      continue;
    }
    const int32_t take = counts[r] - c.head - c.tail;  // chosen middle items
    for (int32_t j = int32_t(threadIdx.x); j < c.head; j += kThreads) put(a, out + j, j);
    for (int32_t j = int32_t(threadIdx.x); j < c.tail; j += kThreads)
      put(a, out + c.head + take + j, c.middle_end() + j);
    if (take <= 0) continue;

    // Threshold: with at most k finite middle items all of them are taken (threshold 0 excludes
    // only -inf/NaN); otherwise the k-th largest key by radix select, MSB first.
    uint32_t threshold = 0;
    int32_t need_equal = 0;
    if (take == c.k) {  // take < k: every finite middle item fits
      if (threadIdx.x == 0) {
        s_prefix = 0;
        s_remaining = c.k;
      }
      uint32_t mask = 0;
      for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = int(threadIdx.x); i < 256; i += kThreads) hist[i] = 0;
        __syncthreads();
        const uint32_t prefix = s_prefix;
        for (int32_t j = c.middle_begin() + int32_t(threadIdx.x); j < c.middle_end(); j += kThreads) {
          const uint32_t key = key_at(row, j);
          if (key != 0u && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
          int32_t remaining = s_remaining, bin = 255;
          for (; bin > 0; --bin) {
            if (hist[bin] >= remaining) break;
            remaining -= hist[bin];
          }
          s_remaining = remaining;
          s_prefix = prefix | (uint32_t(bin) << shift);
        }
        mask |= 255u << shift;
        __syncthreads();
      }
      threshold = s_prefix;
      need_equal = s_remaining;  // keys equal to the threshold still to take, lowest index first
    }

    // Ordered pass over the middle: pick = key > threshold, or key == threshold among the first
    // need_equal such items.
    int32_t picked_before = 0, equal_before = 0;
    for (int32_t base = c.middle_begin(); base < c.middle_end(); base += kThreads) {
      const int32_t j = base + int32_t(threadIdx.x);
      const uint32_t key = j < c.middle_end() ? key_at(row, j) : 0u;
      const int32_t equal = (threshold != 0u && key == threshold) ? 1 : 0;
      int32_t equal_rank, equal_total;
      Scan(temp).ExclusiveSum(equal, equal_rank, equal_total);
      __syncthreads();
      const int32_t pick =
          (key > threshold || (equal && equal_before + equal_rank < need_equal)) ? 1 : 0;
      int32_t pick_rank, pick_total;
      Scan(temp).ExclusiveSum(pick, pick_rank, pick_total);
      __syncthreads();
      if (pick) put(a, out + c.head + picked_before + pick_rank, j);
      picked_before += pick_total;
      equal_before += equal_total;
    }
  }
}

}  // namespace

size_t top_k_cuda_scratch_bytes(int64_t max_rows) noexcept {
  return sizeof(int32_t) * size_t(max_rows > 0 ? max_rows : 1);
}

const char* launch_top_k_cuda(const TopKCudaLaunch& a) noexcept {
  const int64_t rows64 = int64_t(a.n_segments) * a.rows_per_segment;
  if (rows64 < 0 || rows64 > INT32_MAX) return "top-k: row count out of range";
  const int32_t n_rows = int32_t(rows64);
  auto stream = static_cast<cudaStream_t>(a.stream);
  const int grid = n_rows < kMaxRowBlocks ? (n_rows > 0 ? n_rows : 1) : kMaxRowBlocks;
  if (n_rows > 0) {
    top_k_counts<<<grid, kThreads, 0, stream>>>(a, n_rows);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  }
  top_k_offsets<<<1, kScanThreads, 0, stream>>>(a, n_rows);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  if (n_rows > 0) {
    top_k_write<<<grid, kThreads, 0, stream>>>(a, n_rows);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  }
  return nullptr;
}

}  // namespace sieve::selection
