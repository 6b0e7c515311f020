// The decode kernel (decode_loop.hpp) for bf16 q and K/V with AVX512_BF16 dot products: each
// vdpbf16ps does 32 multiply-adds where an FMA does 16, which halves the instructions of a call
// that is otherwise bound by them (measured on the 2-core EPYC: 2.4 zmm FMAs per ns per core, 2.7
// vdpbf16ps).
// Compiled with -mavx512f -mavx512bw -mavx512bf16 -mfma -mf16c; called only for bf16 q and K/V, a
// head dim that is a multiple of 32, and where the CPU has AVX512_BF16 (tile.cpp).
//
// Scores: q as stored (bf16) against the key rows, bf16 x bf16 products exact in f32 and summed
// in f32, then multiplied by the softmax scale (the FMA variants round q * scale instead: one
// rounding either way). P.V: the weights rounded to bf16 (the CUDA tensor-core kernels do the
// same; the tests' error bound allows it where q and K/V share a 16-bit type), two keys per
// instruction: the value rows of keys t and t + 1 interleaved element by element (vpunpck*wd),
// against the pair (p_t, p_t+1). The interleave leaves each 32-dim block of the accumulators in
// dot order: lanes of the low vector hold dims 8L + i, of the high one 8L + 4 + i (128-bit lane
// L, i < 4); reorder() puts them in and out of it. vdpbf16ps treats bf16 subnormals (below
// 1.2e-38) as zero.
#include "simd_avx512.hpp"
#include "decode_loop.hpp"
#include "decode_rows.hpp"

namespace sieve::kernels::cpu {
namespace {

using F = __m512;

// 32 bf16 as 16 pairs.
inline __m512bh pairs(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }

// Natural dim of slot s of a 32-dim block in dot order.
inline int dot_order_dim(int s) {
  return s < 16 ? 8 * (s / 4) + s % 4 : 8 * ((s - 16) / 4) + 4 + s % 4;
}

// acc[h] of dims [32 j0, 32 (j0 + B)) = alpha_h acc + sum_t p[h][t] v_t, heads [h0, h0 + H).
template <int H, int B, int D>
inline void accumulate_blocks(const DecodeRows& r, const int64_t* rows, int n, int h0, int j0,
                              const uint32_t (*w)[8], const float* alpha) {
  const uint16_t* v = static_cast<const uint16_t*>(r.v);
  const int d = simd::head_dim<D>(r);
  F a[H][2 * B];
  for (int h = 0; h < H; ++h) {
    const F s = _mm512_set1_ps(alpha[h0 + h]);
    for (int b = 0; b < 2 * B; ++b)
      a[h][b] = _mm512_mul_ps(s, _mm512_loadu_ps(r.acc + int64_t(h0 + h) * d + 32 * j0 + 16 * b));
  }
  for (int t = 0; t < n; t += 2) {
    // A missing key t + 1 repeats key t with weight 0 (the weights past n are 0).
    const uint16_t* v0 = v + rows[t] + 32 * j0;
    const uint16_t* v1 = v + rows[t + 1 < n ? t + 1 : t] + 32 * j0;
    for (int b = 0; b < B; ++b) {
      const __m512i x0 = _mm512_loadu_si512(v0 + 32 * b), x1 = _mm512_loadu_si512(v1 + 32 * b);
      const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(x0, x1);
      const __m512bh hi = (__m512bh)_mm512_unpackhi_epi16(x0, x1);
      for (int h = 0; h < H; ++h) {
        const __m512bh p = (__m512bh)_mm512_set1_epi32(int(w[h][t / 2]));
        a[h][2 * b] = _mm512_dpbf16_ps(a[h][2 * b], p, lo);
        a[h][2 * b + 1] = _mm512_dpbf16_ps(a[h][2 * b + 1], p, hi);
      }
    }
  }
  for (int h = 0; h < H; ++h)
    for (int b = 0; b < 2 * B; ++b)
      _mm512_storeu_ps(r.acc + int64_t(h0 + h) * d + 32 * j0 + 16 * b, a[h][b]);
}

template <int D>
struct Bf16Dot {
  static constexpr KvStorage kStorage = KvStorage::kBf16;

  // Four keys per pass as in score_partials: 4 x 4 chains, 4 q and 4 k vectors of pairs.
  template <int H>
  static void scores(const DecodeRows& r, const int64_t* rows, int n, int h0, float* tile) {
    constexpr int T = 4;
    const uint16_t* k = static_cast<const uint16_t*>(r.k);
    const int d = simd::head_dim<D>(r), nb = d / 32;
    const uint16_t* q = r.q_bf16 + int64_t(h0) * d;
    for (int t0 = 0; t0 < n; t0 += T) {
      const uint16_t* kt[T];
      for (int t = 0; t < T; ++t) kt[t] = k + rows[t0 + t < n ? t0 + t : n - 1];
      F a[H][T];
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) a[h][t] = _mm512_setzero_ps();
      for (int j = 0; j < nb; ++j) {
        __m512bh x[T], y[H];
        for (int t = 0; t < T; ++t) x[t] = pairs(kt[t] + 32 * j);
        for (int h = 0; h < H; ++h) y[h] = pairs(q + int64_t(h) * d + 32 * j);
        for (int h = 0; h < H; ++h)
          for (int t = 0; t < T; ++t) a[h][t] = _mm512_dpbf16_ps(a[h][t], y[h], x[t]);
      }
      for (int h = 0; h < H; ++h) {
        float* th = tile + int64_t(h0 + h) * 16 * 16;
        for (int t = 0; t < T && t0 + t < n; ++t) _mm512_storeu_ps(th + (t0 + t) * 16, a[h][t]);
      }
    }
  }

  template <int H>
  static void accumulate(const DecodeRows& r, const int64_t* rows, int n, int h0, const float* p,
                         const float* alpha) {
    alignas(64) uint32_t w[H][8];  // the chunk's weights as bf16 pairs (p_2i, p_2i+1)
    for (int h = 0; h < H; ++h)
      _mm256_store_si256(reinterpret_cast<__m256i*>(w[h]),
                         (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(p + (h0 + h) * 16)));
    const int nb = simd::head_dim<D>(r) / 32;
    int j = 0;
    for (; j + 2 <= nb; j += 2) accumulate_blocks<H, 2, D>(r, rows, n, h0, j, w, alpha);
    if (j < nb) accumulate_blocks<H, 1, D>(r, rows, n, h0, j, w, alpha);
  }

  // The accumulators into dot order or back; q is read as stored.
  static void reorder(const DecodeRows& r, bool to_storage, float* tmp) {
    for (int h = 0; h < r.nh; ++h)
      for (int b = 0; b < r.d; b += 32) {
        float* blk = r.acc + int64_t(h) * r.d + b;
        for (int s = 0; s < 32; ++s) tmp[s] = blk[s];
        for (int s = 0; s < 32; ++s) {
          if (to_storage) blk[s] = tmp[dot_order_dim(s)];
          else blk[dot_order_dim(s)] = tmp[s];
        }
      }
  }
};

}  // namespace

void decode_rows_avx512_bf16(const DecodeRows& r) { simd::decode_rows_for_dim<Avx512, Bf16Dot>(r); }

}  // namespace sieve::kernels::cpu
