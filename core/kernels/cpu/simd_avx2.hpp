// The AVX2 vector type of the decode and prefill kernels (decode_loop.hpp, prefill_loop.hpp):
// 8 floats. For translation units compiled with -mavx2 -mfma -mf16c only; it sits in their
// anonymous namespace, so nothing built from it is shared with code compiled for other CPUs.
#pragma once
#include <immintrin.h>

#include <cstdint>

#include "decode_rows.hpp"

namespace sieve::kernels::cpu {
namespace {

struct Avx2 {
  using F = __m256;
  static constexpr int W = 8;
  static constexpr int kDimBlock = 2;  // 16 registers: 4 heads x 2 vectors of accumulators
  // keys per pass of the scores: 4 x 2 accumulators, 4 q and 4 k vectors
  static constexpr int kScoreKeys = 2;
  // prefill blocks (prefill_loop.hpp): scores 4 rows x 2 key vectors, P.V 2 rows x 4 dim vectors
  static constexpr int kPrefillScoreRows = 4, kPrefillKeyVectors = 2;
  static constexpr int kPrefillAccRows = 2, kPrefillDimVectors = 4;

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F loadf(const float* p) { return _mm256_loadu_ps(p); }
  static void storef(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static __m128 fold(F x) {
    return _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
  }
  static float hsum(F x) {
    __m128 s = fold(x);
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  static float hmax(F x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
  }

  // Element `off` onwards of a K/V pool, widened to f32 in registers.
  template <KvStorage S>
  static F load(const void* base, int64_t off) {
    if constexpr (S == KvStorage::kF32) {
      return _mm256_loadu_ps(static_cast<const float*>(base) + off);
    } else {
      const __m128i h = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + off));
      if constexpr (S == KvStorage::kF16) return _mm256_cvtph_ps(h);
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }

  // Elements off .. off + 16 in storage order (decode_loop.hpp): bf16 even elements in x[0], odd
  // ones in x[1]; f32 and f16 in order.
  template <KvStorage S>
  static void load2(const void* base, int64_t off, F* x) {
    if constexpr (S == KvStorage::kBf16) {
      const __m256i w = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + off));
      x[0] = _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
      x[1] = _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32(int(0xffff0000u))));
    } else {
      x[0] = load<S>(base, off);
      x[1] = load<S>(base, off + W);
    }
  }

  // Lanes [0, n) of x, `fill` in the others.
  static F first(F x, int n, float fill) {
    const F lane = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const F keep = _mm256_cmp_ps(lane, set1(float(n)), _CMP_LT_OQ);
    return _mm256_blendv_ps(set1(fill), x, keep);
  }

  // Lane t = sum of row t of an 8 x 8 tile: a transposing add tree, 7 shuffle pairs.
  static F row_sums(const float* tile) {
    F x[4], y[2];
    for (int i = 0; i < 4; ++i) {
      const F a = loadf(tile + (2 * i) * 8), b = loadf(tile + (2 * i + 1) * 8);
      x[i] = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    }
    for (int i = 0; i < 2; ++i)
      y[i] = _mm256_add_ps(_mm256_shuffle_ps(x[2 * i], x[2 * i + 1], 0x44),
                           _mm256_shuffle_ps(x[2 * i], x[2 * i + 1], 0xee));
    return _mm256_add_ps(_mm256_permute2f128_ps(y[0], y[1], 0x20),
                         _mm256_permute2f128_ps(y[0], y[1], 0x31));
  }

  // exp's pieces (simd::exp in decode_loop.hpp): x rounded to the nearest integer, y * 2^n
  // built in the exponent field (n in [-126, 127] after exp's clamp).
  static F clamp(F x, float lo, float hi) {
    return _mm256_min_ps(_mm256_max_ps(x, set1(lo)), set1(hi));
  }
  static F round(F x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F scale2(F y, F n) {
    const __m256i biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
    const __m256i e = _mm256_slli_epi32(biased, 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  }
  static float lane0(F x) { return _mm256_cvtss_f32(x); }
  // dst row c = column c of the 8 x 8 block src (rows src_stride floats apart): 32-bit and
  // 64-bit interleaves within 128-bit lanes, then a 128-bit lane shuffle.
  static void transpose(const float* src, int64_t src_stride, float* dst, int64_t dst_stride) {
    F r[8], a[8], b[8];
    for (int i = 0; i < 8; ++i) r[i] = loadf(src + i * src_stride);
    for (int k = 0; k < 4; ++k) {
      a[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
      a[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 2; ++k) {  // b[4k + m], lane L: column 4L + m of rows 4k .. 4k + 3
      const __m256d x0 = _mm256_castps_pd(a[4 * k]), x1 = _mm256_castps_pd(a[4 * k + 1]);
      const __m256d x2 = _mm256_castps_pd(a[4 * k + 2]), x3 = _mm256_castps_pd(a[4 * k + 3]);
      b[4 * k] = _mm256_castpd_ps(_mm256_unpacklo_pd(x0, x2));
      b[4 * k + 1] = _mm256_castpd_ps(_mm256_unpackhi_pd(x0, x2));
      b[4 * k + 2] = _mm256_castpd_ps(_mm256_unpacklo_pd(x1, x3));
      b[4 * k + 3] = _mm256_castpd_ps(_mm256_unpackhi_pd(x1, x3));
    }
    for (int m = 0; m < 4; ++m) {  // column 4L + m: lane L of b[m] (rows 0-3), b[4 + m] (4-7)
      storef(dst + m * dst_stride, _mm256_permute2f128_ps(b[m], b[4 + m], 0x20));
      storef(dst + (4 + m) * dst_stride, _mm256_permute2f128_ps(b[m], b[4 + m], 0x31));
    }
  }
};

}  // namespace
}  // namespace sieve::kernels::cpu
