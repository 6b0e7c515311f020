// The decode kernel (decode_loop.hpp) on 16-float AVX-512 vectors. Compiled with
// -mavx512f -mavx512bw -mfma -mf16c; called only where the CPU has them (tile.cpp).
#include "simd_avx512.hpp"
#include "decode_loop.hpp"
#include "decode_rows.hpp"

namespace sieve::kernels::cpu {

void decode_rows_avx512(const DecodeRows& r) { simd::decode_rows_any<Avx512>(r); }

void decode_exp_avx512(const float* x, float* y, int64_t n) { simd::exp_all<Avx512>(x, y, n); }

}  // namespace sieve::kernels::cpu
