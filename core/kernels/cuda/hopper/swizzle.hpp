// The 128-byte swizzle of Hopper's shared-memory tiles (what CU_TENSOR_MAP_SWIZZLE_128B writes
// and a swizzle-mode-1 wgmma descriptor reads), host and device: the kernels place elements with
// it, the tests check the TMA engine's bytes against it.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SIEVE_SWIZZLE_HD __host__ __device__
#else
#define SIEVE_SWIZZLE_HD
#endif

namespace sieve::kernels::cuda::sm90 {

constexpr int kSwRowElems = 64;     // 16-bit elements in one 128-byte swizzled row
constexpr int kSwAtomBytes = 1024;  // 8 rows: the pattern's period and the alignment it needs

// Byte offset of element (r, c), c < 64, in a 128-byte-swizzled [rows][64] 16-bit region whose
// base is 1024-byte aligned: within each 8-row atom the 16-byte chunk index is XORed with r mod 8.
SIEVE_SWIZZLE_HD constexpr uint32_t sw128_offset(uint32_t r, uint32_t c) {
  return r * 128u + ((((c >> 3) ^ (r & 7u)) << 4) | ((c & 7u) << 1));
}
static_assert(sw128_offset(0, 9) == 18 && sw128_offset(1, 0) == 128 + 16 && sw128_offset(9, 63) == 9 * 128 + 6 * 16 + 14,
              "row 0 is unswizzled; row r moves chunk c to c ^ (r mod 8)");

}  // namespace sieve::kernels::cuda::sm90
