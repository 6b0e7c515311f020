// The AVX-512 vector type of the decode and prefill kernels (decode_loop.hpp, prefill_loop.hpp):
// 16 floats. For translation units compiled with -mavx512f -mavx512bw -mfma -mf16c only; it sits
// in their anonymous namespace, so nothing built from it is shared with code compiled for other
// CPUs.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "decode_rows.hpp"

namespace sieve::kernels::cpu {
namespace {

struct Avx512 {
  using F = __m512;
  static constexpr int W = 16;
  static constexpr int kDimBlock = 4;  // 4 heads x 4 vectors of accumulators, 4 of values
  // keys per pass of the scores: 4 x 4 accumulators, 4 q and 8 k vectors (bf16 pairs)
  static constexpr int kScoreKeys = 4;
  // prefill blocks (prefill_loop.hpp): scores 4 rows x 4 key vectors, P.V 4 rows x 4 dim vectors
  static constexpr int kPrefillScoreRows = 4, kPrefillKeyVectors = 4;
  static constexpr int kPrefillAccRows = 4, kPrefillDimVectors = 4;

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F loadf(const float* p) { return _mm512_loadu_ps(p); }
  static void storef(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static float hsum(F x) { return _mm512_reduce_add_ps(x); }
  static float hmax(F x) { return _mm512_reduce_max_ps(x); }

  // Element `off` onwards of a K/V pool, widened to f32 in registers (bf16: the 16 bits are the
  // top half of the f32).
  template <KvStorage S>
  static F load(const void* base, int64_t off) {
    if constexpr (S == KvStorage::kF32) {
      return _mm512_loadu_ps(static_cast<const float*>(base) + off);
    } else {
      const __m256i h = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + off));
      if constexpr (S == KvStorage::kF16) return _mm512_cvtph_ps(h);
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }

  // Elements off .. off + 32 in storage order (decode_loop.hpp): bf16 even elements in x[0], odd
  // ones in x[1]; f32 and f16 in order.
  template <KvStorage S>
  static void load2(const void* base, int64_t off, F* x) {
    if constexpr (S == KvStorage::kBf16) {
      const __m512i w = _mm512_loadu_si512(static_cast<const uint16_t*>(base) + off);
      x[0] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
      x[1] = _mm512_castsi512_ps(_mm512_and_si512(w, _mm512_set1_epi32(int(0xffff0000u))));
    } else {
      x[0] = load<S>(base, off);
      x[1] = load<S>(base, off + W);
    }
  }

  // Lanes [0, n) of x, `fill` in the others.
  static F first(F x, int n, float fill) {
    const __mmask16 keep = n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
    return _mm512_mask_blend_ps(keep, _mm512_set1_ps(fill), x);
  }

  // Lane t = sum of row t of a 16 x 16 tile: a transposing add tree, 15 shuffle pairs.
  static F row_sums(const float* tile) {
    F x[8], y[4], z[2];
    for (int i = 0; i < 8; ++i) {  // per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3]
      const F a = loadf(tile + (2 * i) * 16), b = loadf(tile + (2 * i + 1) * 16);
      x[i] = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    }
    for (int i = 0; i < 4; ++i)  // per 128-bit lane: 4 rows' sums over that lane's 4 elements
      y[i] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44),
                           _mm512_shuffle_ps(x[2 * i], x[2 * i + 1], 0xee));
    for (int i = 0; i < 2; ++i)  // 128-bit lanes: rows 0-3 over elements 0-7, 8-15; rows 4-7 ...
      z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0x88),
                           _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88),
                         _mm512_shuffle_f32x4(z[0], z[1], 0xdd));
  }

  // exp's pieces (simd::exp in decode_loop.hpp): x rounded to the nearest integer, y * 2^n.
  static F clamp(F x, float lo, float hi) {
    return _mm512_min_ps(_mm512_max_ps(x, set1(lo)), set1(hi));
  }
  static F round(F x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F scale2(F y, F n) { return _mm512_scalef_ps(y, n); }
  static float lane0(F x) { return _mm512_cvtss_f32(x); }
  // dst row c = column c of the 16 x 16 block src (rows src_stride floats apart): 32-bit and
  // 64-bit interleaves within 128-bit lanes, then two rounds of 128-bit lane shuffles.
  static void transpose(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
    F r[16], a[16], b[16];
    for (int i = 0; i < 16; ++i) r[i] = loadf(src + i * src_stride);
    for (int k = 0; k < 8; ++k) {  // lane L: [r2k[4L], r2k+1[4L], r2k[4L+1], r2k+1[4L+1]], ...
      a[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
      a[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; ++k) {  // b[4k + m], lane L: column 4L + m of rows 4k .. 4k + 3
      const __m512d x0 = _mm512_castps_pd(a[4 * k]), x1 = _mm512_castps_pd(a[4 * k + 1]);
      const __m512d x2 = _mm512_castps_pd(a[4 * k + 2]), x3 = _mm512_castps_pd(a[4 * k + 3]);
      b[4 * k] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x2));
      b[4 * k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x2));
      b[4 * k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(x1, x3));
      b[4 * k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(x1, x3));
    }
    for (int m = 0; m < 4; ++m) {  // column 4L + m: lane L of b[m], b[4 + m], b[8 + m], b[12 + m]
      const F c0 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0x44);
      const F c1 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0xee);
      const F c2 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0x44);
      const F c3 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0xee);
      storef(dst + m * dst_stride, _mm512_shuffle_f32x4(c0, c2, 0x88));
      storef(dst + (4 + m) * dst_stride, _mm512_shuffle_f32x4(c0, c2, 0xdd));
      storef(dst + (8 + m) * dst_stride, _mm512_shuffle_f32x4(c1, c3, 0x88));
      storef(dst + (12 + m) * dst_stride, _mm512_shuffle_f32x4(c1, c3, 0xdd));
    }
  }
};

}  // namespace
}  // namespace sieve::kernels::cpu
