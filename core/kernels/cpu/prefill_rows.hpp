// The CPU prefill kernel's SIMD entry points (private to core/kernels/cpu and its tests): one
// tile of query rows (a few tokens x a head bundle) against one tile of keys, the Q·Kᵀ and P·V
// products register-blocked like a GEMM micro-kernel, the online softmax in vectors between them.
// Plain data and declarations only, for the reason decode_rows.hpp gives.
#pragma once
#include <cstdint>

namespace sieve::kernels::cpu {

// Key tiles are padded to a multiple of this many keys (the widest vector).
constexpr int kPrefillKeyAlign = 16;

struct PrefillTile {
  const float* q = nullptr;  // [rows, d], already multiplied by the softmax scale
  int32_t rows = 0;
  int32_t d = 0;             // a multiple of the variant's lane count
  // The tile's keys as f32 rows [nkp, d], rows past nk zero; nkp a multiple of kPrefillKeyAlign.
  const float* k = nullptr;
  int32_t nkp = 0;
  const float* v = nullptr;  // values [nk, d]
  int32_t nk = 0;
  // Per row: it sees keys [0, visible) of the tile (keys are in position order, so a causal row's
  // visible keys are a prefix); 0 leaves the row's state as it was.
  const int32_t* visible = nullptr;
  // Scratch: the keys transposed [d, nkp] (key j of dim i at kt[i * nkp + j], so that a row's
  // scores are a broadcast-FMA over contiguous keys), scores / weights [rows, nkp] and each row's
  // rescale factor [rows].
  float* kt = nullptr;
  float* s = nullptr;
  float* alpha = nullptr;
  // The online-softmax state (see DecodeRows), continued over successive key tiles.
  float* m = nullptr;
  float* l = nullptr;
  float* acc = nullptr;  // [rows, d]
};

// Vector widths: 16 floats (AVX-512F), 8 (AVX2 with FMA).
void prefill_tile_avx512(const PrefillTile& t);
void prefill_tile_avx2(const PrefillTile& t);

}  // namespace sieve::kernels::cpu
