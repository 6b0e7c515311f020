// The CPU decode kernel, written once over a vector type V and a products type P
// (decode_avx512.cpp, decode_avx2.cpp and decode_avx512_bf16.cpp supply them and compile this
// with their -m flags; V and P live in their anonymous namespaces, so every instantiation is
// local to its translation unit). Nothing from the standard library here: see decode_rows.hpp.
//
// Keys are taken W (= V::W, the lane count) at a time, in order across page boundaries, as a
// list of row offsets. Per chunk:
//   1. scores: a few keys at a time, each key row widened once into registers and multiplied with
//      up to four heads' queries (keys x heads independent FMA chains); each (head, key) leaves a
//      vector of partial sums in a W x W tile, and one transposing add tree turns the tile into
//      the head's W scores;
//   2. online softmax in vectors: new maximum, the W weights exp(s - m) (a vector exp), the
//      running sum, and the factor the old accumulator is rescaled by (1 without an exp when the
//      maximum holds);
//   3. P.V: for a block of output dims, up to four heads' accumulators sit in registers while
//      each value row of the chunk is widened once and added with the heads' weights.
// K and V bytes are read from memory once per chunk; a bundle of more than four heads re-reads
// the rows from L1. The next chunk's rows are prefetched while this one is computed (pages are
// scattered, so the hardware prefetcher restarts at every page), one line per line loaded: each
// load of the scores (P.V) is followed by the prefetch of the same bytes of the next chunk's key
// (value) row, so the prefetches are spread evenly through the loops (see Ahead).
//
// bf16 rows are read 2W elements at a time and widened without a lane shuffle: the even elements
// are the 32-bit words shifted left by 16, the odd ones the words with the low half cleared. The
// dims of q and of the accumulators are kept in that order (storage order: within each block of
// 2W dims, the even ones, then the odd ones) and put back at the end; dot products and the
// per-dim sums of P.V do not depend on the order of the dims.
#pragma once
#include "decode_rows.hpp"

namespace sieve::kernels::cpu::simd {

// The next chunk's rows, whose lines are prefetched as the current chunk's same lines are loaded.
// Spread, not issued all at once at the start of a chunk: measured on the 2-core EPYC (one thread,
// K/V from memory, a throwaway loop reading 8 KiB slabs with FMAs between the loads), a burst of
// a page's prefetches was about as slow as none (133 vs 150 ns per key) and the same prefetches
// spread one per line loaded 2.5x faster (53-59 ns): a burst fills the L1 miss buffers and the
// demand loads wait behind it. rows == nullptr: no prefetch (a second block of heads re-reading
// the chunk, or prefetch off).
struct Ahead {
  const int64_t* rows = nullptr;
  int n = 0;
};

// One cache line into L1. Inline asm because GCC deletes a loop whose only statements are
// __builtin_prefetch at -O2 (-ffinite-loops: the -O2 build of this kernel had none left); a
// template like everything here, so each translation unit keeps its own copy.
template <class V>
inline void prefetch_line(const void* p) {
  asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p)));
}

// Prefetch of elements [e0, e0 + ne) of the rows of keys [t0, t0 + T) of `next` in pool `base`
// (storage S), a line per 64 bytes.
template <class V, KvStorage S, int T>
inline void prefetch_span(const void* base, const Ahead& next, int t0, int64_t e0, int ne) {
  if (!next.rows) return;
  constexpr int es = S == KvStorage::kF32 ? 4 : 2;
  for (int t = t0; t < t0 + T && t < next.n; ++t) {
    const char* p = static_cast<const char*>(base) + (next.rows[t] + e0) * es;
    for (int b = 0; b < ne * es; b += 64) prefetch_line<V>(p + b);
  }
}

// Row offsets (elements) of the next W keys of the visited pages, continuing from (page u,
// token i); returns how many (0 at the end).
template <class V>
inline int next_chunk(const DecodeRows& r, int32_t& u, int32_t& i, int64_t* rows) {
  constexpr int W = V::W;
  int n = 0;
  while (n < W && u < r.n_pages) {
    const int32_t left = r.tokens[u] - i;
    const int32_t take = left < W - n ? left : W - n;
    for (int32_t j = 0; j < take; ++j) rows[n + j] = r.slab[u] + int64_t(i + j) * r.token_stride;
    n += take;
    i += take;
    if (i >= r.tokens[u]) {
      ++u;
      i = 0;
    }
  }
  return n;
}

// The head dim: D when the kernel is instantiated for it (64, 128: loops of constant trip count,
// unrolled, with constant offsets), else the call's.
template <int D>
inline int head_dim(const DecodeRows& r) {
  return D > 0 ? D : r.d;
}

// exp(x) for x <= 88 (Cephes expf: Cody-Waite reduction by ln 2, a degree-6 polynomial, then
// 2^n); about 1 ulp. x below -87.3 (and -inf) gives exp(-87.3), ~1e-38.
template <class V>
inline typename V::F exp(typename V::F x) {
  using F = typename V::F;
  x = V::clamp(x, -87.3365f, 88.f);
  const F n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  F r = V::fnma(n, V::set1(0.693359375f), x);
  r = V::fnma(n, V::set1(-2.12194440e-4f), r);
  F y = V::set1(1.9875691500e-4f);
  y = V::fma(y, r, V::set1(1.3981999507e-3f));
  y = V::fma(y, r, V::set1(8.3334519073e-3f));
  y = V::fma(y, r, V::set1(4.1665795894e-2f));
  y = V::fma(y, r, V::set1(1.6666665459e-1f));
  y = V::fma(y, r, V::set1(5.0000001201e-1f));
  y = V::fma(V::mul(y, r), r, V::add(r, V::set1(1.f)));
  return V::scale2(y, n);
}

// y[i] = exp(x[i]), i < n (the tests' view of exp).
template <class V>
void exp_all(const float* x, float* y, int64_t n) {
  float in[V::W] = {}, out[V::W];
  for (int64_t i = 0; i < n; i += V::W) {
    const int64_t m = n - i < V::W ? n - i : V::W;
    for (int64_t j = 0; j < m; ++j) in[j] = x[i + j];
    V::storef(out, exp<V>(V::loadf(in)));
    for (int64_t j = 0; j < m; ++j) y[i + j] = out[j];
  }
}

// Partial dot products of heads [h0, h0 + H) with keys rows[0, n): tile[h][t] (W lanes) sums to
// q_h . k_t. T = V::kScoreKeys keys per pass, q and k vectors loaded into registers once per
// (head, key) block: H x T independent FMA chains for H + T loads (a key past n repeats the last
// one; its partials are not stored).
template <class V, KvStorage S, int H, int D>
inline void score_partials(const DecodeRows& r, const int64_t* rows, int n, int h0, float* tile,
                           const Ahead& next) {
  using F = typename V::F;
  constexpr int W = V::W, T = V::kScoreKeys;
  const int d = head_dim<D>(r), nv = d / W;
  const float* q = r.q + int64_t(h0) * d;
  for (int t0 = 0; t0 < n; t0 += T) {
    int64_t o[T];
    for (int t = 0; t < T; ++t) o[t] = rows[t0 + t < n ? t0 + t : n - 1];
    F a[H][T];
    for (int h = 0; h < H; ++h)
      for (int t = 0; t < T; ++t) a[h][t] = V::zero();
    int j = 0;
    for (; j + 2 <= nv; j += 2) {
      F k[T][2];
      for (int t = 0; t < T; ++t) V::template load2<S>(r.k, o[t] + int64_t(j) * W, k[t]);
      prefetch_span<V, S, T>(r.k, next, t0, int64_t(j) * W, 2 * W);
      for (int e = 0; e < 2; ++e) {
        F x[H];
        for (int h = 0; h < H; ++h) x[h] = V::loadf(q + int64_t(h) * d + (j + e) * W);
        for (int h = 0; h < H; ++h)
          for (int t = 0; t < T; ++t) a[h][t] = V::fma(x[h], k[t][e], a[h][t]);
      }
    }
    for (; j < nv; ++j) {
      F k[T], x[H];
      for (int t = 0; t < T; ++t) k[t] = V::template load<S>(r.k, o[t] + int64_t(j) * W);
      prefetch_span<V, S, T>(r.k, next, t0, int64_t(j) * W, W);
      for (int h = 0; h < H; ++h) x[h] = V::loadf(q + int64_t(h) * d + j * W);
      for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) a[h][t] = V::fma(x[h], k[t], a[h][t]);
    }
    for (int h = 0; h < H; ++h) {
      float* th = tile + int64_t(h0 + h) * W * W;
      for (int t = 0; t < T && t0 + t < n; ++t) V::storef(th + (t0 + t) * W, a[h][t]);
    }
  }
}

// acc[h][dims of vectors j0 .. j0 + B) = alpha_h * acc + sum_t p[h][t] v_t, heads [h0, h0 + H).
template <class V, KvStorage S, int H, int B, int D>
inline void accumulate(const DecodeRows& r, const int64_t* rows, int n, int h0, int j0,
                       const float* p, const float* alpha, const Ahead& next) {
  using F = typename V::F;
  constexpr int W = V::W;
  const int d = head_dim<D>(r);
  F a[H][B];
  for (int h = 0; h < H; ++h) {
    const F s = V::set1(alpha[h0 + h]);
    for (int b = 0; b < B; ++b)
      a[h][b] = V::mul(s, V::loadf(r.acc + int64_t(h0 + h) * d + (j0 + b) * W));
  }
  for (int t = 0; t < n; ++t) {
    F x[B];
    if constexpr (B % 2 == 0)
      for (int b = 0; b < B; b += 2)
        V::template load2<S>(r.v, rows[t] + int64_t(j0 + b) * W, x + b);
    else
      for (int b = 0; b < B; ++b) x[b] = V::template load<S>(r.v, rows[t] + int64_t(j0 + b) * W);
    prefetch_span<V, S, 1>(r.v, next, t, int64_t(j0) * W, B * W);
    for (int h = 0; h < H; ++h) {
      const F w = V::set1(p[(h0 + h) * W + t]);
      for (int b = 0; b < B; ++b) a[h][b] = V::fma(w, x[b], a[h][b]);
    }
  }
  for (int h = 0; h < H; ++h)
    for (int b = 0; b < B; ++b) V::storef(r.acc + int64_t(h0 + h) * d + (j0 + b) * W, a[h][b]);
}

template <class V, KvStorage S, int H, int D>
inline void accumulate_dims(const DecodeRows& r, const int64_t* rows, int n, int h0,
                            const float* p, const float* alpha, const Ahead& next) {
  const int nv = head_dim<D>(r) / V::W;
  int j = 0;
  static_assert(V::kDimBlock % 2 == 0, "dim blocks are whole pairs of vectors");
  for (; j + V::kDimBlock <= nv; j += V::kDimBlock)
    accumulate<V, S, H, V::kDimBlock, D>(r, rows, n, h0, j, p, alpha, next);
  for (; j + 2 <= nv; j += 2) accumulate<V, S, H, 2, D>(r, rows, n, h0, j, p, alpha, next);
  if (j < nv) accumulate<V, S, H, 1, D>(r, rows, n, h0, j, p, alpha, next);
}

// Heads in blocks of four (the register budget of both phases).
// Storage order (see the top) <-> natural order of the dims of `rows` rows of d floats, through
// `tmp` (2W floats): only bf16 has one, over the whole blocks of 2W dims.
template <class V, KvStorage S>
inline void reorder_dims(float* x, int rows, int d, bool to_storage, float* tmp) {
  constexpr int W = V::W;
  if constexpr (S == KvStorage::kBf16) {
    for (int r = 0; r < rows; ++r)
      for (int b = 0; b + 2 * W <= d; b += 2 * W) {
        float* blk = x + int64_t(r) * d + b;
        for (int e = 0; e < 2 * W; ++e) tmp[e] = blk[e];
        for (int e = 0; e < W; ++e) {
          if (to_storage) {
            blk[e] = tmp[2 * e];
            blk[W + e] = tmp[2 * e + 1];
          } else {
            blk[2 * e] = tmp[e];
            blk[2 * e + 1] = tmp[W + e];
          }
        }
      }
  }
}

// The products of the kernel with FMAs on f32 vectors: scores from the scaled f32 q, P.V with f32
// weights. decode_rows takes the two phases from a type like this one.
template <class V, KvStorage S, int D>
struct FmaProducts {
  static constexpr KvStorage kStorage = S;
  template <int H>
  static void scores(const DecodeRows& r, const int64_t* rows, int n, int h0, float* tile,
                     const Ahead& next) {
    score_partials<V, S, H, D>(r, rows, n, h0, tile, next);
  }
  template <int H>
  static void accumulate(const DecodeRows& r, const int64_t* rows, int n, int h0, const float* p,
                         const float* alpha, const Ahead& next) {
    accumulate_dims<V, S, H, D>(r, rows, n, h0, p, alpha, next);
  }
  // q and the accumulators into storage order, or the accumulators back.
  static void reorder(const DecodeRows& r, bool to_storage, float* tmp) {
    if (to_storage) reorder_dims<V, S>(r.q, r.nh, r.d, true, tmp);
    reorder_dims<V, S>(r.acc, r.nh, r.d, to_storage, tmp);
  }
};

// The first block of heads prefetches `next`; later ones read the chunk again from L1.
template <class P, int H>
inline void head_block(const DecodeRows& r, const int64_t* rows, int n, int h0, float* tile,
                       const float* p, const float* alpha, bool scores, const Ahead& next) {
  const Ahead ahead = h0 == 0 ? next : Ahead{};
  if (scores) P::template scores<H>(r, rows, n, h0, tile, ahead);
  else P::template accumulate<H>(r, rows, n, h0, p, alpha, ahead);
}

template <class P>
inline void for_head_blocks(const DecodeRows& r, const int64_t* rows, int n, float* tile,
                            const float* p, const float* alpha, bool scores, const Ahead& next) {
  int h0 = 0;
  for (; h0 + 4 <= r.nh; h0 += 4) head_block<P, 4>(r, rows, n, h0, tile, p, alpha, scores, next);
  switch (r.nh - h0) {
    case 3: head_block<P, 3>(r, rows, n, h0, tile, p, alpha, scores, next); break;
    case 2: head_block<P, 2>(r, rows, n, h0, tile, p, alpha, scores, next); break;
    case 1: head_block<P, 1>(r, rows, n, h0, tile, p, alpha, scores, next); break;
    default: break;
  }
}

template <class V, class P>
void decode_rows(const DecodeRows& r) {
  using F = typename V::F;
  constexpr int W = V::W;
  constexpr float kNegInf = -__builtin_inff();
  float* tile = r.scratch;                           // [nh][W][W]
  float* p = tile + int64_t(r.nh) * W * W;           // [nh][W]
  float* alpha = p + int64_t(r.nh) * W;              // [nh]
  float* tmp = alpha + r.nh;                         // [2W]
  P::reorder(r, true, tmp);
  // Chunk k's rows in slot k % (A + 1): this one, and the one A ahead whose lines are prefetched.
  // A = 2 measured no faster than 1 (bf16: 34.7 vs 35.4 ns per key, f32 67.7 vs 60.9; one thread,
  // 32K keys from memory, 4 heads).
  constexpr int A = 1;
  int64_t chunk[A + 1][W];
  int count[A + 1];
  int32_t u = 0, i = 0;
  for (int k = 0; k <= A; ++k) count[k] = next_chunk<V>(r, u, i, chunk[k]);
  for (int c = 0; count[c] > 0; c = c == A ? 0 : c + 1) {
    const int64_t* rows = chunk[c];
    const int n = count[c];
    const int f = c == 0 ? A : c - 1;
    const Ahead next = r.prefetch ? Ahead{chunk[f], count[f]} : Ahead{};
    for_head_blocks<P>(r, rows, n, tile, p, alpha, true, next);
    const F scale = V::set1(r.score_scale);
    for (int h = 0; h < r.nh; ++h) {
      const F s = V::first(V::mul(scale, V::row_sums(tile + int64_t(h) * W * W)), n, kNegInf);
      const float m_old = r.m[h];
      const float s_max = V::hmax(s);
      const float m_new = m_old > s_max ? m_old : s_max;
      // exp(-inf - m) is exp of the clamped argument, ~1e-38, and multiplies l = acc = 0.
      const F e = V::first(exp<V>(V::sub(s, V::set1(m_new))), n, 0.f);
      V::storef(p + h * W, e);
      // exp(0) is 1 too
      const float a = m_old == m_new ? 1.f : V::lane0(exp<V>(V::set1(m_old - m_new)));
      alpha[h] = a;
      r.l[h] = r.l[h] * a + V::hsum(e);
      r.m[h] = m_new;
    }
    for_head_blocks<P>(r, rows, n, tile, p, alpha, false, next);
    count[c] = next_chunk<V>(r, u, i, chunk[c]);
  }
  P::reorder(r, false, tmp);
}

// decode_rows with P<D> for the head dims instantiated (64, 128), P<0> for the others.
template <class V, template <int> class P>
void decode_rows_for_dim(const DecodeRows& r) {
  if (r.d == 128) decode_rows<V, P<128>>(r);
  else if (r.d == 64) decode_rows<V, P<64>>(r);
  else decode_rows<V, P<0>>(r);
}

template <class V, KvStorage S>
struct Fma {
  template <int D>
  using Products = FmaProducts<V, S, D>;
};

// The entry point of one variant: dispatch on the storage type and head dim.
template <class V>
void decode_rows_any(const DecodeRows& r) {
  switch (r.kv) {
    case KvStorage::kF32:
      decode_rows_for_dim<V, Fma<V, KvStorage::kF32>::template Products>(r);
      break;
    case KvStorage::kBf16:
      decode_rows_for_dim<V, Fma<V, KvStorage::kBf16>::template Products>(r);
      break;
    case KvStorage::kF16:
      decode_rows_for_dim<V, Fma<V, KvStorage::kF16>::template Products>(r);
      break;
  }
}

}  // namespace sieve::kernels::cpu::simd
