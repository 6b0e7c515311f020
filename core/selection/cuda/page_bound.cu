// CUDA half of page_bound.hpp.
//   minmax_append: block (touched page t, sequence b); threads over (KV head, channel). The page's
//                  new tokens are read back from the store's pages; the first token of a page
//                  initialises it, later appends fold into the stored min/max (as the CPU).
//   page_bounds:   a half-warp per (sequence, page, KV head); lane p sums chunk p (8 channels,
//                  one vector load), then a butterfly — the canonical order of page_bound.hpp, so
//                  the CPU's bits.
// Templated on the KV storage type only (3 instantiations each); q's dtype is a runtime switch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstdint>
#include <cstring>

#include "sieve/selection/page_bound.hpp"
#include "sieve/selection/page_bound_cuda.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::selection {
namespace {

constexpr int kAppendThreads = 256;


template <class T>
__global__ void __launch_bounds__(kAppendThreads) minmax_append(MinMaxAppendLaunch a) {
  const int32_t b = int32_t(blockIdx.y);
  const int32_t ps = a.page_size, d = a.head_dim, H = a.n_kv_heads;
  const int32_t n_pages = a.kv_indptr[b + 1] - a.kv_indptr[b];
  if (n_pages <= 0) return;
  const int64_t len = int64_t(n_pages - 1) * ps + a.last_page_len[b];
  // No new_indptr: recompute the whole sequence (catch-up).
  const int64_t n_new = a.new_indptr ? a.new_indptr[b + 1] - a.new_indptr[b] : len;
  if (n_new <= 0 || n_new > len) return;
  const int64_t first = len - n_new;
  const int64_t logical = first / ps + blockIdx.x;
  if (logical * ps >= len) return;
  const int64_t start = first > logical * ps ? first : logical * ps;
  const int64_t end = len < (logical + 1) * ps ? len : (logical + 1) * ps;
  const int32_t offset = int32_t(start - logical * ps), stop = int32_t(end - logical * ps);
  const int64_t phys = a.kv_indices[a.kv_indptr[b] + logical];
  const T* k = static_cast<const T*>(a.k_pages);
  T* side = static_cast<T*>(a.sidecar);
  for (int32_t i = int32_t(threadIdx.x); i < H * d; i += kAppendThreads) {
    const int32_t h = i / d, c = i % d;
    const int64_t kbase = a.k_strides.row(phys, h, 0) + c;
    const int64_t sbase = (phys * H + h) * 2 * d + c;
    int32_t t = offset;
    float mn, mx;
    if (offset == 0) {
      mn = mx = to_f32(k[kbase]);
      ++t;
    } else {
      mn = to_f32(side[sbase]);
      mx = to_f32(side[sbase + d]);
    }
    for (; t < stop; ++t) {
      const float v = to_f32(k[kbase + int64_t(t) * a.k_strides.token]);
      mn = fminf(mn, v);
      mx = fmaxf(mx, v);
    }
    side[sbase] = from_f32<T>(mn);
    side[sbase + d] = from_f32<T>(mx);
  }
}

// ---- page bounds ------------------------------------------------------------------------
// A half-warp per (page, KV head): lane p holds partial p of the canonical sum (page_bound.hpp),
// i.e. the channels of chunks p, p + 16, ...; the 16 partials combine by a butterfly of xor
// shuffles inside the half-warp. A block is 16 half-warps laid out [page slot][KV head of the
// tile], so a page's KV heads — adjacent in the sidecar — are read by adjacent half-warps.
// The fast kernel (head_dim <= 128, a multiple of 8, 16-byte aligned sidecar, G in {1, 2, 4, 8})
// reads a (page, KV head)'s min and max with one 16-byte load each per lane, page ids fetched 16
// at a time and two pages' loads in flight while two are summed, and keeps the lane's q channels
// of the group's G heads in registers; the general kernel reads element by element, in the same
// order. G = 7 is Qwen2-7B's 28 q / 4 KV heads (the general kernel made Quest slower than dense there).
constexpr int kBoundThreads = 256;
constexpr int kHalfWarps = kBoundThreads / 16;

struct BoundTiling {
  int32_t kv_tile;  // KV heads per block (a block covers kv_tile heads of `slots` pages at a time)
  int32_t slots;    // page slots per block
};

__device__ __forceinline__ int64_t last_query_row(const PageBoundLaunch& a, int32_t b) {
  const int64_t row = int64_t(a.qo_indptr[b + 1]) - 1;
  return row < a.qo_indptr[b] ? -1 : row;
}

__device__ __forceinline__ void write_bound(const PageBoundLaunch& a, int64_t item, int32_t head, float v) {
  a.scores[item * a.layout.item_stride + int64_t(head) * a.layout.head_stride] = v;
}

// The 16 partials of a half-warp, summed by the canonical butterfly (every lane gets the total).
__device__ __forceinline__ float half_warp_sum(float acc, unsigned mask) {
#pragma unroll
  for (int off = kBoundPartials / 2; off > 0; off >>= 1)
    acc = add_rn(acc, __shfl_xor_sync(mask, acc, off));
  return acc;
}

// 8 channels of one chunk (min or max), as loaded: one 16-byte load (two for f32).
template <class T>
struct Chunk {  // __half, __nv_bfloat16: channel 2w in the low half of word w, 2w + 1 in the high
  uint4 raw;
  __device__ __forceinline__ void load(const T* p) { raw = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ uint32_t word(int w) const {
    return w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
  }
};
template <>
struct Chunk<float> {
  float4 lo, hi;
  __device__ __forceinline__ void load(const float* p) {
    lo = __ldg(reinterpret_cast<const float4*>(p));
    hi = __ldg(reinterpret_cast<const float4*>(p) + 1);
  }
  __device__ __forceinline__ float at(int i) const {
    const float v[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    return v[i];
  }
};

// The selected (min or max, by q's sign) 16-bit values of a word's two channels as floats.
__device__ __forceinline__ float low_f32(uint32_t w, __nv_bfloat16*) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float high_f32(uint32_t w, __nv_bfloat16*) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ float low_f32(uint32_t w, __half*) { return __half2float(__ushort_as_half(uint16_t(w & 0xffffu))); }
__device__ __forceinline__ float high_f32(uint32_t w, __half*) { return __half2float(__ushort_as_half(uint16_t(w >> 16))); }

// The q-sign selection of a 16-bit chunk, precomputed per (head, word): __byte_perm(min word,
// max word, selector) takes each channel's 2 bytes from max where q >= 0, else from min — the
// operand bound_step picks, without a compare per term.
__device__ __forceinline__ uint32_t sign_selector(float q_even, float q_odd) {
  const uint32_t e = q_even >= 0.0f ? 0x54u : 0x10u, o = q_odd >= 0.0f ? 0x76u : 0x32u;
  return e | (o << 8);
}

// Sum of a lane's 8 channels for one head, from 0, in channel order (bound_step).
template <class T>
__device__ __forceinline__ float chunk_sum(const float (&q)[kBoundChunk], const uint32_t (&sel)[kBoundChunk / 2],
                                           const Chunk<T>& mn, const Chunk<T>& mx) {
  float acc = 0.f;
#pragma unroll
  for (int w = 0; w < kBoundChunk / 2; ++w) {
    const uint32_t v = __byte_perm(mn.word(w), mx.word(w), sel[w]);
    acc = __fmaf_rn(q[2 * w], low_f32(v, static_cast<T*>(nullptr)), acc);
    acc = __fmaf_rn(q[2 * w + 1], high_f32(v, static_cast<T*>(nullptr)), acc);
  }
  return acc;
}
template <>
__device__ __forceinline__ float chunk_sum<float>(const float (&q)[kBoundChunk], const uint32_t (&)[kBoundChunk / 2],
                                                  const Chunk<float>& mn, const Chunk<float>& mx) {
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < kBoundChunk; ++i) acc = bound_step(acc, q[i], mn.at(i), mx.at(i));
  return acc;
}

template <class T, int G>
__global__ void __launch_bounds__(kBoundThreads, 2) page_bounds_fast(PageBoundLaunch a, BoundTiling t) {
  const int32_t b = int32_t(blockIdx.y);
  const int32_t hw = int32_t(threadIdx.x) >> 4, p = int32_t(threadIdx.x) & 15;
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);
  const int32_t slot = hw / t.kv_tile;
  const int32_t kh = int32_t(blockIdx.z) * t.kv_tile + hw % t.kv_tile;
  const int32_t Hkv = a.n_kv_heads, d = a.head_dim;
  if (slot >= t.slots || kh >= Hkv) return;  // whole half-warps leave together
  const int64_t q_row = last_query_row(a, b);
  if (q_row < 0) return;
  const int32_t begin = a.kv_indptr[b], n_pages = a.kv_indptr[b + 1] - begin;
  const bool has = p * kBoundChunk < d;  // lanes past head_dim hold an empty partial (0)
  float qr[G][kBoundChunk];
  uint32_t sel[G][kBoundChunk / 2];
#pragma unroll
  for (int g = 0; g < G; ++g) {
#pragma unroll
    for (int i = 0; i < kBoundChunk; ++i)
      qr[g][i] = has ? load_storage(a.q, a.q_dtype, (q_row * a.n_q_heads + kh * G + g) * d + p * kBoundChunk + i) : 0.f;
#pragma unroll
    for (int w = 0; w < kBoundChunk / 2; ++w) sel[g][w] = sign_selector(qr[g][2 * w], qr[g][2 * w + 1]);
  }
  const T* side = static_cast<const T*>(a.sidecar) + int64_t(kh) * 2 * d + p * kBoundChunk;
  const int64_t page_elems = int64_t(Hkv) * 2 * d;
  const int32_t step = int32_t(gridDim.x) * t.slots;
  // One (page, KV head): the G bounds, written by lane 0.
  auto bound = [&](int32_t j, const Chunk<T>& mn, const Chunk<T>& mx) {
    float best = 0.f;
#pragma unroll
    for (int g = 0; g < G; ++g) {
      float acc = has ? chunk_sum<T>(qr[g], sel[g], mn, mx) : 0.f;
      acc = half_warp_sum(acc, mask);
      if (a.group_max) best = group_max_step(best, acc, g == 0);
      else if (p == 0) write_bound(a, int64_t(begin) + j, kh * G + g, acc);
    }
    if (a.group_max && p == 0) write_bound(a, int64_t(begin) + j, kh, best);
  };
  // The half-warp's pages j0, j0 + step, ... in groups of 16: lane p fetches the physical id of
  // the group's page p up front, then the records stream through a two-page software pipeline
  // (the next two pages' loads are in flight while the current two are summed).
  for (int32_t j0 = int32_t(blockIdx.x) * t.slots + slot; j0 < n_pages; j0 += kBoundPartials * step) {
    const int32_t mine = j0 + p * step;
    const int32_t my_phys = mine < n_pages ? a.kv_indices[begin + mine] : 0;
    const int32_t left = (n_pages - j0 + step - 1) / step;
    const int32_t cnt = left < kBoundPartials ? left : kBoundPartials;
    auto load = [&](int32_t k, Chunk<T>& mn, Chunk<T>& mx) {
      const int64_t phys = __shfl_sync(mask, my_phys, k, 16);
      if (has) {
        const T* rec = side + phys * page_elems;
        mn.load(rec);
        mx.load(rec + d);
      }
    };
    Chunk<T> mn0, mx0, mn1, mx1;
    load(0, mn0, mx0);
    if (cnt > 1) load(1, mn1, mx1);
    for (int32_t k = 0; k < cnt; k += 2) {
      Chunk<T> nmn0, nmx0, nmn1, nmx1;
      if (k + 2 < cnt) load(k + 2, nmn0, nmx0);
      if (k + 3 < cnt) load(k + 3, nmn1, nmx1);
      bound(j0 + k * step, mn0, mx0);
      if (k + 1 < cnt) bound(j0 + (k + 1) * step, mn1, mx1);
      mn0 = nmn0;
      mx0 = nmx0;
      mn1 = nmn1;
      mx1 = nmx1;
    }
  }
}

// Any head_dim, any group size, any alignment: the same sums, element by element.
template <class T>
__global__ void __launch_bounds__(kBoundThreads) page_bounds_general(PageBoundLaunch a, BoundTiling t) {
  const int32_t b = int32_t(blockIdx.y);
  const int32_t hw = int32_t(threadIdx.x) >> 4, p = int32_t(threadIdx.x) & 15;
  const unsigned mask = 0xffffu << (threadIdx.x & 16u);
  const int32_t slot = hw / t.kv_tile;
  const int32_t kh = int32_t(blockIdx.z) * t.kv_tile + hw % t.kv_tile;
  const int32_t Hkv = a.n_kv_heads, d = a.head_dim, G = a.n_q_heads / a.n_kv_heads;
  if (slot >= t.slots || kh >= Hkv) return;
  const int64_t q_row = last_query_row(a, b);
  if (q_row < 0) return;
  const int32_t begin = a.kv_indptr[b], n_pages = a.kv_indptr[b + 1] - begin;
  const T* side = static_cast<const T*>(a.sidecar);
  for (int32_t j = int32_t(blockIdx.x) * t.slots + slot; j < n_pages; j += int32_t(gridDim.x) * t.slots) {
    const int64_t item = int64_t(begin) + j;
    const T* mm = side + (int64_t(a.kv_indices[item]) * Hkv + kh) * 2 * d;
    float best = 0.f;
    for (int32_t g = 0; g < G; ++g) {
      const int32_t h = kh * G + g;
      const int64_t qbase = (q_row * a.n_q_heads + h) * d;
      float acc = 0.f;
      for (int32_t chunk = p; chunk * kBoundChunk < d; chunk += kBoundPartials)
        for (int32_t c = chunk * kBoundChunk; c < d && c < (chunk + 1) * kBoundChunk; ++c)
          acc = bound_step(acc, load_storage(a.q, a.q_dtype, qbase + c), to_f32(mm[c]), to_f32(mm[d + c]));
      acc = half_warp_sum(acc, mask);
      if (a.group_max) best = group_max_step(best, acc, g == 0);
      else if (p == 0) write_bound(a, item, h, acc);
    }
    if (a.group_max && p == 0) write_bound(a, item, kh, best);
  }
}

const char* last_launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* launch_minmax_append(const MinMaxAppendLaunch& a) noexcept {
  if (a.batch <= 0 || a.max_pages_touched <= 0) return nullptr;
  const dim3 grid(unsigned(a.max_pages_touched), unsigned(a.batch));
  auto stream = static_cast<cudaStream_t>(a.stream);
  dispatch_cuda_storage(a.kv_dtype, [&](auto t) {
    minmax_append<typename decltype(t)::type><<<grid, kAppendThreads, 0, stream>>>(a);
  });
  return last_launch_error();
}

const char* launch_page_bounds(const PageBoundLaunch& a) noexcept {
  if (a.batch <= 0 || a.max_pages <= 0) return nullptr;
  if (a.n_kv_heads <= 0 || a.n_q_heads % a.n_kv_heads != 0) return "page bounds: bad head counts";
  const int32_t G = a.n_q_heads / a.n_kv_heads;
  BoundTiling t{};
  t.kv_tile = a.n_kv_heads < kHalfWarps ? a.n_kv_heads : kHalfWarps;
  t.slots = kHalfWarps / t.kv_tile;
  const int64_t z = (int64_t(a.n_kv_heads) + t.kv_tile - 1) / t.kv_tile;
  // About 16 pages per half-warp (one group of the fast kernel's pipeline), but at least ~4
  // blocks per SM of an H100 in all.
  const int64_t slot_groups = (int64_t(a.max_pages) + t.slots - 1) / t.slots;
  int64_t x = (slot_groups + kBoundPartials - 1) / kBoundPartials;
  const int64_t min_blocks = 528;
  if (x * a.batch * z < min_blocks) x = (min_blocks + a.batch * z - 1) / (a.batch * z);
  if (x > slot_groups) x = slot_groups;
  if (x > INT32_MAX || z > 65535 || a.batch > 65535) return "page bounds: grid too large";
  const dim3 grid(unsigned(x), unsigned(a.batch), unsigned(z));
  auto stream = static_cast<cudaStream_t>(a.stream);
  const size_t eb = size_t(storage_bytes(a.kv_dtype));
  const bool fast = a.head_dim > 0 && a.head_dim <= kBoundChunk * kBoundPartials &&
                    a.head_dim % kBoundChunk == 0 &&
                    reinterpret_cast<uintptr_t>(a.sidecar) % 16 == 0 &&
                    (size_t(a.head_dim) * eb) % 16 == 0 && (G == 1 || G == 2 || G == 4 || G == 7 || G == 8);
  dispatch_cuda_storage(a.kv_dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (!fast) {
      page_bounds_general<T><<<grid, kBoundThreads, 0, stream>>>(a, t);
      return;
    }
    switch (G) {
      case 1: page_bounds_fast<T, 1><<<grid, kBoundThreads, 0, stream>>>(a, t); break;
      case 2: page_bounds_fast<T, 2><<<grid, kBoundThreads, 0, stream>>>(a, t); break;
      case 4: page_bounds_fast<T, 4><<<grid, kBoundThreads, 0, stream>>>(a, t); break;
      case 7: page_bounds_fast<T, 7><<<grid, kBoundThreads, 0, stream>>>(a, t); break;
      default: page_bounds_fast<T, 8><<<grid, kBoundThreads, 0, stream>>>(a, t); break;
    }
  });
  return last_launch_error();
}

}  // namespace sieve::selection
