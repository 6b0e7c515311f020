// The CPU prefill kernel, written once over a vector type V (prefill_avx512.cpp and
// prefill_avx2.cpp supply it and compile this with their -m flags; see decode_loop.hpp for why
// nothing here may be shared with other translation units). One tile (prefill_rows.hpp):
//   0. the keys transposed in W x W register blocks;
//   1. scores S = Q·Kᵀ: blocks of R rows x C vectors of keys held in registers; per dim, C key
//      vectors are loaded from the transposed tile and each row's q element is broadcast, so a
//      block is R x C independent FMA chains (the outer-product form of a GEMM micro-kernel);
//   2. online softmax per row in vectors: new maximum over the visible keys, weights
//      exp(s - m) with decode's vector exp, 0 past the visible keys, the rescale factor;
//   3. acc = alpha acc + P·V: blocks of R rows x B vectors of dims in registers; per key, B value
//      vectors are loaded and each row's weight broadcast. Keys past every row's visible prefix
//      are skipped (the causal diagonal).
#pragma once
#include "decode_loop.hpp"
#include "prefill_rows.hpp"

namespace sieve::kernels::cpu::simd {

// S[r0 .. r0 + R)[vectors c0 .. c0 + C) of the tile.
template <class V, int R, int C>
inline void prefill_scores_block(const PrefillTile& t, int r0, int c0) {
  using F = typename V::F;
  constexpr int W = V::W;
  F a[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) a[r][c] = V::zero();
  const float* q = t.q + int64_t(r0) * t.d;
  const float* kt = t.kt + int64_t(c0) * W;
  for (int i = 0; i < t.d; ++i) {
    F k[C];
    for (int c = 0; c < C; ++c) k[c] = V::loadf(kt + int64_t(i) * t.nkp + c * W);
    for (int r = 0; r < R; ++r) {
      const F x = V::set1(q[int64_t(r) * t.d + i]);
      for (int c = 0; c < C; ++c) a[r][c] = V::fma(x, k[c], a[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) V::storef(t.s + int64_t(r0 + r) * t.nkp + (c0 + c) * W, a[r][c]);
}

// Rows [r0, r0 + R): every vector of keys up to the block's last visible one.
template <class V, int R>
inline void prefill_scores_rows(const PrefillTile& t, int r0) {
  constexpr int W = V::W, C = V::kPrefillKeyVectors;
  int vis = 0;
  for (int r = 0; r < R; ++r) vis = t.visible[r0 + r] > vis ? t.visible[r0 + r] : vis;
  const int nv = (vis + W - 1) / W;
  int c = 0;
  for (; c + C <= nv; c += C) prefill_scores_block<V, R, C>(t, r0, c);
  for (; c < nv; ++c) prefill_scores_block<V, R, 1>(t, r0, c);
}

// Row r's online-softmax step over its scores: weights in place, its rescale factor in alpha.
template <class V>
inline void prefill_softmax_row(const PrefillTile& t, int r) {
  using F = typename V::F;
  constexpr int W = V::W;
  constexpr float kNegInf = -__builtin_inff();
  float* s = t.s + int64_t(r) * t.nkp;
  const int n = t.visible[r];
  if (n == 0) {  // nothing visible in this tile: the state stands
    t.alpha[r] = 1.f;
    return;
  }
  F mx = V::set1(kNegInf);
  for (int j = 0; j < n; j += W) mx = V::max(mx, V::first(V::loadf(s + j), n - j, kNegInf));
  const float m_old = t.m[r];
  const float s_max = V::hmax(mx);
  const float m_new = m_old > s_max ? m_old : s_max;
  const F mv = V::set1(m_new);
  F sum = V::zero();
  for (int j = 0; j < n; j += W) {
    const F e = V::first(exp<V>(V::sub(V::loadf(s + j), mv)), n - j, 0.f);
    V::storef(s + j, e);
    sum = V::add(sum, e);
  }
  const float a = m_old == m_new ? 1.f : V::lane0(exp<V>(V::set1(m_old - m_new)));
  t.alpha[r] = a;
  t.l[r] = t.l[r] * a + V::hsum(sum);
  t.m[r] = m_new;
}

// acc[r0 .. r0 + R)[vectors j0 .. j0 + B) = alpha acc + P·V over keys [0, nk).
template <class V, int R, int B>
inline void prefill_accumulate_block(const PrefillTile& t, int r0, int j0, int nk) {
  using F = typename V::F;
  constexpr int W = V::W;
  F a[R][B];
  for (int r = 0; r < R; ++r) {
    const F s = V::set1(t.alpha[r0 + r]);
    for (int b = 0; b < B; ++b)
      a[r][b] = V::mul(s, V::loadf(t.acc + int64_t(r0 + r) * t.d + (j0 + b) * W));
  }
  const float* p = t.s + int64_t(r0) * t.nkp;
  for (int k = 0; k < nk; ++k) {
    F x[B];
    for (int b = 0; b < B; ++b) x[b] = V::loadf(t.v + int64_t(k) * t.d + (j0 + b) * W);
    for (int r = 0; r < R; ++r) {
      const F w = V::set1(p[int64_t(r) * t.nkp + k]);
      for (int b = 0; b < B; ++b) a[r][b] = V::fma(w, x[b], a[r][b]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int b = 0; b < B; ++b) V::storef(t.acc + int64_t(r0 + r) * t.d + (j0 + b) * W, a[r][b]);
}

// Rows [r0, r0 + R): their weights past each one's visible prefix are 0 (cleared here), so the
// block runs to the largest prefix.
template <class V, int R>
inline void prefill_accumulate_rows(const PrefillTile& t, int r0) {
  constexpr int W = V::W, B = V::kPrefillDimVectors;
  int nk = 0;
  for (int r = 0; r < R; ++r) nk = t.visible[r0 + r] > nk ? t.visible[r0 + r] : nk;
  for (int r = 0; r < R; ++r)
    for (int k = t.visible[r0 + r]; k < nk; ++k) t.s[int64_t(r0 + r) * t.nkp + k] = 0.f;
  const int nv = t.d / W;
  int j = 0;
  for (; j + B <= nv; j += B) prefill_accumulate_block<V, R, B>(t, r0, j, nk);
  for (; j < nv; ++j) prefill_accumulate_block<V, R, 1>(t, r0, j, nk);
}

// f(r0) over blocks of R rows, then the remaining 1 .. R-1 rows one at a time.
template <int R, class Block, class One>
inline void for_row_blocks(int rows, Block block, One one) {
  int r = 0;
  for (; r + R <= rows; r += R) block(r);
  for (; r < rows; ++r) one(r);
}

template <class V>
void prefill_tile(const PrefillTile& t) {
  constexpr int RS = V::kPrefillScoreRows, RA = V::kPrefillAccRows, W = V::W;
  for (int j = 0; j < t.nkp; j += W)
    for (int i = 0; i < t.d; i += W)
      V::transpose(t.k + int64_t(j) * t.d + i, t.d, t.kt + int64_t(i) * t.nkp + j, t.nkp);
  for_row_blocks<RS>(
      t.rows, [&](int r) { prefill_scores_rows<V, RS>(t, r); },
      [&](int r) { prefill_scores_rows<V, 1>(t, r); });
  for (int r = 0; r < t.rows; ++r) prefill_softmax_row<V>(t, r);
  for_row_blocks<RA>(
      t.rows, [&](int r) { prefill_accumulate_rows<V, RA>(t, r); },
      [&](int r) { prefill_accumulate_rows<V, 1>(t, r); });
}

}  // namespace sieve::kernels::cpu::simd
