// CUDA half of the deltakv plugin: the three stages of Delta-KV on the host's stream, reading the
// lengths from the view's device page table (nothing uploaded, allocated or synchronised).
//   stage 1  deltakv_keep: a warp per (chunk, KV head, sequence) walks its chunk sequentially
//            (the anchor dependency), 16 keys at a time staged in shared memory; lane l holds
//            dimensions l, l + 32, ... and the sums meet in an xor butterfly: the CPU's order
//            (deltakv_math.hpp), so the keep masks are bit-identical;
//   stage 2  deltakv_pack: a warp per chunk again: its first anchor's index is the sum of the
//            anchor counts of the earlier chunks; ballots compact positions into anchor[] and
//            reach[] (and each anchor's physical page into anchor_page[]); the sequence's last
//            chunk writes the anchor count m;
//   stage 3  deltakv_spans: each anchor's count and each row's spans (deltakv_math.hpp's
//            variant_spans), the description the core kernel's attention variant attends: the
//            safe anchors count-weighted, then the exact keys of the critical diagonal.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/deltakv_cuda.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::deltakv {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kStageKeys = 16;  // keys per shared-memory stage of the stage-1 walk
constexpr int kMaxD = 128;

__device__ inline int32_t kv_len_of(const CudaLaunch& a, int32_t b) {
  const int32_t pages = a.kv_indptr[b + 1] - a.kv_indptr[b];
  return pages > 0 ? (pages - 1) * a.page_size + a.last_page_len[b] : 0;
}

// Element offset of (position, KV head, dim 0) in the pages, or -1 for a bad page-table entry
// (that key then reads as zeros).
__device__ inline int64_t key_offset(const CudaLaunch& a, int32_t b, int32_t kvh, int32_t pos) {
  const int64_t slot = int64_t(a.kv_indptr[b]) + pos / a.page_size;
  if (slot < 0 || slot >= a.kv_indices_len) return -1;
  const int32_t phys = a.kv_indices[slot];
  if (phys < 0 || phys >= a.page_capacity) return -1;
  return a.kv_strides.row(phys, kvh, pos % a.page_size);
}

__device__ inline float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__device__ inline int32_t chunks_per_seq(const CudaLaunch& a) {
  return (a.max_seq_len + a.keep_rule.chunk - 1) / a.keep_rule.chunk;
}

// ---- stage 1 ----------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) deltakv_keep(const CudaLaunch a) {
  __shared__ float stage[kWarps][kStageKeys][kMaxD];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t b = blockIdx.z, kvh = blockIdx.y;
  const int32_t c = blockIdx.x * kWarps + warp;
  const int32_t n = kv_len_of(a, b);
  const KeepRule& r = a.keep_rule;
  const int32_t c0 = c * r.chunk;
  if (c0 >= n) return;  // warp-uniform
  const int32_t c1 = min(n, c0 + r.chunk);
  const int64_t seq = int64_t(b) * a.hkv + kvh;
  uint8_t* keep = a.keep + seq * a.max_seq_len;
  const int32_t d = a.d;
  constexpr int kPer = kMaxD / 32;  // dims per lane
  float anchor[kPer];
  int32_t count = 1;
  if (lane == 0) keep[c0] = 1;
  if (r.packing != kDelta) {
    for (int32_t base = c0 + 1; base < c1; base += 32) {
      const int32_t i = base + lane;
      const bool kept = i < c1 && fixed_keeps(r, a.layer, kvh, i);
      if (i < c1) keep[i] = kept ? 1 : 0;
      count += __popc(__ballot_sync(0xffffffffu, kept));
    }
  } else {
    float(*st)[kMaxD] = stage[warp];
    for (int32_t s0 = c0; s0 < c1; s0 += kStageKeys) {
      const int32_t s1 = min(c1, s0 + kStageKeys);
      __syncwarp();
      for (int32_t k = s0; k < s1; ++k) {  // stage keys [s0, s1): each lane its dims
        const int64_t off = key_offset(a, b, kvh, k);
        for (int32_t i = lane; i < d; i += 32)
          st[k - s0][i] = off >= 0 ? load_storage(a.k, a.kv_dt, off + i) : 0.f;
      }
      __syncwarp();
      for (int32_t k = s0; k < s1; ++k) {
        float x[kPer];
#pragma unroll
        for (int j = 0; j < kPer; ++j) x[j] = lane + 32 * j < d ? st[k - s0][lane + 32 * j] : 0.f;
        if (k == c0) {
#pragma unroll
          for (int j = 0; j < kPer; ++j) anchor[j] = x[j];
          continue;
        }
        float dot = 0.f, aa = 0.f, bb = 0.f, df = 0.f;
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          if (lane + 32 * j >= d) break;
          const float z = x[j] - anchor[j];
          dot = fmaf(x[j], anchor[j], dot);
          aa = fmaf(x[j], x[j], aa);
          bb = fmaf(anchor[j], anchor[j], bb);
          df = fmaf(z, z, df);
        }
        const Sums s{warp_sum(dot), warp_sum(aa), warp_sum(bb), warp_sum(df)};
        const bool kept = delta_keeps(r, s);  // identical in every lane
        if (lane == 0) keep[k] = kept ? 1 : 0;
        if (kept) {
          ++count;
#pragma unroll
          for (int j = 0; j < kPer; ++j) anchor[j] = x[j];
        }
      }
    }
  }
  if (lane == 0) a.chunk_anchors[seq * chunks_per_seq(a) + c] = count;
}

// ---- stage 2 ----------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) deltakv_pack(const CudaLaunch a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int32_t b = blockIdx.z, kvh = blockIdx.y;
  const int32_t c = blockIdx.x * kWarps + warp;
  const int32_t n = kv_len_of(a, b);
  const int64_t seq = int64_t(b) * a.hkv + kvh;
  const int32_t chunk = a.keep_rule.chunk;
  if (n == 0) {
    if (c == 0 && lane == 0) a.n_anchors[seq] = 0;
    return;
  }
  const int32_t c0 = c * chunk;
  if (c0 >= n) return;
  const int32_t c1 = min(n, c0 + chunk);
  const int32_t* counts = a.chunk_anchors + seq * chunks_per_seq(a);
  int32_t off = 0;
  for (int32_t i = lane; i < c; i += 32) off += counts[i];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) off += __shfl_xor_sync(0xffffffffu, off, o);
  const uint8_t* keep = a.keep + seq * a.max_seq_len;
  int32_t* anchor = a.anchor + seq * a.max_seq_len;
  int32_t* reach = a.reach + seq * a.max_seq_len;
  int32_t* anchor_page = a.anchor_page + seq * a.max_seq_len;
  int32_t idx = off;  // next anchor index
  for (int32_t base = c0; base < c1; base += 32) {
    const int32_t pos = base + lane;
    const bool kept = pos < c1 && keep[pos];
    const unsigned mask = __ballot_sync(0xffffffffu, kept);
    if (kept) {
      const int32_t j = idx + __popc(mask & ((1u << lane) - 1));
      anchor[j] = pos;
      const int64_t slot = int64_t(a.kv_indptr[b]) + pos / a.page_size;
      const int32_t phys = slot < a.kv_indices_len ? a.kv_indices[slot] : -1;
      anchor_page[j] = phys >= 0 && phys < a.page_capacity ? phys : -1;
      if (j > off) reach[j - 1] = pos - 1;
    }
    idx += __popc(mask);
  }
  if (lane == 0) {
    reach[idx - 1] = c1 - 1;  // the chunk's last run ends with the chunk
    if (c1 == n) a.n_anchors[seq] = idx;
  }
}

// ---- stage 3's description ---------------------------------------------------------------------

// Thread i of (sequence b, KV head): anchor i's count, and the spans of the sequence's i-th row
// block (variant_spans from the block's first query position).
__global__ void __launch_bounds__(kThreads) deltakv_spans(const CudaLaunch a, const CudaSpans s) {
  const int32_t b = blockIdx.z, kvh = blockIdx.y;
  const int32_t i = int32_t(blockIdx.x) * kThreads + int32_t(threadIdx.x);
  const int64_t seq = int64_t(b) * a.hkv + kvh;
  const int32_t m = a.n_anchors[seq];
  const int32_t base = int32_t(seq * a.max_seq_len);
  if (i < m) s.count[base + i] = a.reach[base + i] - a.anchor[base + i] + 1;
  const int32_t q0 = a.qo_indptr[b], n_new = a.qo_indptr[b + 1] - q0;
  const int32_t qb = s.rows_q_block;
  if (i >= (n_new + qb - 1) / qb) return;
  int64_t c_b = 0;  // row blocks of the earlier sequences
  for (int32_t e = 0; e < b; ++e) c_b += (a.qo_indptr[e + 1] - a.qo_indptr[e] + qb - 1) / qb;
  const int32_t n = kv_len_of(a, b);
  const int64_t row = (c_b + i) * a.hkv + kvh;
  int32_t(*out)[3] = reinterpret_cast<int32_t(*)[3]>(s.spans + row * 6);
  const int32_t k = variant_spans(s.phase2, a.reach + base, m, n - n_new + i * qb, s.q_block, base, n, out);
  s.row_spans[2 * row] = int32_t(2 * row);
  s.row_spans[2 * row + 1] = int32_t(2 * row + k);
}

const char* last_launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* launch_deltakv_pack(const CudaLaunch& a) noexcept {
  if (a.batch == 0) return nullptr;
  if (a.d > kMaxD) return "head_dim above 128";
  auto stream = static_cast<cudaStream_t>(a.stream);
  const int32_t chunks = (a.max_kv_len + a.keep_rule.chunk - 1) / a.keep_rule.chunk;
  const dim3 grid(unsigned((chunks + kWarps - 1) / kWarps > 0 ? (chunks + kWarps - 1) / kWarps : 1),
                  unsigned(a.hkv), unsigned(a.batch));
  deltakv_keep<<<grid, kThreads, 0, stream>>>(a);
  if (const char* e = last_launch_error()) return e;
  deltakv_pack<<<grid, kThreads, 0, stream>>>(a);
  return last_launch_error();
}

const char* launch_deltakv_spans(const CudaLaunch& a, const CudaSpans& s, int32_t max_new) noexcept {
  if (a.batch == 0) return nullptr;
  const int32_t items = std::max(a.max_kv_len, (max_new + s.rows_q_block - 1) / s.rows_q_block);
  const dim3 grid(unsigned(std::max(1, (items + kThreads - 1) / kThreads)), unsigned(a.hkv), unsigned(a.batch));
  deltakv_spans<<<grid, kThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(a, s);
  return last_launch_error();
}

const char* read_anchor_counts(const CudaLaunch& a, int32_t* host) noexcept {
  auto stream = static_cast<cudaStream_t>(a.stream);
  cudaError_t e = cudaMemcpyAsync(host, a.n_anchors, size_t(a.batch) * a.hkv * sizeof(int32_t),
                                  cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace sieve::deltakv
