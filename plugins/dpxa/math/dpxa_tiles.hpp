// The arithmetic of DPXA / XAttention / strided tile scoring and of the greedy tile cover, shared
// verbatim by the CPU path, the CUDA kernels and `sieve calibrate dpxa` (header-only, __host__
// __device__), so every path computes the same selection bit for bit (the CUDA path's tensor-core
// scoring of 16-bit Q/K is the one exception: cuda/dpxa_select.cu):
//   - every sum runs in one fixed order with plain IEEE float multiplies and adds, never
//     contracted into FMAs (__fmul_rn / __fadd_rn on the device; the CPU sources are compiled
//     with -ffp-contract=off);
//   - exponentials use exp_neg below (range reduction + a fixed polynomial), not the libraries'
//     expf, whose last bits differ between glibc and CUDA;
//   - a tile's score is kept as a log-sum-exp pair (max m, sum s of e^(logit - m)) accumulated
//     in a fixed order; a row turns its pairs into weights w_j = s_j · e^(m_j - M) with M the
//     row's max, so no log is ever taken.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SIEVE_DPXA_HD __host__ __device__ __forceinline__
#else
#define SIEVE_DPXA_HD inline
#include <cmath>
#endif

namespace sieve::dpxa {

enum Estimator : int32_t { kDpxa = 0, kXattn = 1, kStride = 2 };

// ---- Deterministic float arithmetic ----------------------------------------------------------
SIEVE_DPXA_HD float fmul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
SIEVE_DPXA_HD float fadd(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
SIEVE_DPXA_HD float fsub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
SIEVE_DPXA_HD float fsqrt(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}

// e^x for x <= 0 (x = -inf or below the float range gives 0): x = n·ln2 + r, |r| <= ln2/2,
// e^r by a degree-7 Taylor polynomial (relative error < 2e-7), times 2^n built from its bits.
SIEVE_DPXA_HD float exp_neg(float x) {
  if (!(x > -87.0f)) return 0.0f;  // also NaN -> 0 (a NaN logit never wins a tile)
  if (x > 0.0f) x = 0.0f;
  const float nf = float(int32_t(fadd(fmul(x, 1.44269504f), x < 0 ? -0.5f : 0.5f)));
  const float r = fsub(fsub(x, fmul(nf, 0.693145752f)), fmul(nf, 1.42860677e-6f));
  float p = 1.98412698e-4f;  // 1/7!
  p = fadd(fmul(p, r), 1.38888889e-3f);
  p = fadd(fmul(p, r), 8.33333333e-3f);
  p = fadd(fmul(p, r), 4.16666667e-2f);
  p = fadd(fmul(p, r), 1.66666667e-1f);
  p = fadd(fmul(p, r), 0.5f);
  p = fadd(fmul(p, r), 1.0f);
  p = fadd(fmul(p, r), 1.0f);
  const int32_t n = int32_t(nf);  // in [-126, 0]
  union {
    uint32_t u;
    float f;
  } two_n{uint32_t(n + 127) << 23};
  return fmul(p, two_n.f);
}

// Σ_i a[i]·b[i] in index order. A and B index like arrays and return float.
template <class A, class B>
SIEVE_DPXA_HD float dot(const A& a, const B& b, int32_t d) {
  float s = 0.0f;
  for (int32_t i = 0; i < d; ++i) s = fadd(s, fmul(float(a[i]), float(b[i])));
  return s;
}

// ---- Delta anchors (§4.1.1 with cosine, applied inside one block) ----------------------------
// The first vector of the block is an anchor; each next vector x is compared with the current
// anchor a and becomes the new anchor when cos(x, a) < threshold (tested as
// x·a < threshold · √(|x|²·|a|²), so no division). Writes the anchors' offsets in the block to
// `out` (ascending) and returns how many. row(i) gives vector i of the block.
template <class Row>
SIEVE_DPXA_HD int32_t delta_anchors(const Row& row, int32_t n, int32_t d, float threshold,
                                    uint8_t* out) {
  if (n <= 0) return 0;
  int32_t count = 0, anchor = 0;
  out[count++] = 0;
  float anchor_sq = dot(row(0), row(0), d);
  for (int32_t i = 1; i < n; ++i) {
    const auto x = row(i);
    const float x_sq = dot(x, x, d), xa = dot(x, row(anchor), d);
    if (xa < fmul(threshold, fsqrt(fmul(x_sq, anchor_sq)))) {
      anchor = i;
      anchor_sq = x_sq;
      out[count++] = uint8_t(i);
    }
  }
  return count;
}

// ---- Tile scores ------------------------------------------------------------------------------
// Running log-sum-exp of a tile's sampled logits: the tile's mass is s·e^m.
struct TileLse {
  float m, s;
};
SIEVE_DPXA_HD TileLse lse_empty() { return {-INFINITY, 0.0f}; }
SIEVE_DPXA_HD void lse_push(TileLse& t, float logit) {
  if (logit > t.m) {
    t.s = fadd(fmul(t.s, exp_neg(fsub(t.m, logit))), 1.0f);
    t.m = logit;
  } else {
    t.s = fadd(t.s, exp_neg(fsub(logit, t.m)));
  }
}

// One (query block, key block) tile. Query i of the block sits at position q_pos0 + i, key i at
// k_pos0 + i; q(i) / k(i) give vector i of the block (of the query head / its KV head).
struct TileGeometry {
  int64_t q_pos0, k_pos0;
  int32_t nq, nk;  // tokens of the query block / key block
  int32_t d;
};

// DPXA: Σ over anchor pairs (key anchor outer, query anchor inner) of e^(scale · q_a·k_b),
// skipping pairs a key after its query (causality inside the diagonal tile).
template <class Q, class K>
SIEVE_DPXA_HD TileLse score_dpxa(const TileGeometry& g, const Q& q, const uint8_t* qa, int32_t nqa,
                                 const K& k, const uint8_t* ka, int32_t nka, float scale) {
  TileLse t = lse_empty();
  for (int32_t b = 0; b < nka; ++b) {
    const int64_t kp = g.k_pos0 + ka[b];
    const auto kb = k(ka[b]);
    for (int32_t a = 0; a < nqa; ++a) {
      if (kp > g.q_pos0 + qa[a]) continue;
      lse_push(t, fmul(dot(q(qa[a]), kb, g.d), scale));
    }
  }
  return t;
}

// XAttention antidiagonal (§2.5): groups of S consecutive tokens; the logit of (query group gq,
// key group gk) is Σ_s q[gq·S + s] · k[gk·S + S-1-s] (strided Q against reversed strided K,
// concatenated along the head dimension), times scale/S. Tokens past a block's end count as 0.
// A key group is scored by a query group when its first key is not after the group's last query.
// Summation order: per (gk, gq), s outer and channels inner into one accumulator; the loops run
// key row by key row (each key row is fetched once, k(i) may stage it) with one accumulator per
// query group in `acc` (>= ceil(nq / S) floats); logits enter the tile in (gk, gq) order.
template <class Q, class K>
SIEVE_DPXA_HD TileLse score_xattn(const TileGeometry& g, const Q& q, const K& k, int32_t S,
                                  float scale_over_s, float* acc) {
  TileLse t = lse_empty();
  const int32_t gq_n = (g.nq + S - 1) / S, gk_n = (g.nk + S - 1) / S;
  auto scored = [&](int32_t gk, int32_t gq) {
    const int32_t q_last = (gq * S + S - 1 < g.nq ? gq * S + S - 1 : g.nq - 1);
    return g.k_pos0 + int64_t(gk) * S <= g.q_pos0 + q_last;
  };
  for (int32_t gk = 0; gk < gk_n; ++gk) {
    for (int32_t gq = 0; gq < gq_n; ++gq) acc[gq] = 0.0f;
    for (int32_t s = 0; s < S; ++s) {
      const int32_t ki = gk * S + S - 1 - s;
      if (ki >= g.nk) continue;
      const auto kv = k(ki);
      for (int32_t gq = 0; gq < gq_n; ++gq) {
        const int32_t qi = gq * S + s;
        if (qi >= g.nq || !scored(gk, gq)) continue;
        const auto qv = q(qi);
        float a = acc[gq];
        for (int32_t i = 0; i < g.d; ++i) a = fadd(a, fmul(float(qv[i]), float(kv[i])));
        acc[gq] = a;
      }
    }
    for (int32_t gq = 0; gq < gq_n; ++gq)
      if (scored(gk, gq)) lse_push(t, fmul(acc[gq], scale_over_s));
  }
  return t;
}

// Naive stride (§4.3 ablation): every S-th query against every S-th key (offsets 0, S, 2S, ...),
// no concatenation; causal pairs only.
template <class Q, class K>
SIEVE_DPXA_HD TileLse score_stride(const TileGeometry& g, const Q& q, const K& k, int32_t S,
                                   float scale) {
  TileLse t = lse_empty();
  for (int32_t kb = 0; kb < g.nk; kb += S) {
    const auto kv = k(kb);
    for (int32_t qa = 0; qa < g.nq; qa += S) {
      if (g.k_pos0 + kb > g.q_pos0 + qa) continue;
      lse_push(t, fmul(dot(q(qa), kv, g.d), scale));
    }
  }
  return t;
}

// ---- Rows: which key blocks a query block sees, which are forced ----------------------------
// Query block t of a sequence with kv_len resident tokens whose last n_new are queries: positions
// [first, last]; candidate key blocks 0 .. last / B; forced: block 0 (the sink) and the blocks
// holding [first, last] (the diagonal).
struct RowSpan {
  int64_t first, last;      // query positions
  int32_t n_candidates;     // key blocks 0 .. n_candidates - 1
  int32_t diag_first;       // key blocks >= diag_first are diagonal (forced)
};
SIEVE_DPXA_HD RowSpan row_span(int64_t kv_len, int64_t n_new, int32_t B, int32_t t) {
  const int64_t base = kv_len - n_new;
  const int64_t q0 = int64_t(t) * B;
  const int64_t q1 = q0 + B < n_new ? q0 + B : n_new;
  RowSpan r;
  r.first = base + q0;
  r.last = base + q1 - 1;
  r.n_candidates = int32_t(r.last / B) + 1;
  r.diag_first = int32_t(r.first / B);
  return r;
}
SIEVE_DPXA_HD bool forced(const RowSpan& r, int32_t j) { return j == 0 || j >= r.diag_first; }

// Candidates of query blocks 0 .. t-1 of one head, in closed form: every query block before the
// last is full, so block u sees u + 1 + ceil(base / B) key blocks (base = kv_len - n_new cached
// tokens); Σ_{u<t} = t(t+1)/2 + t·ceil(base / B). (A loop over u cost O(t) divisions per thread
// of every CTA: ~10^3 at 128K.)
SIEVE_DPXA_HD int64_t row_prefix(int64_t kv_len, int64_t n_new, int32_t B, int32_t t) {
  const int64_t c = (kv_len - n_new + B - 1) / B;
  return int64_t(t) * (t + 1) / 2 + int64_t(t) * c;
}

// Greedy order: larger weight first, equal weights by lower key block first. As one 64-bit key
// sorted descending: weight bits (weights are >= 0, so their bits order like the values) above
// the complemented index.
SIEVE_DPXA_HD uint64_t order_key(float w, int32_t j) {
  union {
    float f;
    uint32_t u;
  } bits{w > 0.0f ? w : 0.0f};
  return (uint64_t(bits.u) << 32) | uint64_t(0xFFFFFFFFu - uint32_t(j));
}
SIEVE_DPXA_HD int32_t order_index(uint64_t key) { return int32_t(0xFFFFFFFFu - uint32_t(key)); }

// Row weights from the tile pairs: w_j = s_j · e^(m_j - M), M = max_j m_j; returns Σ_j w_j in
// index order (the row's total sampled mass, in units of e^M).
SIEVE_DPXA_HD float row_weights(const TileLse* tiles, int32_t n, float* w) {
  float M = -INFINITY;
  for (int32_t j = 0; j < n; ++j) M = tiles[j].m > M ? tiles[j].m : M;
  float z = 0.0f;
  for (int32_t j = 0; j < n; ++j) {
    w[j] = tiles[j].s > 0.0f ? fmul(tiles[j].s, exp_neg(fsub(tiles[j].m, M))) : 0.0f;
    z = fadd(z, w[j]);
  }
  return z;
}

// The greedy cover once the non-forced tiles are in greedy order (`sorted` holds their order
// keys): forced mass first (index order), then tiles in order while the kept mass is below
// tau · z. Sets keep[j] for the kept non-forced tiles (keep[] of forced tiles is set by the
// caller) and returns how many were kept.
SIEVE_DPXA_HD int32_t greedy_walk(const RowSpan& r, const float* w, float z, float tau,
                                  const uint64_t* sorted, int32_t n_sorted, uint8_t* keep) {
  float kept = 0.0f;
  for (int32_t j = 0; j < r.n_candidates; ++j)
    if (forced(r, j)) kept = fadd(kept, w[j]);
  const float target = fmul(tau, z);
  const bool all = !(tau < 1.0f);  // tau >= 1: everything (rounding must not drop a tile)
  int32_t n = 0;
  for (int32_t i = 0; i < n_sorted && (all || kept < target); ++i) {
    const int32_t j = order_index(sorted[i]);
    keep[j] = 1;
    kept = fadd(kept, w[j]);
    ++n;
  }
  return n;
}

}  // namespace sieve::dpxa
