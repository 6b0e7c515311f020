// bound_rows_impl (bound_rows.hpp) in AVX2 / FMA intrinsics, x86-64 only, compiled with -mavx2
// -mfma and called only where the CPU has both (page_bound.cpp). The same operations per
// partial in the same order as the portable copy, so the same bits: a partial is a lane, each
// step fma(q, q >= 0 ? max : min, acc) (an ordered compare: NaN q picks min, as there), then the
// same butterfly.
#include <immintrin.h>

#include <cstdint>

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

}  // namespace

void bound_rows_fma(const float* q, int32_t n_heads, const float* mn, const float* mx, int32_t d,
                    float* out) {
  const int64_t n = bound_order_floats(d);
  if (bound_order_lanes(d) == 8) bound_rows_avx2<8>(q, n_heads, mn, mx, n, out);
  else bound_rows_avx2<16>(q, n_heads, mn, mx, n, out);
}

}  // namespace sieve::selection
