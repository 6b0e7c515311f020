// The decode kernel (decode_loop.hpp) on 16-float AVX-512 vectors. Compiled with
// -mavx512f -mavx512bw -mfma -mf16c; called only where the CPU has them (attention_cpu.cpp).
#include "decode_avx512.hpp"
#include "decode_loop.hpp"
#include "decode_rows.hpp"

namespace sieve::kernels::cpu {

void decode_rows_avx512(const DecodeRows& r) { simd::decode_rows_any<Avx512>(r); }

void decode_exp_avx512(const float* x, float* y, int64_t n) {
  float in[Avx512::W] = {}, out[Avx512::W];
  for (int64_t i = 0; i < n; i += Avx512::W) {
    const int64_t m = n - i < Avx512::W ? n - i : Avx512::W;
    for (int64_t j = 0; j < m; ++j) in[j] = x[i + j];
    Avx512::storef(out, simd::exp<Avx512>(Avx512::loadf(in)));
    for (int64_t j = 0; j < m; ++j) y[i + j] = out[j];
  }
}

}  // namespace sieve::kernels::cpu
