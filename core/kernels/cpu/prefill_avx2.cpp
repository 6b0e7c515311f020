// The prefill kernel (prefill_loop.hpp) on 8-float AVX2 vectors. Compiled with -mavx2 -mfma
// -mf16c; called only where the CPU has them (tile.cpp).
#include "prefill_loop.hpp"
#include "simd_avx2.hpp"

namespace sieve::kernels::cpu {

void prefill_tile_avx2(const PrefillTile& t) { simd::prefill_tile<Avx2>(t); }

}  // namespace sieve::kernels::cpu
