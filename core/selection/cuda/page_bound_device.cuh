// The device side of the canonical page bound (page_bound.hpp), shared by the bound kernel
// (page_bound.cu) and Quest's fused select (quest_select.cu): dtype loads, a lane's 8-channel chunk
// of a page's min/max record, its sum for one head in the canonical order, and the half-warp
// butterfly that combines the 16 partials. Internal to core/selection/cuda.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sieve/selection/page_bound.hpp"
#include "sieve/selection/page_bound_cuda.hpp"

namespace sieve::selection {
namespace {

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float load_any(const void* p, Storage t, int64_t i) {
  switch (t) {
    case Storage::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case Storage::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
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
  static constexpr int kParts = 1;  // 16-byte pieces (staged copies, quest_select.cu)
  uint4 raw;
  __device__ __forceinline__ void load(const T* p) { raw = __ldg(reinterpret_cast<const uint4*>(p)); }
  __device__ __forceinline__ void set(int, const uint4& v) { raw = v; }
  __device__ __forceinline__ uint32_t word(int w) const {
    return w == 0 ? raw.x : w == 1 ? raw.y : w == 2 ? raw.z : raw.w;
  }
};
template <>
struct Chunk<float> {
  static constexpr int kParts = 2;
  float4 lo, hi;
  __device__ __forceinline__ void set(int part, const uint4& v) {
    const float4 f = make_float4(__uint_as_float(v.x), __uint_as_float(v.y), __uint_as_float(v.z), __uint_as_float(v.w));
    if (part == 0) lo = f;
    else hi = f;
  }
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

// Whether the vector kernels (one 16-byte load per lane and record half, the q channels of a group
// of G heads in registers) take this shape: head_dim <= 128 and a multiple of 8, 16-byte aligned
// records, G one of the compiled group sizes. Otherwise the element-wise kernels run.
inline bool vector_bounds_fit(Storage kv, int32_t head_dim, const void* sidecar, int32_t G) {
  const size_t eb = kv == Storage::f32 ? 4 : 2;
  return head_dim > 0 && head_dim <= kBoundChunk * kBoundPartials && head_dim % kBoundChunk == 0 &&
         reinterpret_cast<uintptr_t>(sidecar) % 16 == 0 && (size_t(head_dim) * eb) % 16 == 0 &&
         (G == 1 || G == 2 || G == 4 || G == 7 || G == 8);
}

}  // namespace
}  // namespace sieve::selection
