// Quest bounds of one (page, KV head) for a group of query heads, bit for bit page_bound's
// canonical order (page_bound.hpp), with the loops reordered so that the 16 partial sums are
// independent chains in the innermost loop (each still takes its channels in increasing order,
// and the butterfly is the same): the chains overlap instead of waiting on each other's FMA.
// Included into an anonymous namespace by page_bound.cpp (std::fma as the build's target has it)
// and by page_bound_fma.cpp (-mfma: one instruction, where it is otherwise a libm call), so the
// two copies never merge.
#pragma once
#include <cmath>
#include <cstdint>

#include "sieve/selection/page_bound.hpp"

namespace sieve::selection {
namespace {

// out[h] = page_bound(q + h * d, mn, mx, d) for h < n_heads.
inline void bound_rows_impl(const float* q, int32_t n_heads, const float* mn, const float* mx,
                            int32_t d, float* out) {
  constexpr int32_t kRound = kBoundPartials * kBoundChunk;  // channels of chunks p .. p + 15
  for (int32_t h = 0; h < n_heads; ++h) {
    const float* qh = q + int64_t(h) * d;
    float acc[kBoundPartials] = {};
    for (int32_t base = 0; base < d; base += kRound)
      for (int32_t i = 0; i < kBoundChunk; ++i)
        for (int32_t p = 0; p < kBoundPartials; ++p) {
          const int32_t c = base + p * kBoundChunk + i;  // channel i of chunk base / 8 + p
          if (c < d) acc[p] = std::fma(qh[c], qh[c] >= 0.0f ? mx[c] : mn[c], acc[p]);
        }
    for (int off = kBoundPartials / 2; off > 0; off /= 2)
      for (int p = 0; p < off; ++p) acc[p] = add_rn(acc[p], acc[p + off]);
    out[h] = acc[0];
  }
}

}  // namespace
}  // namespace sieve::selection
