// The CPU decode kernel's SIMD entry points (private to core/kernels/cpu and its tests): one head
// bundle (the query heads that share a KV head and a selection row) of one sequence against a run
// of K/V pages, streaming each page's K and V once for all of the bundle's heads.
//
// This header is plain data and declarations only: the AVX2 and AVX-512 translation units are
// compiled with their own -m flags, and an inline function shared with them could be emitted
// with wider instructions and then picked by the linker for every caller.
#pragma once
#include <cstdint>

namespace sieve::kernels::cpu {

enum class KvStorage : int32_t { kF32, kBf16, kF16 };

// Largest vector width (floats) of any variant: the scratch is sized for it.
constexpr int kDecodeMaxLanes = 16;

struct DecodeRows {
  const void* k = nullptr;  // K and V pools; slab offsets below are in elements
  const void* v = nullptr;
  KvStorage kv = KvStorage::kF32;
  int32_t d = 0;             // head dim: a multiple of the variant's lane count
  int32_t nh = 0;            // query heads of the bundle
  // [nh, d], already multiplied by the softmax scale; a scratch copy, which the kernel reorders
  // in place (decode_loop.hpp).
  float* q = nullptr;
  // The bf16-dot variant (decode_rows_avx512_bf16) reads q as stored instead, [nh, d] bf16, and
  // multiplies the dot products by score_scale; 1 for the others.
  const uint16_t* q_bf16 = nullptr;
  float score_scale = 1.f;
  const int64_t* slab = nullptr;  // per visited page: element offset of its token 0
  int64_t token_stride = 0;       // elements between a page's tokens (d for HND pages)
  const int32_t* tokens = nullptr;  // per visited page: keys it holds (all visible)
  int32_t n_pages = 0;
  // Out: the online-softmax state of each head, which the caller initialised to m = -inf, l = 0,
  // acc = 0 (several runs may continue one state): unnormalised output acc [nh, d], running
  // maximum m [nh] and sum l [nh] of exp(s - m).
  float* m = nullptr;
  float* l = nullptr;
  float* acc = nullptr;
  // Scratch of decode_scratch_floats(nh) floats, 64-byte aligned.
  float* scratch = nullptr;
  bool prefetch = true;  // software prefetch of the next chunk's rows
};

inline constexpr int64_t decode_scratch_floats(int32_t nh) {
  // Per head: a lanes x lanes tile of partial dot products, the chunk's weights and its rescale;
  // 2 x lanes to reorder a block of dims.
  return int64_t(nh) * (kDecodeMaxLanes * kDecodeMaxLanes + kDecodeMaxLanes + 1) +
         2 * kDecodeMaxLanes;
}

// Vector widths: 16 floats (AVX-512F/BW with F16C), 8 (AVX2, FMA, F16C).
void decode_rows_avx512(const DecodeRows& r);
// AVX-512 with AVX512_BF16 dot products, for bf16 q and K/V with d a multiple of 32: q . k exact
// products summed in f32 (vdpbf16ps), P.V with the weights rounded to bf16.
void decode_rows_avx512_bf16(const DecodeRows& r);

// The kernels' vector exp (decode_loop.hpp) over x[0, n), for the tests.
void decode_exp_avx512(const float* x, float* y, int64_t n);
void decode_exp_avx2(const float* x, float* y, int64_t n);
void decode_rows_avx2(const DecodeRows& r);

}  // namespace sieve::kernels::cpu
