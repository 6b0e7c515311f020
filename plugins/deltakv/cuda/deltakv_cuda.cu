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
//   stage 3  deltakv_attend: FlashAttention-style FMA kernel, a CTA per (32 query tokens, query
//            head, sequence), 4 threads per query row; phase 1 walks the anchor list (K̂/V̂ rows
//            gathered from the pages by position) in tiles of 32 with logit + log2(count), phase 2
//            the original keys from the tile's earliest exact position to its last query; each row
//            masks what is not its own (anchor index >= its safe count, position outside its exact
//            span) and the online softmax (log2 domain, f32) runs over both phases.
// This stage-3 kernel uses f32 FMAs: it serves f32 storage, head_dim 8-32, mixed q/KV dtypes and
// phase2=off; 16-bit q and K/V at head_dim 64/128 take the tensor-core kernel
// (deltakv_attend_mma.cu).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "cuda/deltakv_cuda.hpp"
#include "cuda/deltakv_mma.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::deltakv {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kStageKeys = 16;  // keys per shared-memory stage of the stage-1 walk
constexpr int kMaxD = 128;
constexpr int kRowsPerCta = 32;  // query tokens per attention CTA
constexpr int kTile = 32;        // keys per attention tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

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

// ---- stage 3 ----------------------------------------------------------------------------------

template <int D>
__global__ void __launch_bounds__(kThreads) deltakv_attend(const CudaLaunch a) {
  constexpr int DPT = D / 4;  // dims per thread (interleaved: dim = sub + 4 i)
  __shared__ float sk[kTile][D];
  __shared__ float sv[kTile][D];
  __shared__ int32_t s_anchor[kTile], s_reach[kTile];
  __shared__ int32_t s_max_anchors, s_min_exact, s_max_pos;

  const int tid = threadIdx.x, row = tid / 4, sub = tid % 4;
  const int32_t b = blockIdx.z, h = blockIdx.y;
  const int32_t kvh = h / (a.hq / a.hkv);
  const int32_t q_begin = a.qo_indptr[b], n_new = a.qo_indptr[b + 1] - q_begin;
  const int32_t tile = int32_t(gridDim.x) - 1 - int32_t(blockIdx.x);  // latest queries first
  const int32_t t0 = tile * kRowsPerCta;
  if (t0 >= n_new) return;  // CTA-uniform
  const int32_t n = kv_len_of(a, b);
  const int64_t seq = int64_t(b) * a.hkv + kvh;
  const int32_t m = a.n_anchors[seq];
  const int32_t* anchor = a.anchor + seq * a.max_seq_len;
  const int32_t* reach = a.reach + seq * a.max_seq_len;
  const CudaAttendRule& R = a.attend;

  const int32_t t = t0 + row;
  const bool valid = t < n_new;
  const int32_t pos = n - n_new + (valid ? t : 0);
  int32_t n_anchor = 0, exact_begin = pos + 1;
  if (valid) {
    if (R.phase2 == kPhase2Off) {
      n_anchor = visible_anchors(anchor, m, pos);
    } else {
      const RowSpan span = row_span(reach, m, pos, R.q_block);
      exact_begin = span.exact_begin;
      n_anchor = R.phase2 == kPhase2Only ? 0 : span.safe;
    }
  }
  if (tid == 0) {
    s_max_anchors = 0;
    s_min_exact = INT32_MAX;
    s_max_pos = -1;
  }
  __syncthreads();
  if (valid && sub == 0) {
    atomicMax(&s_max_anchors, n_anchor);
    if (exact_begin <= pos) atomicMin(&s_min_exact, exact_begin);
    atomicMax(&s_max_pos, pos);
  }
  __syncthreads();
  const int32_t max_anchors = s_max_anchors, min_exact = s_min_exact, max_pos = s_max_pos;

  const float qscale = R.scale * kLog2e;
  float q[DPT], o[DPT];
  const int64_t qrow = (int64_t(q_begin + (valid ? t : 0)) * a.hq + h) * D;
#pragma unroll
  for (int i = 0; i < DPT; ++i) {
    q[i] = valid ? load_storage(a.q, a.q_dt, qrow + sub + 4 * i) * qscale : 0.f;
    o[i] = 0.f;
  }
  float m_run = kNegInf, l_run = 0.f;

  // Loads a tile: key r of the tile sits at position kpos (or is absent: kpos < 0), 4 threads
  // per key, each a contiguous quarter of the head dimension.
  auto load_tile = [&](auto position_of) {
    const int r = tid / 4;
    const int32_t kpos = position_of(r);
    const int64_t off = kpos >= 0 ? key_offset(a, b, kvh, kpos) : -1;
#pragma unroll
    for (int i = 0; i < DPT; ++i) {
      const int dim = sub * DPT + i;
      sk[r][dim] = off >= 0 ? load_storage(a.k, a.kv_dt, off + dim) : 0.f;
      sv[r][dim] = off >= 0 ? load_storage(a.v, a.kv_dt, off + dim) : 0.f;
    }
  };
  // One online-softmax step over the tile for this thread's row; s[r] in the log2 domain.
  auto consume = [&](float (&s)[kTile]) {
    float mx = kNegInf;
#pragma unroll
    for (int r = 0; r < kTile; ++r) mx = fmaxf(mx, s[r]);
    const float m_new = fmaxf(m_run, mx);
    const float m_use = m_new == kNegInf ? 0.f : m_new;
    const float alpha = exp2f(m_run - m_use);
    m_run = m_new;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < DPT; ++i) o[i] *= alpha;
#pragma unroll
    for (int r = 0; r < kTile; ++r) {
      const float p = exp2f(s[r] - m_use);
      sum += p;
#pragma unroll
      for (int i = 0; i < DPT; ++i) o[i] = fmaf(p, sv[r][sub + 4 * i], o[i]);
    }
    l_run = l_run * alpha + sum;
  };
  auto score = [&](int r) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < DPT; ++i) s = fmaf(q[i], sk[r][sub + 4 * i], s);
    s += __shfl_xor_sync(0xffffffffu, s, 1);
    s += __shfl_xor_sync(0xffffffffu, s, 2);
    return s;
  };

  // Phase 1: the packed anchors, count-weighted.
  for (int32_t j0 = 0; j0 < max_anchors; j0 += kTile) {
    __syncthreads();  // the previous tile is no longer read
    load_tile([&](int r) { return j0 + r < max_anchors ? anchor[j0 + r] : -1; });
    if (tid < kTile) {
      s_anchor[tid] = j0 + tid < max_anchors ? anchor[j0 + tid] : 0;
      s_reach[tid] = j0 + tid < max_anchors ? reach[j0 + tid] : 0;
    }
    __syncthreads();
    float s[kTile];
#pragma unroll
    for (int r = 0; r < kTile; ++r) {
      const float z = score(r);
      s[r] = kNegInf;
      if (j0 + r < n_anchor) {
        s[r] = z;
        if (R.count_weighting)
          s[r] += log2f(float(anchor_count(s_anchor[r], s_reach[r], pos)));
      }
    }
    consume(s);
  }
  // Phase 2: the original keys of the critical diagonal.
  if (min_exact != INT32_MAX) {
    for (int32_t k0 = min_exact; k0 <= max_pos; k0 += kTile) {
      __syncthreads();
      load_tile([&](int r) { return k0 + r <= max_pos ? k0 + r : -1; });
      __syncthreads();
      float s[kTile];
#pragma unroll
      for (int r = 0; r < kTile; ++r) {
        const float z = score(r);
        const int32_t kp = k0 + r;
        s[r] = kp >= exact_begin && kp <= pos ? z : kNegInf;
      }
      consume(s);
    }
  }
  if (!valid) return;
  const float inv = l_run > 0.f ? 1.f / l_run : 0.f;
#pragma unroll
  for (int i = 0; i < DPT; ++i) store_storage(a.out, a.out_dt, qrow + sub + 4 * i, o[i] * inv);
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

const char* launch_deltakv(const CudaLaunch& a) noexcept {
  if (a.batch == 0) return nullptr;
  if (const char* e = launch_deltakv_pack(a)) return e;
  if (a.max_new == 0) return nullptr;
  if (mma_attend_applies(a)) {
    const cudaError_t e = launch_attend_mma(a);
    return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
  }
  auto stream = static_cast<cudaStream_t>(a.stream);
  const dim3 grid(unsigned((a.max_new + kRowsPerCta - 1) / kRowsPerCta), unsigned(a.hq),
                  unsigned(a.batch));
  switch (a.d) {
    case 8: deltakv_attend<8><<<grid, kThreads, 0, stream>>>(a); break;
    case 16: deltakv_attend<16><<<grid, kThreads, 0, stream>>>(a); break;
    case 32: deltakv_attend<32><<<grid, kThreads, 0, stream>>>(a); break;
    case 64: deltakv_attend<64><<<grid, kThreads, 0, stream>>>(a); break;
    case 128: deltakv_attend<128><<<grid, kThreads, 0, stream>>>(a); break;
    default: return "head_dim is not one of 8, 16, 32, 64, 128";
  }
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
