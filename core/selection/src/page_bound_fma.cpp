// bound_rows.hpp compiled with -mfma (x86-64): std::fma becomes one instruction. Called only
// where the CPU has FMA (page_bound.cpp); the same bits as the portable copy (fma is exactly
// rounded either way).
#include "bound_rows.hpp"

namespace sieve::selection {

void bound_rows_fma(const float* q, int32_t n_heads, const float* mn, const float* mx, int32_t d,
                    float* out) {
  bound_rows_impl(q, n_heads, mn, mx, d, out);
}

}  // namespace sieve::selection
