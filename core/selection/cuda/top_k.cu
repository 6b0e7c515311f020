// Batched CUDA top-k (top_k_cuda.hpp). Two kernels, a block of 512 threads per row:
//   top_k_select: the row's middle keys (order_key()) go to shared memory (rows longer than the
//                 buffer are re-read from global memory instead); the finite ones are counted and,
//                 when more than k, the k-th best key is found by a search over [lowest, highest]
//                 finite key, three pivots a round (at most 16 rounds of block-wide counts of
//                 keys >= pivot: no atomics, no histogram, no worse on skewed distributions). Writes the row's plan: kept count,
//                 threshold key, how many keys equal to it to take (the lowest-indexed ones).
//   top_k_emit:   the row's CSR offset (the sum of the kept counts of the rows before it, or the
//                 indptr a one-block scan wrote when there are many rows), then the kept indices
//                 in ascending order: each thread owns a contiguous run of the middle, one block
//                 scan of (picked above the threshold, equal to it) gives every thread its place.
// The chosen set — every key above the threshold plus the lowest-indexed keys equal to it — is
// exactly the CPU's (key desc, index asc) top k. No allocation and no synchronisation: the
// scratch (one plan per row) is sized at create with top_k_cuda_scratch_bytes(max_rows).
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <initializer_list>

#include <cub/block/block_scan.cuh>

#include "sieve/selection/top_k_cuda.hpp"

namespace sieve::selection {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kScanThreads = 1024;
constexpr int32_t kPrefixRows = 4096;      // up to this many rows, each block sums its own offset
constexpr int32_t kDefaultKeys = 4096;     // shared key buffer without a max_row_items hint
constexpr int32_t kMaxKeys = 24576;        // shared key buffer at most (~99 KB with the padding)

struct RowPlan {
  int32_t count;       // entries the row keeps
  uint32_t threshold;  // keys above it are taken; 0: every finite middle key is taken
  int32_t need_equal;  // keys equal to the threshold to take, lowest index first
};

struct RowInfo {
  ClippedRow c;
  const float* scores;  // item j at scores[j * item_stride]
  int64_t item_stride;
};

__device__ RowInfo row_info(const TopKCudaLaunch& a, int32_t r) {
  const int32_t s = r / a.rows_per_segment, h = r % a.rows_per_segment;
  const int32_t begin = a.seg_indptr[s];
  RowInfo info;
  info.c = clip({a.seg_indptr[s + 1] - begin, a.head, segment_tail(a.seg_tail, s, a.tail), a.k});
  info.scores = a.scores + int64_t(begin) * a.layout.item_stride + int64_t(h) * a.layout.head_stride;
  info.item_stride = a.layout.item_stride;
  return info;
}

__device__ __forceinline__ uint32_t key_at(const RowInfo& row, int32_t j) {
  return order_key(row.scores[int64_t(j) * row.item_stride]);
}

// Shared slot of middle item i in the emit kernel: one padding word per 32, so the threads'
// contiguous runs (stride = run length) spread over the banks.
__device__ __forceinline__ int32_t padded(int32_t i) { return i + (i >> 5); }
size_t key_buffer_bytes(int32_t keys) { return sizeof(uint32_t) * (size_t(keys) + size_t(keys) / 32 + 1); }

// Block-wide sums of N values, every thread gets them. Double-buffered partials: one barrier per
// call (the barrier of call i also orders the reads of call i - 1 before the writes of call i + 1).
template <int N>
struct BlockSums {
  int32_t (*partials)[N][kWarps];
  int parity = 0;
  __device__ void operator()(int32_t (&v)[N]) {
#pragma unroll
    for (int n = 0; n < N; ++n) v[n] = __reduce_add_sync(0xffffffffu, v[n]);
    if ((threadIdx.x & 31) == 0)
#pragma unroll
      for (int n = 0; n < N; ++n) partials[parity][n][threadIdx.x >> 5] = v[n];
    __syncthreads();
#pragma unroll
    for (int n = 0; n < N; ++n) {
      int32_t total = 0;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) total += partials[parity][n][w];
      v[n] = total;
    }
    parity ^= 1;
  }
};
struct BlockSum {
  int32_t (*partials)[1][kWarps];
  BlockSums<1> sums{partials};
  __device__ int32_t operator()(int32_t v) {
    int32_t x[1] = {v};
    sums(x);
    return x[0];
  }
};

__global__ void __launch_bounds__(kThreads) top_k_select(TopKCudaLaunch a, int32_t n_rows, int32_t cap) {
  extern __shared__ uint32_t keys[];
  __shared__ int4 partials[2][kWarps];  // per warp: three counts (or count, min, max), double-buffered
  int parity = 0;
  // Block-wide reduction of three values (x, y, z: sums, or y/z min/max of unsigned keys); one
  // barrier per call, as BlockSums.
  auto reduce3 = [&](int32_t& x, int32_t& y, int32_t& z, bool minmax) {
    x = __reduce_add_sync(0xffffffffu, x);
    if (minmax) {
      y = int32_t(__reduce_min_sync(0xffffffffu, uint32_t(y)));
      z = int32_t(__reduce_max_sync(0xffffffffu, uint32_t(z)));
    } else {
      y = __reduce_add_sync(0xffffffffu, y);
      z = __reduce_add_sync(0xffffffffu, z);
    }
    if ((threadIdx.x & 31) == 0) partials[parity][threadIdx.x >> 5] = make_int4(x, y, z, 0);
    __syncthreads();
    int4 t = partials[parity][0];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) {
      const int4 v = partials[parity][w];
      t.x += v.x;
      if (minmax) {
        t.y = int32_t(min(uint32_t(t.y), uint32_t(v.y)));
        t.z = int32_t(max(uint32_t(t.z), uint32_t(v.z)));
      } else {
        t.y += v.y;
        t.z += v.z;
      }
    }
    x = t.x;
    y = t.y;
    z = t.z;
    parity ^= 1;
  };
  auto* plans = static_cast<RowPlan*>(a.scratch);
  const int32_t tid = int32_t(threadIdx.x);
  for (int32_t r = int32_t(blockIdx.x); r < n_rows; r += int32_t(gridDim.x)) {
    const RowInfo row = row_info(a, r);
    const ClippedRow& c = row.c;
    if (c.keeps_all()) {
      if (tid == 0) plans[r] = RowPlan{c.n, 0u, 0};
      continue;
    }
    const int32_t mb = c.middle_begin(), m = c.middle_end() - mb;
    const bool in_smem = m <= cap;
    int32_t finite = 0, lowest = int32_t(0xffffffffu), highest = 0;  // over the finite keys
    for (int32_t j = tid; j < m; j += kThreads) {
      const uint32_t key = key_at(row, mb + j);
      if (in_smem) keys[j] = key;
      if (key != 0u) {
        ++finite;
        lowest = int32_t(min(uint32_t(lowest), key));
        highest = int32_t(max(uint32_t(highest), key));
      }
    }
    reduce3(finite, lowest, highest, true);  // its barrier also publishes keys[]
    const int32_t take = finite < c.k ? finite : c.k;
    uint32_t threshold = 0;
    int32_t need_equal = 0;
    if (take > 0 && take < finite) {
      // The largest t with #(key >= t) >= take is the take-th best key; it lies in [lowest,
      // highest] of the finite keys. Search [lo, hi] with three pivots a round (a quarter of the
      // range left each time): t = lo always qualifies, above_hi = #(key > hi).
      uint32_t lo = uint32_t(lowest), hi = uint32_t(highest);
      int32_t above_hi = 0;
      while (lo < hi) {
        const uint64_t range = uint64_t(hi) - lo;
        uint32_t pivot[3];
#pragma unroll
        for (int i = 0; i < 3; ++i) pivot[i] = uint32_t(lo + (range * uint64_t(i + 1) + 3) / 4);
        int32_t n[3] = {0, 0, 0};
        for (int32_t j = tid; j < m; j += kThreads) {
          const uint32_t key = in_smem ? keys[j] : key_at(row, mb + j);
#pragma unroll
          for (int i = 0; i < 3; ++i) n[i] += key >= pivot[i];
        }
        reduce3(n[0], n[1], n[2], false);
        // Counts fall as the pivot rises: the best qualifying pivot is the new lo, the first
        // failing one bounds hi.
#pragma unroll
        for (int i = 2; i >= 0; --i)
          if (n[i] < take) {
            hi = pivot[i] - 1u;
            above_hi = n[i];
          }
#pragma unroll
        for (int i = 0; i < 3; ++i)
          if (n[i] >= take && pivot[i] > lo) lo = pivot[i];
      }
      threshold = lo;
      need_equal = take - above_hi;
    }
    if (tid == 0) plans[r] = RowPlan{c.head + c.tail + take, threshold, need_equal};
    __syncthreads();  // keys[] is rewritten by the next row
  }
}

__device__ __forceinline__ void put(const TopKCudaLaunch& a, int64_t at, int32_t v) {
  if (at < a.capacity) a.sel_indices[at] = v;
}

// Counts -> CSR indptr (one block, chunked scan), for batches of more than kPrefixRows rows.
__global__ void __launch_bounds__(kScanThreads) top_k_offsets(TopKCudaLaunch a, int32_t n_rows) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  const auto* plans = static_cast<const RowPlan*>(a.scratch);
  int32_t running = 0;
  for (int32_t base = 0; base < n_rows; base += kScanThreads) {
    const int32_t r = base + int32_t(threadIdx.x);
    const int32_t v = r < n_rows ? plans[r].count : 0;
    int32_t prefix, total;
    Scan(temp).ExclusiveSum(v, prefix, total);
    if (r < n_rows) a.sel_indptr[r] = running + prefix;
    running += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) a.sel_indptr[n_rows] = running;
}

__global__ void __launch_bounds__(kThreads) top_k_emit(TopKCudaLaunch a, int32_t n_rows, int32_t cap,
                                                      bool indptr_ready) {
  using Scan = cub::BlockScan<uint64_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int32_t partials[2][1][kWarps];
  extern __shared__ uint32_t keys[];
  BlockSum sum{partials};
  const auto* plans = static_cast<const RowPlan*>(a.scratch);
  const int32_t tid = int32_t(threadIdx.x);
  for (int32_t r = int32_t(blockIdx.x); r < n_rows; r += int32_t(gridDim.x)) {
    const RowPlan plan = plans[r];
    int64_t out;
    if (indptr_ready) {
      out = a.sel_indptr[r];
    } else {
      int32_t before = 0;
      for (int32_t i = tid; i < r; i += kThreads) before += plans[i].count;
      out = sum(before);
      if (tid == 0) {
        a.sel_indptr[r] = int32_t(out);
        if (r == n_rows - 1) a.sel_indptr[n_rows] = int32_t(out) + plan.count;
      }
    }
    const RowInfo row = row_info(a, r);
    const ClippedRow& c = row.c;
    if (c.keeps_all()) {
      for (int32_t j = tid; j < c.n; j += kThreads) put(a, out + j, j);
      continue;
    }
    const int32_t take = plan.count - c.head - c.tail;  // chosen middle items
    for (int32_t j = tid; j < c.head; j += kThreads) put(a, out + j, j);
    for (int32_t j = tid; j < c.tail; j += kThreads) put(a, out + c.head + take + j, c.middle_end() + j);
    if (take <= 0) continue;
    const int32_t mb = c.middle_begin(), m = c.middle_end() - mb;
    const bool in_smem = m <= cap;
    if (in_smem) {
      for (int32_t j = tid; j < m; j += kThreads) keys[padded(j)] = key_at(row, mb + j);
      __syncthreads();
    }
    auto key_of = [&](int32_t i) { return in_smem ? keys[padded(i)] : key_at(row, mb + i); };
    const uint32_t thr = plan.threshold;
    const int32_t run = (m + kThreads - 1) / kThreads;
    const int32_t first = tid * run, last = first + run < m ? first + run : m;
    uint32_t above = 0, equal = 0;
    for (int32_t i = first; i < last; ++i) {
      const uint32_t key = key_of(i);
      above += key > thr;
      equal += thr != 0u && key == thr;
    }
    uint64_t base;
    Scan(temp).ExclusiveSum((uint64_t(above) << 32) | equal, base);
    const uint32_t equal_before = uint32_t(base & 0xffffffffu);
    const int64_t need = plan.need_equal;
    int64_t w = out + c.head + int64_t(base >> 32) + (equal_before < need ? equal_before : need);
    int64_t seen = equal_before;
    for (int32_t i = first; i < last; ++i) {
      const uint32_t key = key_of(i);
      bool pick = key > thr;
      if (thr != 0u && key == thr) pick = seen++ < need;
      if (pick) put(a, w++, mb + i);
    }
    __syncthreads();  // temp and keys[] are reused by the next row
  }
}

int32_t key_capacity(int32_t hint) {
  int32_t cap = hint > 0 ? hint : kDefaultKeys;
  return cap < 1024 ? 1024 : (cap > kMaxKeys ? kMaxKeys : cap);
}

}  // namespace

size_t top_k_cuda_scratch_bytes(int64_t max_rows) noexcept {
  return sizeof(RowPlan) * size_t(max_rows > 0 ? max_rows : 1);
}

const char* launch_top_k_cuda(const TopKCudaLaunch& a) noexcept {
  const int64_t rows64 = int64_t(a.n_segments) * a.rows_per_segment;
  if (rows64 < 0 || rows64 > INT32_MAX) return "top-k: row count out of range";
  const int32_t n_rows = int32_t(rows64);
  auto stream = static_cast<cudaStream_t>(a.stream);
  if (n_rows == 0) {  // an empty selection still has indptr[0] = 0
    top_k_offsets<<<1, kScanThreads, 0, stream>>>(a, 0);
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  }
  const int32_t cap = key_capacity(a.max_row_items);
  const size_t smem = key_buffer_bytes(cap);
  if (smem > (size_t(48) << 10)) {  // shared buffers above 48 KB need the (per-device) opt-in
    for (const void* f : {reinterpret_cast<const void*>(top_k_select), reinterpret_cast<const void*>(top_k_emit)})
      if (cudaError_t e = cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
          e != cudaSuccess)
        return cudaGetErrorString(e);
  }
  const bool scan = n_rows > kPrefixRows;
  top_k_select<<<n_rows, kThreads, smem, stream>>>(a, n_rows, cap);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  if (scan) {
    top_k_offsets<<<1, kScanThreads, 0, stream>>>(a, n_rows);
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  }
  top_k_emit<<<n_rows, kThreads, smem, stream>>>(a, n_rows, cap, scan);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return cudaGetErrorString(e);
  return nullptr;
}

}  // namespace sieve::selection
