// CUDA half of the dpxa plugin: one sequence's block-sparse prefill selection, in six kernels on
// the host's stream (no allocation, no synchronisation):
//   1. anchors  (thread per (block, head))   delta anchors of every query block (per q head) and
//                                             key block (per KV head): the sequential walk of
//                                             dpxa_tiles.hpp, 16-byte reads (estimator=dpxa only);
//   2. scores   the tile's (m, s) pair.  16-bit Q and K (same type, d % 16 == 0): tensor cores,
//               a CTA per (query block, 1-4 heads of a KV head), a warp per key block, mma.sync
//               over the sampled rows (scores_mma_kernel; rounds differently from the CPU in the
//               last bits).  Otherwise: a CTA per (query block, q head), a thread per key block
//               with dpxa_tiles.hpp's score_* (bit for bit the CPU's);
//   3. greedy   (CTA per (query block, q head))  row weights, a bitonic sort of the order keys in
//               shared memory, then the greedy walk by one thread: dpxa_tiles.hpp's
//               row_weights / greedy_walk arithmetic, so given the scores the kept tiles equal the
//               CPU's bit for bit;
//   4. counts   (CTA per selection row)     kept key blocks per row (rows=kv_head: the union of
//                                             the group's flags);
//   5. offsets  (one CTA)                   scan -> the selection's indptr for these rows,
//                                             continuing from indptr[row0] of the sequence before;
//   6. write    (CTA per selection row)     the kept key blocks, ascending, -> indices;
//   7. exact    (mode=deltax only, DeltaX's: deltax_exact.cu) which kept off-diagonal tiles are
//               computed exactly: the row's top ceil(exact_top · n) by the head's share.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <type_traits>

#include "cuda/deltax_spans.hpp"
#include "cuda/dpxa_select.hpp"
#include "cuda/select_device.cuh"
#include "cuda/tile_scores_mma.cuh"
#include "math/dpxa_tiles.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::dpxa {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxD = 256;
constexpr int kMaxGroups = 256;  // ceil(B / S) for xattn


// x·x and x·y in one pass over the channels, each summed in index order (dpxa_tiles.hpp's dot),
// reading 16 bytes at a time when the rows allow it (element-wise 2-byte reads made the anchor walk
// latency-bound).
template <class T>
__device__ void dot2(const T* x, const T* y, int32_t d, float& xx, float& xy) {
  float sxx = 0.0f, sxy = 0.0f;
  constexpr int32_t kPer = 16 / int32_t(sizeof(T));
  const uintptr_t bits = reinterpret_cast<uintptr_t>(x) | reinterpret_cast<uintptr_t>(y);
  if (d % kPer == 0 && bits % 16 == 0) {
    for (int32_t c = 0; c < d; c += kPer) {
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + c));
      const uint4 yv = __ldg(reinterpret_cast<const uint4*>(y + c));
      const T* xe = reinterpret_cast<const T*>(&xv);
      const T* ye = reinterpret_cast<const T*>(&yv);
#pragma unroll
      for (int32_t e = 0; e < kPer; ++e) {
        const float xf = to_f32(xe[e]), yf = to_f32(ye[e]);
        sxx = fadd(sxx, fmul(xf, xf));
        sxy = fadd(sxy, fmul(xf, yf));
      }
    }
  } else {
    for (int32_t c = 0; c < d; ++c) {
      const float xf = to_f32(x[c]), yf = to_f32(y[c]);
      sxx = fadd(sxx, fmul(xf, xf));
      sxy = fadd(sxy, fmul(xf, yf));
    }
  }
  xx = sxx;
  xy = sxy;
}

// dpxa_tiles.hpp's delta_anchors with the same arithmetic (x·x and x·a are its two dots).
template <class T, class Row>
__device__ int32_t delta_anchors_dev(const Row& row, int32_t n, int32_t d, float threshold,
                                     uint8_t* out) {
  if (n <= 0) return 0;
  int32_t count = 0;
  out[count++] = 0;
  const T* anchor = row(0);
  float anchor_sq, unused;
  dot2(anchor, anchor, d, anchor_sq, unused);
  for (int32_t i = 1; i < n; ++i) {
    const T* x = row(i);
    float x_sq, xa;
    dot2(x, anchor, d, x_sq, xa);
    if (xa < fmul(threshold, fsqrt(fmul(x_sq, anchor_sq)))) {
      anchor = x;
      anchor_sq = x_sq;
      out[count++] = uint8_t(i);
    }
  }
  return count;
}

// A thread per (block, head) walks its block; 32-thread CTAs spread the few walks (QB·hq + KB·hkv)
// over every SM.
constexpr int kAnchorThreads = 32;
template <class TQ, class TK>
__global__ void __launch_bounds__(kAnchorThreads) anchors_kernel(const SequenceLaunch a) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t n_q = int64_t(a.QB) * a.hq, n_k = int64_t(a.KB) * a.hkv;
  if (idx < n_q) {
    const int32_t h = int32_t(idx / a.QB), t = int32_t(idx % a.QB);
    const int64_t first = int64_t(t) * a.B;
    const int32_t n = int32_t(::min(int64_t(a.B), a.n_new - first));
    auto row = [&](int32_t i) { return query_row_t<TQ>(a, h, first + i); };
    a.q_counts[idx] = delta_anchors_dev<TQ>(row, n, a.d, a.q_threshold, a.q_anchors + idx * a.B);
  } else if (idx < n_q + n_k) {
    const int64_t k = idx - n_q;
    const int32_t g = int32_t(k / a.KB), j = int32_t(k % a.KB);
    const int64_t first = int64_t(j) * a.B;
    const int32_t n = int32_t(::min(int64_t(a.B), a.kv_len - first));
    auto row = [&](int32_t i) { return key_row_t<TK>(a, g, first + i); };
    a.k_counts[k] = delta_anchors_dev<TK>(row, n, a.d, a.k_threshold, a.k_anchors + k * a.B);
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
    qs[e] = to_f32(query_row_t<TQ>(a, h, q_first + e / a.d)[e % a.d]);
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
      for (int32_t x = 0; x < a.d; ++x) kbuf[x] = to_f32(src[x]);
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

// NaN-skipping max (the CPU's row_weights never lets a NaN m win), so any reduction order gives
// the same M.
struct MaxSkipNan {
  __device__ float operator()(float x, float y) const {
    if (x != x) return y;
    if (y != y) return x;
    return y > x ? y : x;
  }
};


// One CTA per row: row_weights / greedy_walk of dpxa_tiles.hpp with every order-free part in
// parallel (the max, the weights, the sort keys, gathering weights in greedy order) and the two
// order-sensitive sums (Σ w in index order, the kept mass in greedy order) on one thread over
// shared memory, so the kept tiles equal the CPU's bit for bit. The bitonic sort spans the row's
// own candidates (rounded up to a power of 2), not the longest row's.
__global__ void __launch_bounds__(kGreedyThreads) greedy_kernel(const SequenceLaunch a) {
  extern __shared__ __align__(16) unsigned char smem[];
  using Reduce = cub::BlockReduce<float, kGreedyThreads>;
  __shared__ typename Reduce::TempStorage reduce_temp;
  __shared__ float row_max, row_z;
  __shared__ int32_t n_keep;
  const auto [t, h, r, n, pow2, keys] = sort_row(a, smem);
  float* w = reinterpret_cast<float*>(keys + pow2);     // [n] weights in index order
  float* ws = w + n;                                    // [n] weights in greedy order
  const int64_t base = int64_t(h) * a.tiles_per_head + row_prefix(a, t);
  const TileLse* tiles = reinterpret_cast<const TileLse*>(a.tiles) + base;
  uint8_t* keep = a.keep + base;
  float m = -INFINITY;
  for (int32_t j = threadIdx.x; j < n; j += blockDim.x) m = MaxSkipNan{}(m, tiles[j].m);
  m = Reduce(reduce_temp).Reduce(m, MaxSkipNan{});
  if (threadIdx.x == 0) row_max = m;
  __syncthreads();
  const float M = row_max;
  for (int32_t j = threadIdx.x; j < pow2; j += blockDim.x) {
    float wj = 0.f;
    if (j < n) {
      const TileLse tl = tiles[j];
      wj = tl.s > 0.0f ? fmul(tl.s, exp_neg(fsub(tl.m, M))) : 0.0f;  // row_weights' w_j
      w[j] = wj;
      keep[j] = forced(r, j) ? 1 : 0;
    }
    // Forced tiles and padding get 0, which sorts after every real key.
    keys[j] = j < n && !forced(r, j) ? order_key(wj, j) : 0ull;
  }
  __syncthreads();
  sort_descending(keys, pow2);
  // Non-forced candidates: n minus block 0 and the diagonal blocks diag_first .. n-1.
  const int32_t n_sorted = n - (n - r.diag_first) - (r.diag_first > 0 ? 1 : 0);
  for (int32_t i = threadIdx.x; i < n_sorted; i += blockDim.x) ws[i] = w[order_index(keys[i])];
  __syncthreads();
  if (threadIdx.x == 0) {
    float z = 0.0f;  // Σ w in index order (row_weights)
    for (int32_t j = 0; j < n; ++j) z = fadd(z, w[j]);
    float kept = 0.0f;  // forced mass in index order, then the greedy walk (greedy_walk)
    for (int32_t j = 0; j < n; j = j == 0 && r.diag_first > 1 ? r.diag_first : j + 1)
      kept = fadd(kept, w[j]);
    const float target = fmul(a.tau[h], z);
    const bool all = !(a.tau[h] < 1.0f);
    int32_t c = 0;
    for (; c < n_sorted && (all || kept < target); ++c) kept = fadd(kept, ws[c]);
    n_keep = c;
    row_z = z;
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < n_keep; i += blockDim.x) keep[order_index(keys[i])] = 1;
  if (a.shares) {  // deltax: row_shares' w / z, IEEE-rounded like the CPU's division
    const float z = row_z;
    for (int32_t j = threadIdx.x; j < n; j += blockDim.x)
      a.shares[base + j] = z > 0.f ? __fdiv_rn(w[j], z) : 0.f;
  }
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

// Tile scores: on tensor cores when Q and K are the same 16-bit type and d is a multiple of 16
// (the stacked query rows of up to 4 heads of a KV group in shared memory, as many heads as fit in
// kMmaSmemBudget); otherwise the scalar kernel (bit for bit the CPU's).
constexpr size_t kMmaSmemBudget = 80 * 1024;

template <class TQ, class TK>
const char* launch_scores(const SequenceLaunch& a, cudaStream_t stream) {
  if constexpr (std::is_same_v<TQ, TK> && !std::is_same_v<TQ, float>) {
    const int32_t group = a.hq / a.hkv;
    int32_t hpc = 1;
    for (int32_t c = kMaxHeadsPerCta; c > 1; --c)
      if (group % c == 0 && mma_smem_bytes(a, c) <= kMmaSmemBudget) {
        hpc = c;
        break;
      }
    const size_t bytes = mma_smem_bytes(a, hpc);
    // Its B fragments are 4-byte loads of key rows: a pool whose rows start off 4-byte boundaries
    // (an odd element byte_offset or stride) takes the scalar kernel.
    const bool rows_aligned = reinterpret_cast<uintptr_t>(a.k_pages) % 4 == 0 &&
                              (a.k_strides.page | a.k_strides.head | a.k_strides.token) % 2 == 0;
    if (rows_aligned && a.d % 16 == 0 && a.B <= kMaxRowTiles * 16 && bytes <= 200 * 1024) {
      if (const cudaError_t e = cudaFuncSetAttribute(
              scores_mma_kernel<TQ>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
          e != cudaSuccess)
        return cudaGetErrorString(e);
      scores_mma_kernel<TQ><<<dim3(unsigned(a.hq / hpc), unsigned(a.QB)), kMmaWarps * 32, bytes,
                              stream>>>(a, hpc);
      const cudaError_t e = cudaGetLastError();
      return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
    }
  }
  const size_t q_bytes = size_t(a.B) * a.d * sizeof(float);
  if (const cudaError_t e = cudaFuncSetAttribute(
          scores_kernel<TQ, TK>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(q_bytes));
      e != cudaSuccess)
    return cudaGetErrorString(e);
  scores_kernel<TQ, TK><<<dim3(unsigned(a.QB), unsigned(a.hq)), kThreads, q_bytes, stream>>>(a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

template <class TQ, class TK>
const char* launch_typed(const SequenceLaunch& a) {
  auto stream = static_cast<cudaStream_t>(a.stream);
  auto check = []() -> const char* {
    const cudaError_t e = cudaGetLastError();
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  };
  if (a.estimator == kDpxa) {
    const int64_t threads = int64_t(a.QB) * a.hq + int64_t(a.KB) * a.hkv;
    anchors_kernel<TQ, TK><<<unsigned((threads + kAnchorThreads - 1) / kAnchorThreads),
                             kAnchorThreads, 0, stream>>>(a);
    if (const char* e = check()) return e;
  }
  const dim3 rows(unsigned(a.QB), unsigned(a.hq));
  if (const char* e = launch_scores<TQ, TK>(a, stream)) return e;
  const size_t g_bytes = size_t(pow2_at_least(a.KB)) * 8 + size_t(a.KB) * 8;
  if (const cudaError_t e = cudaFuncSetAttribute(
          greedy_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(g_bytes));
      e != cudaSuccess)
    return cudaGetErrorString(e);
  greedy_kernel<<<rows, kGreedyThreads, g_bytes, stream>>>(a);
  if (const char* e = check()) return e;
  const int32_t H = a.rows_per_kv_head ? a.hkv : a.hq;
  const int32_t n_rows = a.QB * H;
  counts_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(a, H);
  if (const char* e = check()) return e;
  offsets_kernel<<<1, kGreedyThreads, 0, stream>>>(a, n_rows);
  if (const char* e = check()) return e;
  write_kernel<<<unsigned(n_rows), kThreads, 0, stream>>>(a, H);
  if (const char* e = check()) return e;
  if (a.exact_bits) return launch_exact_tiles(a);  // DeltaX's ranking (deltax_exact.cu)
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
  return dispatch_cuda_storage(a.q_dtype, [&](auto q) {
    return dispatch_cuda_storage(a.kv_dtype, [&](auto k) {
      return launch_typed<typename decltype(q)::type, typename decltype(k)::type>(a);
    });
  });
}

}  // namespace sieve::dpxa
