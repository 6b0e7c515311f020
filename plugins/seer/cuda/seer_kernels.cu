// CUDA half of the seer plugin (SeerAttention-R): the K-compression cache update, the per-step
// gate scores and the threshold selection; the budget selection is core/selection's batched
// top-k on the scores these kernels write. The arithmetic is gate_math.hpp's, in the same order
// as the CPU path (a thread per pooled channel / projection row, serial sums; the .cu is built
// with -fmad=false), so CPU and CUDA rank the same blocks up to last-ulp differences of the
// device's powf/sinf/cosf.
//   fill_cache   grid (batch, hkv, z): block j of sequence b, KV head h, for j = z, z + Z, ...
//                below the complete-block count, skipped when its entry is already filled;
//   block_offsets one thread: blocks per sequence -> CSR (block_indptr);
//   gate_query_raw grid (batch, hkv, dg/8): W_q x, a warp per row (coalesced, shuffle sum);
//                with fused=true also block_offsets' work (CTA 0) and the cache catch-up of
//                row (b, h) (CTA (b, h, 0): the newest complete blocks not filled yet);
//   gate_scores  grid (batch, hkv, block chunks): RMSNorm + RoPE of the query in shared memory,
//                a thread per block: its score (the last block -inf: forced, never ranked);
//   gate_softmax (threshold mode) grid (batch, hkv): softmax over the complete blocks;
//   threshold_*  counts + scan (one block), then one block per row writes its list in order.
// fused=true (the default) folds block_offsets and the decode step's cache update into
// gate_query_raw: a decode step is then gate_query_raw, gate_scores, the top-k's 2 kernels (4
// launches; the first implementation, fused=false, launched fill_cache and block_offsets too).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "cuda/seer_cuda.hpp"
#include "gate/gate_math.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::seer {
namespace {

constexpr int kThreads = 128;
constexpr int kScanThreads = 256;
constexpr int kMaxZ = 64;

struct MaxOp {  // (cub::Max is gone from recent CCCL)
  __device__ __forceinline__ double operator()(double a, double b) const { return a > b ? a : b; }
};

__device__ __forceinline__ int64_t kv_len_of(const SeerCudaCommon& c, int32_t b) {
  const int32_t pages = c.kv_indptr[b + 1] - c.kv_indptr[b];
  return pages > 0 ? int64_t(pages - 1) * c.page_size + c.last_page_len[b] : 0;
}

// Pools block j of (sequence, KV head h) and writes its cache entry, then its flag. Called by
// every thread of the CTA (it synchronises); pooled [3d] and out [gate_dim] are shared memory.
__device__ void fill_block(const SeerCudaCommon& c, const void* k_pre, Storage k_elem, const float* wk,
                           const int32_t* pages, int32_t h, int32_t j, float* pooled, float* out) {
  const int32_t d = c.head_dim, dg = c.gate_dim, block_pages = c.block / c.page_size;
  float* entry = c.cache + (int64_t(pages[j * block_pages]) * c.n_kv_heads + h) * (dg + 1);
  for (int32_t ch = threadIdx.x; ch < d; ch += blockDim.x) {
    float mx = -INFINITY, mn = INFINITY, sum = 0.f;
    for (int32_t t = 0; t < c.block; ++t) {
      const int64_t tok = int64_t(j) * c.block + t;
      const int64_t at = c.k_pre_strides.row(pages[tok / c.page_size], h, tok % c.page_size);
      const float v = load_storage(k_pre, k_elem, at + ch);
      mx = v > mx ? v : mx;
      mn = v < mn ? v : mn;
      sum += v;
    }
    pooled[ch] = mx;
    pooled[d + ch] = mn;
    pooled[2 * d + ch] = sum / float(c.block);
  }
  __syncthreads();
  const float* W = wk + int64_t(h) * dg * 3 * d;
  for (int32_t r = threadIdx.x; r < dg; r += blockDim.x) project(W + int64_t(r) * 3 * d, pooled, 1, 3 * d, out + r);
  __syncthreads();
  if (threadIdx.x == 0) {
    if (c.rmsnorm) rms_normalize(out, dg);
    rope_rotate(out, dg, int64_t(j) * c.block, c.rope_theta);
  }
  __syncthreads();
  for (int32_t i = threadIdx.x; i < dg; i += blockDim.x) entry[i] = out[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    entry[dg] = 1.f;
  }
  __syncthreads();  // pooled/out are reused by the next block
}

// Whether block j's entry is filled, the same answer for every thread of the CTA (one read by
// thread 0; a barrier).
__device__ __forceinline__ bool block_filled(const SeerCudaCommon& c, const int32_t* pages, int32_t h, int32_t j) {
  const int32_t dg = c.gate_dim, block_pages = c.block / c.page_size;
  return __syncthreads_or(threadIdx.x == 0 &&
                          c.cache[(int64_t(pages[j * block_pages]) * c.n_kv_heads + h) * (dg + 1) + dg] == 1.f);
}

// One CTA per (sequence, KV head, z): the CTA's blocks are j = z, z + Z, ... below the complete
// count. All threads test the "filled" flags at once (one memory round trip), the missing blocks
// go to a shared list, and the CTA computes them one after the other.
__global__ void __launch_bounds__(kThreads) fill_cache(FillCacheLaunch a) {
  const SeerCudaCommon& c = a.c;
  extern __shared__ float sh[];
  float* pooled = sh;                // [3d]
  float* out = sh + 3 * c.head_dim;  // [gate_dim]
  __shared__ int32_t missing[kThreads];
  __shared__ int32_t n_missing;
  const int32_t b = blockIdx.x, h = blockIdx.y, dg = c.gate_dim;
  const int32_t complete = int32_t(kv_len_of(c, b) / c.block);
  const int32_t block_pages = c.block / c.page_size;
  const int32_t* pages = c.kv_pages + c.kv_indptr[b];
  auto entry_of = [&](int32_t j) { return c.cache + (int64_t(pages[j * block_pages]) * c.n_kv_heads + h) * (dg + 1); };
  const int32_t stride = int32_t(gridDim.z) * kThreads;
  for (int32_t base = blockIdx.z; base < complete; base += stride) {
    if (threadIdx.x == 0) n_missing = 0;
    __syncthreads();
    const int32_t mine = base + int32_t(threadIdx.x) * int32_t(gridDim.z);
    if (mine < complete && entry_of(mine)[dg] != 1.f) missing[atomicAdd(&n_missing, 1)] = mine;
    __syncthreads();
    const int32_t n = n_missing;
    for (int32_t m = 0; m < n; ++m) fill_block(c, a.k_pre, a.k_elem, a.wk, pages, h, missing[m], pooled, out);
  }
}

__global__ void block_offsets(SeerCudaCommon c, int32_t* block_indptr) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  int32_t acc = 0;
  block_indptr[0] = 0;
  for (int32_t b = 0; b < c.batch; ++b) {
    acc += int32_t((kv_len_of(c, b) + c.block - 1) / c.block);
    block_indptr[b + 1] = acc;
  }
}

// The raw gate query W_q x (before RMSNorm / RoPE): grid (batch, hkv, ceil(dg / 8)), a warp per
// projection row, lanes over the group's g*d inputs (coalesced), a warp-shuffle sum.
// Folded in (fused=true): CTA (0, 0, 0) also writes block_indptr (block_offsets' work), and CTA
// (b, h, 0) first brings row (b, h)'s cache up to date (the decode step's on_append launches
// nothing): from the newest complete block back to the first filled one, as on the CPU. Both
// finish before gate_scores, the next kernel on the stream, reads them.
__global__ void __launch_bounds__(256) gate_query_raw(GateScoresLaunch a) {
  const SeerCudaCommon& c = a.c;
  const int32_t b = blockIdx.x, h = blockIdx.y, d = c.head_dim, dg = c.gate_dim;
  if (a.fold_offsets && b == 0 && h == 0 && blockIdx.z == 0 && threadIdx.x < 32) {
    // Warp 0: 32 sequences' block counts at a time (parallel page-table reads), a warp scan.
    const int32_t lane = threadIdx.x;
    if (lane == 0) a.block_indptr[0] = 0;
    int32_t running = 0;
    for (int32_t base = 0; base < c.batch; base += 32) {
      const int32_t s = base + lane;
      int32_t v = s < c.batch ? int32_t((kv_len_of(c, s) + c.block - 1) / c.block) : 0;
      for (int32_t o = 1; o < 32; o <<= 1) {
        const int32_t up = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += up;
      }
      if (s < c.batch) a.block_indptr[s + 1] = running + v;
      running += __shfl_sync(0xffffffffu, v, 31);
    }
  }
  if (a.catch_up && blockIdx.z == 0) {
    extern __shared__ float sh[];  // pooled [3d], out [dg]
    const int32_t* pages = c.kv_pages + c.kv_indptr[b];
    for (int32_t j = int32_t(kv_len_of(c, b) / c.block) - 1; j >= 0 && !block_filled(c, pages, h, j); --j)
      fill_block(c, a.k_pre, a.k_elem, a.wk, pages, h, j, sh, sh + 3 * d);
  }
  const int32_t g = c.n_q_heads / c.n_kv_heads, gd = g * d;
  const int32_t warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t r = blockIdx.z * 8 + warp;
  if (r >= dg) return;
  const int64_t q0 = (int64_t(b) * c.n_q_heads + int64_t(h) * g) * d;
  const float* w = a.wq + (int64_t(h) * dg + r) * gd;
  float acc = 0.f;
  for (int32_t i = lane; i < gd; i += 32) acc += w[i] * load_storage(a.q_pre, a.q_elem, q0 + i);
  for (int32_t o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if (lane == 0) a.q_raw[(int64_t(b) * c.n_kv_heads + h) * dg + r] = acc;
}

// Scores: grid (batch, hkv, chunks of kThreads blocks). Each CTA finishes the gate query (RMSNorm
// by a block reduction, RoPE a thread per channel pair) in shared memory, then a thread per block
// dots it with the block's cache entry. Softmax (threshold mode) runs in gate_softmax.
__global__ void __launch_bounds__(kThreads) gate_scores(GateScoresLaunch a) {
  const SeerCudaCommon& c = a.c;
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ float s_scale;
  extern __shared__ float qgate[];  // [gate_dim]
  const int32_t b = blockIdx.x, h = blockIdx.y, dg = c.gate_dim;
  const int32_t first = a.block_indptr[b], nb = a.block_indptr[b + 1] - first;
  if (int32_t(blockIdx.z) * kThreads >= nb) return;  // uniform: no block of this chunk
  const float* raw = a.q_raw + (int64_t(b) * c.n_kv_heads + h) * dg;
  float ss = 0.f;
  for (int32_t i = threadIdx.x; i < dg; i += blockDim.x) {
    qgate[i] = raw[i];
    ss += raw[i] * raw[i];
  }
  if (c.rmsnorm) {
    const float total = Reduce(temp).Sum(ss);
    if (threadIdx.x == 0) s_scale = 1.f / sqrtf(total / float(dg) + kRmsEps);
  }
  __syncthreads();
  const int64_t kv_len = kv_len_of(c, b);
  const int64_t pos = kv_len - 1;  // decode: the query sits at kv_len - 1
  for (int32_t i = 2 * threadIdx.x; i + 1 < dg; i += 2 * blockDim.x) {
    float v0 = qgate[i], v1 = qgate[i + 1];
    if (c.rmsnorm) {
      v0 *= s_scale;
      v1 *= s_scale;
    }
    const float ang = rope_angle(pos, i, dg, c.rope_theta);
    const float co = cosf(ang), si = sinf(ang);
    qgate[i] = v0 * co - v1 * si;
    qgate[i + 1] = v0 * si + v1 * co;
  }
  __syncthreads();
  const int32_t complete = int32_t(kv_len / c.block), block_pages = c.block / c.page_size;
  const int32_t* pages = c.kv_pages + c.kv_indptr[b];
  const int32_t j = int32_t(blockIdx.z) * kThreads + int32_t(threadIdx.x);
  if (j >= nb) return;
  float s = -INFINITY;
  if (j < complete && j + 1 < nb) {  // the last block is forced, never ranked
    const float* entry = c.cache + (int64_t(pages[j * block_pages]) * c.n_kv_heads + h) * (dg + 1);
    if (entry[dg] == 1.f) s = gate_score(qgate, entry, dg);  // an unfilled entry is never ranked
  } else if (j < complete && a.softmax) {
    // The complete last block still counts in the softmax's denominator (as on the CPU).
    const float* entry = c.cache + (int64_t(pages[j * block_pages]) * c.n_kv_heads + h) * (dg + 1);
    if (entry[dg] == 1.f) a.last_score[int64_t(b) * c.n_kv_heads + h] = gate_score(qgate, entry, dg);
  }
  a.scores[(int64_t(first) + j) * c.n_kv_heads + h] = s;
}

// Threshold mode: the scores of each (sequence, KV head) row become softmax probabilities over
// its complete blocks (the last block's score, when complete, from last_score). One CTA per row.
__global__ void __launch_bounds__(kThreads) gate_softmax(GateScoresLaunch a) {
  const SeerCudaCommon& c = a.c;
  using Reduce = cub::BlockReduce<double, kThreads>;
  __shared__ typename Reduce::TempStorage temp;
  __shared__ double s_max, s_sum;
  const int32_t b = blockIdx.x, h = blockIdx.y;
  const int32_t first = a.block_indptr[b], nb = a.block_indptr[b + 1] - first;
  const int32_t complete = int32_t(kv_len_of(c, b) / c.block);
  const bool last_complete = nb > 0 && complete == nb;
  const float last = last_complete ? a.last_score[int64_t(b) * c.n_kv_heads + h] : -INFINITY;
  float* row = a.scores + int64_t(first) * c.n_kv_heads + h;
  const int32_t ranked = complete < nb ? complete : nb - 1;  // complete blocks other than the last
  double mx = -INFINITY;
  for (int32_t j = threadIdx.x; j < ranked; j += blockDim.x) mx = fmax(mx, double(row[int64_t(j) * c.n_kv_heads]));
  if (threadIdx.x == 0) mx = fmax(mx, double(last));
  mx = Reduce(temp).Reduce(mx, MaxOp{});
  if (threadIdx.x == 0) s_max = mx;
  __syncthreads();
  double sum = 0;
  for (int32_t j = threadIdx.x; j < ranked; j += blockDim.x) sum += exp(double(row[int64_t(j) * c.n_kv_heads]) - s_max);
  if (threadIdx.x == 0 && last_complete) sum += exp(double(last) - s_max);
  sum = Reduce(temp).Sum(sum);
  if (threadIdx.x == 0) s_sum = sum;
  __syncthreads();
  for (int32_t j = threadIdx.x; j < ranked; j += blockDim.x) {
    float& s = row[int64_t(j) * c.n_kv_heads];
    s = float(exp(double(s) - s_max) / s_sum);
  }
}

__device__ int32_t threshold_count(const ThresholdLaunch& a, int32_t r) {
  const int32_t b = r / a.n_kv_heads, h = r % a.n_kv_heads;
  const int32_t first = a.block_indptr[b], nb = a.block_indptr[b + 1] - first;
  if (nb == 0) return 0;
  int32_t n = 1;  // the last block
  for (int32_t j = 0; j + 1 < nb; ++j) n += a.scores[(int64_t(first) + j) * a.n_kv_heads + h] > a.threshold;
  return n;
}

__global__ void __launch_bounds__(kScanThreads) threshold_offsets(ThresholdLaunch a) {
  using Scan = cub::BlockScan<int32_t, kScanThreads>;
  __shared__ typename Scan::TempStorage temp;
  const int32_t rows = a.batch * a.n_kv_heads;
  int32_t running = 0;
  for (int32_t base = 0; base < rows; base += kScanThreads) {
    const int32_t r = base + int32_t(threadIdx.x);
    const int32_t n = r < rows ? threshold_count(a, r) : 0;
    int32_t prefix, total;
    Scan(temp).ExclusiveSum(n, prefix, total);
    if (r < rows) a.sel_indptr[r] = running + prefix;
    running += total;
    __syncthreads();
  }
  if (threadIdx.x == 0) a.sel_indptr[rows] = running;
}

__global__ void threshold_write(ThresholdLaunch a) {
  const int32_t r = blockIdx.x;
  if (threadIdx.x != 0) return;
  const int32_t b = r / a.n_kv_heads, h = r % a.n_kv_heads;
  const int32_t first = a.block_indptr[b], nb = a.block_indptr[b + 1] - first;
  int64_t at = a.sel_indptr[r];
  for (int32_t j = 0; j < nb; ++j)
    if (j + 1 == nb || a.scores[(int64_t(first) + j) * a.n_kv_heads + h] > a.threshold) {
      if (at < a.capacity) a.sel_indices[at] = j;  // the host checked the bound; a guard all the same
      ++at;
    }
}

const char* last_launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* launch_fill_cache(const FillCacheLaunch& a) noexcept {
  if (a.c.batch == 0 || a.max_complete <= 0) return nullptr;
  // ~32 flags per CTA: a steady-state step (nothing or one block to fill) stays a small grid,
  // and a catch-up after prefill still spreads its blocks over up to kMaxZ CTAs per (seq, head).
  const int32_t z = (a.max_complete + 31) / 32;
  const dim3 grid(unsigned(a.c.batch), unsigned(a.c.n_kv_heads), unsigned(z < kMaxZ ? z : kMaxZ));
  const size_t shared = size_t(3 * a.c.head_dim + a.c.gate_dim) * sizeof(float);
  fill_cache<<<grid, kThreads, shared, static_cast<cudaStream_t>(a.c.stream)>>>(a);
  return last_launch_error();
}

const char* launch_gate_scores(const GateScoresLaunch& a) noexcept {
  auto stream = static_cast<cudaStream_t>(a.c.stream);
  const bool query = a.c.batch > 0 && a.max_blocks > 0;
  if (!query || !a.fold_offsets) {
    block_offsets<<<1, 1, 0, stream>>>(a.c, a.block_indptr);
    if (const char* e = last_launch_error()) return e;
  }
  if (!query) return nullptr;  // no block anywhere: nothing to fill or score
  const unsigned b = unsigned(a.c.batch), h = unsigned(a.c.n_kv_heads);
  const size_t shared = a.catch_up ? size_t(3 * a.c.head_dim + a.c.gate_dim) * sizeof(float) : 0;
  gate_query_raw<<<dim3(b, h, unsigned((a.c.gate_dim + 7) / 8)), 256, shared, stream>>>(a);
  if (const char* e = last_launch_error()) return e;
  const unsigned chunks = unsigned((a.max_blocks + kThreads - 1) / kThreads);
  gate_scores<<<dim3(b, h, chunks), kThreads, size_t(a.c.gate_dim) * sizeof(float), stream>>>(a);
  if (const char* e = last_launch_error()) return e;
  if (a.softmax) gate_softmax<<<dim3(b, h), kThreads, 0, stream>>>(a);
  return last_launch_error();
}

const char* launch_threshold_select(const ThresholdLaunch& a) noexcept {
  auto stream = static_cast<cudaStream_t>(a.stream);
  threshold_offsets<<<1, kScanThreads, 0, stream>>>(a);
  if (const char* e = last_launch_error()) return e;
  if (a.batch * a.n_kv_heads > 0) threshold_write<<<unsigned(a.batch * a.n_kv_heads), 32, 0, stream>>>(a);
  return last_launch_error();
}

const char* copy_to_device(void* dst, const void* src, size_t bytes) noexcept {
  cudaError_t e = cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
  // From pageable memory the copy may still be in flight on return, and the host's stream may be
  // non-blocking: create (the only caller) waits, so the first hook sees the weights.
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace sieve::seer
