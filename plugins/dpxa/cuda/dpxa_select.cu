// CUDA half of the dpxa plugin: one sequence's block-sparse prefill selection, in six kernels on
// the host's stream (no allocation, no synchronisation):
//   1. anchors  (thread per (block, head))   delta anchors of every query block (per q head) and
//                                             key block (per KV head): the sequential walk of
//                                             dpxa_tiles.hpp (estimator=dpxa only);
//   2. scores   (CTA per (query block, q head), thread per key block)  the tile's (m, s) pair
//               with dpxa_tiles.hpp's score_* on the query block staged in shared memory (f32)
//               and each key row staged in the thread's local buffer;
//   3. greedy   (CTA per (query block, q head))  row weights, a bitonic sort of the order keys in
//               shared memory, then the greedy walk by one thread: dpxa_tiles.hpp's
//               row_weights / greedy_walk, so the kept tiles equal the CPU's bit for bit;
//   4. counts   (CTA per selection row)     kept key blocks per row (rows=kv_head: the union of
//                                             the group's flags);
//   5. offsets  (one CTA)                   scan -> the selection's indptr for these rows,
//                                             continuing from indptr[row0] of the sequence before;
//   6. write    (CTA per selection row)     the kept key blocks, ascending, -> indices.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "core/dpxa_tiles.hpp"
#include "cuda/dpxa_select.hpp"

namespace sieve::dpxa {
namespace {

constexpr int kThreads = 128;
constexpr int kGreedyThreads = 256;
constexpr int kMaxD = 256;
constexpr int kMaxGroups = 256;  // ceil(B / S) for xattn

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// A vector in global memory read as floats (exact conversions).
template <class T>
struct GlobalVec {
  const T* p;
  __device__ float operator[](int32_t i) const { return to_float(p[i]); }
};

template <class T>
__device__ const T* key_row_t(const SequenceLaunch& a, int32_t kvh, int64_t pos) {
  const int64_t phys = a.pages[pos / a.page_size];
  return static_cast<const T*>(a.k_pages) +
         ((phys * a.hkv + kvh) * a.page_size + pos % a.page_size) * a.d;
}
template <class T>
__device__ const T* query_row_t(const SequenceLaunch& a, int32_t h, int64_t i) {
  return static_cast<const T*>(a.q) + ((a.q_token0 + i) * a.hq + h) * a.d;
}

// Tiles of query blocks 0 .. t-1 of one head.
__device__ int64_t row_prefix(const SequenceLaunch& a, int32_t t) {
  int64_t p = 0;
  for (int32_t u = 0; u < t; ++u) p += row_span(a.kv_len, a.n_new, a.B, u).n_candidates;
  return p;
}

template <class TQ, class TK>
__global__ void __launch_bounds__(kThreads) anchors_kernel(const SequenceLaunch a) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_q = int64_t(a.QB) * a.hq, n_k = int64_t(a.KB) * a.hkv;
  if (idx < n_q) {
    const int32_t h = int32_t(idx / a.QB), t = int32_t(idx % a.QB);
    const int64_t first = int64_t(t) * a.B;
    const int32_t n = int32_t(::min(int64_t(a.B), a.n_new - first));
    auto row = [&](int32_t i) { return GlobalVec<TQ>{query_row_t<TQ>(a, h, first + i)}; };
    a.q_counts[idx] = delta_anchors(row, n, a.d, a.q_threshold, a.q_anchors + idx * a.B);
  } else if (idx < n_q + n_k) {
    const int64_t k = idx - n_q;
    const int32_t g = int32_t(k / a.KB), j = int32_t(k % a.KB);
    const int64_t first = int64_t(j) * a.B;
    const int32_t n = int32_t(::min(int64_t(a.B), a.kv_len - first));
    auto row = [&](int32_t i) { return GlobalVec<TK>{key_row_t<TK>(a, g, first + i)}; };
    a.k_counts[k] = delta_anchors(row, n, a.d, a.k_threshold, a.k_anchors + k * a.B);
  }
}

template <class TQ, class TK>
__global__ void __launch_bounds__(kThreads) scores_kernel(const SequenceLaunch a) {
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);  // the query block [nq][d]
  const int32_t t = blockIdx.x, h = blockIdx.y, g = h / (a.hq / a.hkv);
  const RowSpan r = row_span(a.kv_len, a.n_new, a.B, t);
  const int64_t q_first = int64_t(t) * a.B;
  const int32_t nq = int32_t(::min(int64_t(a.B), a.n_new - q_first));
  for (int32_t e = threadIdx.x; e < nq * a.d; e += blockDim.x)
    qs[e] = to_float(query_row_t<TQ>(a, h, q_first + e / a.d)[e % a.d]);
  __syncthreads();
  const int64_t base = int64_t(h) * a.tiles_per_head + row_prefix(a, t);
  const int64_t qa_row = int64_t(h) * a.QB + t;
  float kbuf[kMaxD];       // the key row being scored (thread-local: coalesced local memory)
  float acc[kMaxGroups];   // xattn per-query-group accumulators
  for (int32_t j = threadIdx.x; j < r.n_candidates; j += blockDim.x) {
    const int64_t k_first = int64_t(j) * a.B;
    const int32_t nk = int32_t(::min(int64_t(a.B), a.kv_len - k_first));
    auto qrow = [&](int32_t i) { return qs + i * a.d; };
    auto krow = [&](int32_t i) -> const float* {
      const TK* src = key_row_t<TK>(a, g, k_first + i);
      for (int32_t x = 0; x < a.d; ++x) kbuf[x] = to_float(src[x]);
      return kbuf;
    };
    const TileGeometry geo{r.first, k_first, nq, nk, a.d};
    TileLse tile;
    if (a.estimator == kDpxa) {
      const int64_t ka_row = int64_t(g) * a.KB + j;
      tile = score_dpxa(geo, qrow, a.q_anchors + qa_row * a.B, a.q_counts[qa_row], krow,
                        a.k_anchors + ka_row * a.B, a.k_counts[ka_row], a.scale);
    } else if (a.estimator == kXattn) {
      tile = score_xattn(geo, qrow, krow, a.S, a.scale_over_s, acc);
    } else {
      tile = score_stride(geo, qrow, krow, a.S, a.scale);
    }
    a.tiles[(base + j) * 2] = tile.m;
    a.tiles[(base + j) * 2 + 1] = tile.s;
  }
}

__global__ void __launch_bounds__(kGreedyThreads) greedy_kernel(const SequenceLaunch a,
                                                                 int32_t pow2) {
  extern __shared__ __align__(16) unsigned char smem[];
  uint64_t* keys = reinterpret_cast<uint64_t*>(smem);  // [pow2]
  float* w = reinterpret_cast<float*>(keys + pow2);     // [n]
  __shared__ float z;
  __shared__ int32_t n_sorted;
  const int32_t t = blockIdx.x, h = blockIdx.y;
  const RowSpan r = row_span(a.kv_len, a.n_new, a.B, t);
  const int32_t n = r.n_candidates;
  const int64_t base = int64_t(h) * a.tiles_per_head + row_prefix(a, t);
  const TileLse* tiles = reinterpret_cast<const TileLse*>(a.tiles) + base;
  uint8_t* keep = a.keep + base;
  if (threadIdx.x == 0) {
    z = row_weights(tiles, n, w);  // sequential: the CPU's order
    n_sorted = 0;
    for (int32_t j = 0; j < n; ++j) n_sorted += forced(r, j) ? 0 : 1;
  }
  __syncthreads();
  // Non-forced order keys; forced tiles and padding get 0, which sorts after every real key.
  for (int32_t j = threadIdx.x; j < pow2; j += blockDim.x) {
    keys[j] = j < n && !forced(r, j) ? order_key(w[j], j) : 0ull;
    if (j < n) keep[j] = forced(r, j) ? 1 : 0;
  }
  __syncthreads();
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
  if (threadIdx.x == 0) greedy_walk(r, w, z, a.tau[h], keys, n_sorted, keep);
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

__global__ void __launch_bounds__(kThreads) counts_kernel(const SequenceLaunch a, int32_t H) {
  using Reduce = cub::BlockReduce<int32_t, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  const int32_t r_local = blockIdx.x, t = r_local / H, hrow = r_local % H;
  const RowSpan r = row_span(a.kv_len, a.n_new, a.B, t);
  const int64_t prefix = row_prefix(a, t);
  int32_t c = 0;
  for (int32_t j = threadIdx.x; j < r.n_candidates; j += blockDim.x)
    c += row_keeps(a, t, hrow, prefix, j) ? 1 : 0;
  const int32_t total = Reduce(temp).Sum(c);
  if (threadIdx.x == 0) a.row_counts[r_local] = total;
}

__global__ void __launch_bounds__(kGreedyThreads) offsets_kernel(const SequenceLaunch a,
                                                                  int32_t n_rows) {
  using Scan = cub::BlockScan<int32_t, kGreedyThreads>;
  __shared__ typename Scan::TempStorage temp;
  __shared__ int32_t base;
  if (threadIdx.x == 0) {
    base = a.row0 == 0 ? 0 : a.sel_indptr[a.row0];
    if (a.row0 == 0) a.sel_indptr[0] = 0;
  }
  __syncthreads();
  int32_t running = base;
  for (int32_t c0 = 0; c0 < n_rows; c0 += kGreedyThreads) {
    const int32_t i = c0 + int32_t(threadIdx.x);
    const int32_t v = i < n_rows ? a.row_counts[i] : 0;
    int32_t incl, total;
    Scan(temp).InclusiveSum(v, incl, total);
    if (i < n_rows) a.sel_indptr[a.row0 + i + 1] = running + incl;
    running += total;
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads) write_kernel(const SequenceLaunch a, int32_t H) {
  using Scan = cub::BlockScan<int32_t, kThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int32_t r_local = blockIdx.x, t = r_local / H, hrow = r_local % H;
  const RowSpan r = row_span(a.kv_len, a.n_new, a.B, t);
  const int64_t prefix = row_prefix(a, t);
  int64_t out = a.sel_indptr[a.row0 + r_local];
  for (int32_t c0 = 0; c0 < r.n_candidates; c0 += kThreads) {
    const int32_t j = c0 + int32_t(threadIdx.x);
    const int32_t flag = j < r.n_candidates && row_keeps(a, t, hrow, prefix, j) ? 1 : 0;
    int32_t pos, total;
    Scan(temp).ExclusiveSum(flag, pos, total);
    // The host checked the worst case (every candidate kept) against the capacity.
    if (flag && out + pos < a.capacity) a.sel_indices[out + pos] = j;
    out += total;
    __syncthreads();
  }
}

__global__ void empty_kernel(int32_t* indptr) { indptr[0] = 0; }

template <class TQ, class TK>
const char* launch_typed(const SequenceLaunch& a) {
  auto stream = static_cast<cudaStream_t>(a.stream);
  auto check = []() -> const char* {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  };
  if (a.estimator == kDpxa) {
    const int64_t threads = int64_t(a.QB) * a.hq + int64_t(a.KB) * a.hkv;
    anchors_kernel<TQ, TK><<<unsigned((threads + kThreads - 1) / kThreads), kThreads, 0, stream>>>(a);
    if (const char* e = check()) return e;
  }
  const dim3 rows(unsigned(a.QB), unsigned(a.hq));
  const size_t q_bytes = size_t(a.B) * a.d * sizeof(float);
  if (const cudaError_t e = cudaFuncSetAttribute(
          scores_kernel<TQ, TK>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(q_bytes));
      e != cudaSuccess)
    return cudaGetErrorString(e);
  scores_kernel<TQ, TK><<<rows, kThreads, q_bytes, stream>>>(a);
  if (const char* e = check()) return e;
  int32_t pow2 = 1;
  while (pow2 < a.KB) pow2 <<= 1;
  const size_t g_bytes = size_t(pow2) * 8 + size_t(a.KB) * 4;
  if (const cudaError_t e = cudaFuncSetAttribute(
          greedy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(g_bytes));
      e != cudaSuccess)
    return cudaGetErrorString(e);
  greedy_kernel<<<rows, kGreedyThreads, g_bytes, stream>>>(a, pow2);
  if (const char* e = check()) return e;
  const int32_t H = a.rows_per_kv_head ? a.hkv : a.hq;
  const int32_t n_rows = a.QB * H;
  counts_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(a, H);
  if (const char* e = check()) return e;
  offsets_kernel<<<1, kGreedyThreads, 0, stream>>>(a, n_rows);
  if (const char* e = check()) return e;
  write_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(a, H);
  return check();
}

}  // namespace

ScratchSizes scratch_sizes(int32_t max_seq_len, int32_t B, int32_t hq, int32_t hkv) {
  const size_t blocks = size_t(max_seq_len + B - 1) / size_t(B);
  // Σ_t n_candidates(t) <= KB (KB + 1) / 2 (each earlier query block sees one key block less).
  const size_t tiles = blocks * (blocks + 1) / 2;
  ScratchSizes s;
  s.q_anchors = size_t(hq) * blocks * size_t(B);
  s.q_counts = size_t(hq) * blocks * 4;
  s.k_anchors = size_t(hkv) * blocks * size_t(B);
  s.k_counts = size_t(hkv) * blocks * 4;
  s.tiles = size_t(hq) * tiles * 8;
  s.keep = size_t(hq) * tiles;
  s.row_counts = size_t(hq) * blocks * 4;
  return s;
}

const char* launch_empty(const SequenceLaunch& a) noexcept {
  empty_kernel<<<1, 1, 0, static_cast<cudaStream_t>(a.stream)>>>(a.sel_indptr);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* launch_sequence(const SequenceLaunch& a) noexcept {
  if (a.QB <= 0) return nullptr;
  if (a.d > kMaxD || (a.B + a.S - 1) / a.S > kMaxGroups) return "head_dim or B / S too large";
  auto by_kv = [&](auto q_type) -> const char* {
    using TQ = decltype(q_type);
    switch (a.kv_dtype) {
      case 0: return launch_typed<TQ, float>(a);
      case 1: return launch_typed<TQ, __half>(a);
      case 2: return launch_typed<TQ, __nv_bfloat16>(a);
    }
    return "unsupported K/V dtype";
  };
  switch (a.q_dtype) {
    case 0: return by_kv(float{});
    case 1: return by_kv(__half{});
    case 2: return by_kv(__nv_bfloat16{});
  }
  return "unsupported query dtype";
}

}  // namespace sieve::dpxa
