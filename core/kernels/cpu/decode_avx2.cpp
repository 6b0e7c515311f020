// The decode kernel (decode_loop.hpp) on 8-float AVX2 vectors. Compiled with -mavx2 -mfma
// -mf16c; called only where the CPU has them (tile.cpp).
#include "decode_loop.hpp"
#include "decode_rows.hpp"
#include "simd_avx2.hpp"

namespace sieve::kernels::cpu {

void decode_rows_avx2(const DecodeRows& r) { simd::decode_rows_any<Avx2>(r); }

void decode_exp_avx2(const float* x, float* y, int64_t n) { simd::exp_all<Avx2>(x, y, n); }

}  // namespace sieve::kernels::cpu
