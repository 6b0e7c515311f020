// The CPU kernel's inner loops (private to core/kernels/cpu and its tests): dtype conversion of
// contiguous runs and the score / accumulate loops, written so the compiler vectorizes them
// (no branches in the element loops, independent accumulators).
#pragma once
#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>

#include "sieve/util/half.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kernels::cpu {

// f16 -> f32 without branches (selects only), so a run of them vectorizes; bit-identical to
// sieve::f16_to_f32 for all 65536 inputs (tested).
inline float f16_to_f32_select(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;                         // exponent and mantissa
  const uint32_t normal = (em << 13) + ((127u - 15u) << 23);  // rebias the exponent
  const uint32_t inf_nan = (em << 13) | 0x7f800000u;
  const float sub = float(em) * 5.9604644775390625e-8f;    // subnormal / zero: em * 2^-24, exact
  uint32_t sub_bits;
  std::memcpy(&sub_bits, &sub, 4);
  const uint32_t bits = em >= 0x7c00u ? inf_nan : em >= 0x0400u ? normal : sub_bits;
  float f;
  const uint32_t out = bits | sign;
  std::memcpy(&f, &out, 4);
  return f;
}

// dst[i] = mul * (element off + i of a float-storage tensor), i < n.
inline void load_run(const void* base, DLDataType t, int64_t off, int64_t n, float mul,
                     float* dst) {
  if (t.bits == 32) {
    const float* s = static_cast<const float*>(base) + off;
    for (int64_t i = 0; i < n; ++i) dst[i] = s[i] * mul;
    return;
  }
  const uint16_t* s = static_cast<const uint16_t*>(base) + off;
  if (t.code == kDLBfloat) {
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(s[i]) * mul;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32_select(s[i]) * mul;
  }
}

// n rows of d elements, row r at element off + r * row_stride, into dst [n, d] as f32: one run
// when the rows are adjacent (compact HND pages), else row by row (NHD, combined pools).
inline void load_rows(const void* base, DLDataType t, int64_t off, int64_t n, int64_t d,
                      int64_t row_stride, float* dst) {
  if (row_stride == d) {
    load_run(base, t, off, n * d, 1.f, dst);
    return;
  }
  for (int64_t r = 0; r < n; ++r) load_run(base, t, off + r * row_stride, d, 1.f, dst + r * d);
}

// Element off + i of a float-storage tensor = mul * src[i] (round to nearest even), i < n.
inline void store_run(void* base, DLDataType t, int64_t off, int64_t n, const float* src,
                      float mul) {
  if (t.bits == 32) {
    float* d = static_cast<float*>(base) + off;
    for (int64_t i = 0; i < n; ++i) d[i] = src[i] * mul;
    return;
  }
  uint16_t* d = static_cast<uint16_t*>(base) + off;
  if (t.code == kDLBfloat) {
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i] * mul);
  } else {
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i] * mul);
  }
}

inline void store_zeros(void* base, DLDataType t, int64_t off, int64_t n) {
  // +0.0 is all-zero bits in f32, f16 and bf16.
  std::memset(static_cast<char*>(base) + off * int64_t(dtype_bytes(t)), 0,
              size_t(n) * dtype_bytes(t));
}

inline float dot(const float* a, const float* b, int n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

// s[k] = q · keys[k] for k < nk (keys: [nk, d]). Four keys per pass: four independent
// accumulators instead of one latency-bound chain, and q is loaded once for them.
inline void score_row(const float* q, const float* keys, int nk, int d, float* s) {
  int k = 0;
  for (; k + 4 <= nk; k += 4) {
    const float* k0 = keys + int64_t(k) * d;
    const float* k1 = k0 + d;
    const float* k2 = k1 + d;
    const float* k3 = k2 + d;
    float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
    for (int i = 0; i < d; ++i) {
      const float x = q[i];
      a0 += x * k0[i];
      a1 += x * k1[i];
      a2 += x * k2[i];
      a3 += x * k3[i];
    }
    s[k] = a0;
    s[k + 1] = a1;
    s[k + 2] = a2;
    s[k + 3] = a3;
  }
  for (; k < nk; ++k) s[k] = dot(q, keys + int64_t(k) * d, d);
}

// acc += Σ_k p[k] * values[k] for k < nk (values: [nk, d]). Four keys per pass: acc is loaded
// and stored once per four value rows.
inline void accumulate_row(const float* p, const float* values, int nk, int d, float* acc) {
  int k = 0;
  for (; k + 4 <= nk; k += 4) {
    const float* v0 = values + int64_t(k) * d;
    const float* v1 = v0 + d;
    const float* v2 = v1 + d;
    const float* v3 = v2 + d;
    const float p0 = p[k], p1 = p[k + 1], p2 = p[k + 2], p3 = p[k + 3];
#pragma omp simd
    for (int i = 0; i < d; ++i) acc[i] += p0 * v0[i] + p1 * v1[i] + p2 * v2[i] + p3 * v3[i];
  }
  for (; k < nk; ++k) {
    const float pk = p[k];
    const float* vk = values + int64_t(k) * d;
#pragma omp simd
    for (int i = 0; i < d; ++i) acc[i] += pk * vk[i];
  }
}

}  // namespace sieve::kernels::cpu
