// bound_rows_impl (bound_rows.hpp) in AVX2 / FMA intrinsics, x86-64 only, compiled with -mavx2
// -mfma and called only where the CPU has both (page_bound.cpp). The same operations per
// partial in the same order as the portable copy, so the same bits: a partial is a lane, each
// step fma(q, q >= 0 ? max : min, acc) (an ordered compare: NaN q picks min, as there), then the
// same butterfly. load_bound_order_avx2 puts f32 / bf16 rows into bound order with 8x8
// transposes instead of a scalar scatter (moves and an exact widening: the same floats).
#include <immintrin.h>

#include <cstdint>
#include <type_traits>

#include "sieve/selection/page_bound.hpp"

namespace sieve::selection {
namespace {

template <int L>
void bound_rows_avx2(const float* q, int32_t n_heads, const float* mn, const float* mx, int64_t n,
                     float* out) {
  constexpr int V = L / 8;  // vectors of partials per step
  const __m256 zero = _mm256_setzero_ps();
  for (int32_t h = 0; h < n_heads; ++h) {
    const float* qh = q + int64_t(h) * n;
    __m256 acc[V];
    for (int v = 0; v < V; ++v) acc[v] = zero;
    for (int64_t s = 0; s < n; s += L)
      for (int v = 0; v < V; ++v) {
        const __m256 x = _mm256_loadu_ps(qh + s + 8 * v);
        const __m256 m = _mm256_blendv_ps(_mm256_loadu_ps(mn + s + 8 * v),
                                          _mm256_loadu_ps(mx + s + 8 * v),
                                          _mm256_cmp_ps(x, zero, _CMP_GE_OQ));
        acc[v] = _mm256_fmadd_ps(x, m, acc[v]);
      }
    float a[L];
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(a + 8 * v, acc[v]);
    for (int off = L / 2; off > 0; off /= 2)
      for (int p = 0; p < off; ++p) a[p] = add_rn(a[p], a[p + off]);
    out[h] = a[0];
  }
}

// r[i][p] = r[p][i]: the 8x8 transpose of eight rows of 8 floats.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// Eight channels at s as floats: f32 as is, bf16 widened (exact: the top half of an f32).
template <bool kBf16>
inline __m256 load8(const void* s) {
  if constexpr (kBf16) {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(s));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_loadu_ps(static_cast<const float*>(s));
  }
}

// Each round of lanes * 8 channels: per 8 partials, their 8 chunks (a row each) transposed, so
// that step i's row holds channel i of every partial.
template <bool kBf16>
void bound_order_rounds(const void* base, int64_t off, int32_t d, int32_t lanes, float* dst) {
  using T = std::conditional_t<kBf16, uint16_t, float>;
  const T* src = static_cast<const T*>(base) + off;
  for (int32_t r0 = 0; r0 < d; r0 += lanes * kBoundChunk)
    for (int32_t pg = 0; pg < lanes; pg += 8) {
      __m256 r[8];
      for (int p = 0; p < 8; ++p) r[p] = load8<kBf16>(src + r0 + (pg + p) * kBoundChunk);
      transpose8(r);
      for (int i = 0; i < 8; ++i) _mm256_storeu_ps(dst + r0 + i * lanes + pg, r[i]);
    }
}

}  // namespace

bool load_bound_order_avx2(const void* base, DLDataType t, int64_t off, int32_t d, float* dst) {
  static_assert(kBoundChunk == 8, "a chunk is one row of the 8x8 transpose");
  const int32_t lanes = bound_order_lanes(d);
  if (d % (lanes * kBoundChunk) != 0) return false;  // padded rounds: the portable loop
  if (t.code == kDLFloat && t.bits == 32) bound_order_rounds<false>(base, off, d, lanes, dst);
  else if (t.code == kDLBfloat && t.bits == 16) bound_order_rounds<true>(base, off, d, lanes, dst);
  else return false;  // f16: the portable loop
  return true;
}

void bound_rows_fma(const float* q, int32_t n_heads, const float* mn, const float* mx, int32_t d,
                    float* out) {
  const int64_t n = bound_order_floats(d);
  if (bound_order_lanes(d) == 8) bound_rows_avx2<8>(q, n_heads, mn, mx, n, out);
  else bound_rows_avx2<16>(q, n_heads, mn, mx, n, out);
}

}  // namespace sieve::selection
