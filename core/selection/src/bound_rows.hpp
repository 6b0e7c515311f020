// Quest bounds of one (page, KV head) for a group of query heads, bit for bit page_bound's
// canonical order (page_bound.hpp). The operands come in bound order (bound_order_floats): the L
// partials of a step are L adjacent floats, so each step is one vector operation per 8 or 16 of
// them; partial p still takes its channels in increasing order and the butterfly is the same. A
// padded lane adds fma(0, 0, acc) = acc exactly, and with L = 8 the butterfly's first step
// (adding partials 8-15, all +0) is exact and skipped: acc never holds -0 (it starts at +0, and
// an exact zero sum rounds to +0). The minimum / maximum choice is a select, not a branch (q's
// sign is random: a branch mispredicts half the time).
// The portable copy (std::fma may be a libm call), for page_bound.cpp's anonymous namespace;
// page_bound_fma.cpp is the same in AVX2 / FMA intrinsics.
#pragma once
#include <cmath>
#include <cstdint>

#include "sieve/selection/page_bound.hpp"

namespace sieve::selection {
namespace {

template <int L>
inline void bound_rows_lanes(const float* q, int32_t n_heads, const float* mn, const float* mx,
                             int64_t n, float* out) {
  for (int32_t h = 0; h < n_heads; ++h) {
    const float* qh = q + int64_t(h) * n;
    float acc[L] = {};
    for (int64_t s = 0; s < n; s += L)  // step i of a round: the L partials
      for (int32_t p = 0; p < L; ++p) {
        const float x = qh[s + p], lo = mn[s + p], hi = mx[s + p];
        acc[p] = std::fma(x, x >= 0.0f ? hi : lo, acc[p]);
      }
    for (int off = L / 2; off > 0; off /= 2)
      for (int p = 0; p < off; ++p) acc[p] = add_rn(acc[p], acc[p + off]);
    out[h] = acc[0];
  }
}

// out[h] = page_bound(q_h, mn, mx, d) for h < n_heads; q [n_heads][bound_order_floats(d)], mn and
// mx one row each, all in bound order.
inline void bound_rows_impl(const float* q, int32_t n_heads, const float* mn, const float* mx,
                            int32_t d, float* out) {
  static_assert(kBoundPartials == 16, "bound order has 8 or 16 lanes");
  const int64_t n = bound_order_floats(d);
  if (bound_order_lanes(d) == 8) bound_rows_lanes<8>(q, n_heads, mn, mx, n, out);
  else bound_rows_lanes<16>(q, n_heads, mn, mx, n, out);
}

}  // namespace
}  // namespace sieve::selection
