// The prefill kernel (prefill_loop.hpp) on 16-float AVX-512 vectors. Compiled with
// -mavx512f -mavx512bw -mfma -mf16c; called only where the CPU has them (tile.cpp).
#include "prefill_loop.hpp"
#include "simd_avx512.hpp"

namespace sieve::kernels::cpu {

void prefill_tile_avx512(const PrefillTile& t) { simd::prefill_tile<Avx512>(t); }

}  // namespace sieve::kernels::cpu
