// CPU paged attention, one work item: online softmax (flash-style) with f32 accumulation over
// the item's K/V pages. Decode items go through the SIMD decode kernel (decode_rows.hpp) and
// prefill tiles through the SIMD prefill kernel (prefill_rows.hpp) where the CPU has one; else
// prefill tiles gather a few pages of keys and, when the tile is big enough, run Q·Kᵀ and P·V
// with cblas_sgemm, and small tiles use vectorizable loops over contiguous floats. A split
// decode item leaves its partial softmax state for merge_unit.
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "call.hpp"
#include "cpu_loops.hpp"
#include "decode_rows.hpp"
#include "prefill_rows.hpp"

namespace sieve::kernels::cpu {
namespace {

void finalize_row(const Call& c, int32_t token, int32_t h, float m, float l, const float* acc) {
  const int64_t i = int64_t(token) * c.s.hq + h;
  float lse = kNegInf;
  if (l > 0.f) {
    store_run(c.out, c.out_dt, i * c.s.d, c.s.d, acc, 1.f / l);
    lse = m + std::log(l);
  } else {  // the row attended nothing: output 0 by definition
    store_zeros(c.out, c.out_dt, i * c.s.d, c.s.d);
  }
  if (c.lse) c.lse[i] = lse;
  if (c.lse_all) c.lse_all[i] = lse;
}

// K and V of the tile's pages converted (or gathered) into w.kf and w.vf as [nk, d] f32, each
// key's position into w.kpos; returns nk.
int load_key_rows(const Call& c, const Item& it, const int32_t* pages, int n_pages, Scratch& w) {
  const int d = c.s.d;
  int nk = 0;
  for (int u = 0; u < n_pages; ++u) {
    const int n = c.page_tokens(it.b, pages[u]);
    const int64_t o = c.slab(it.b, pages[u], it.g);
    load_rows(c.k, c.kv_dt, o, n, d, c.s.pages.token, w.kf.data() + int64_t(nk) * d);
    load_rows(c.v, c.kv_dt, o, n, d, c.s.pages.token, w.vf.data() + int64_t(nk) * d);
    for (int i = 0; i < n; ++i) w.kpos[nk + i] = pages[u] * c.s.page_size + i;
    nk += n;
  }
  return nk;
}

// K and V of the tile's pages as [nk, d] f32 with each key's position; a single compact f32 page
// is read in place, anything else goes through load_key_rows.
struct KeyTile {
  const float* k;
  const float* v;
  int nk;
};
KeyTile gather_keys(const Call& c, const Item& it, const int32_t* pages, int n_pages,
                    Scratch& w) {
  if (n_pages == 1 && c.in_place()) {
    const int64_t o = c.slab(it.b, pages[0], it.g);
    const int nk = c.page_tokens(it.b, pages[0]);
    for (int i = 0; i < nk; ++i) w.kpos[i] = pages[0] * c.s.page_size + i;
    return {static_cast<const float*>(c.k) + o, static_cast<const float*>(c.v) + o, nk};
  }
  return {w.kf.data(), w.vf.data(), load_key_rows(c, it, pages, n_pages, w)};
}

// Online-softmax update of row r with its scores sr[0, nk): rescale the running state to the new
// maximum and turn the scores into unnormalised probabilities (0 past the row's visible keys).
// Keys are in increasing position order, so the keys a causal row sees form a prefix.
void softmax_update(int nk, const int32_t* kpos, int32_t qpos, int d, float* sr, float& m,
                    float& l, float* acc_row, int& n_visible) {
  int n_vis = nk;
  while (n_vis > 0 && kpos[n_vis - 1] > qpos) --n_vis;
  float mx = m;
  for (int k = 0; k < n_vis; ++k) mx = std::max(mx, sr[k]);
  if (mx == kNegInf) {  // nothing visible so far
    std::fill_n(sr, nk, 0.f);
    n_visible = 0;
    return;
  }
  const float alpha = std::exp(m - mx);
  float sum = 0.f;
  for (int k = 0; k < n_vis; ++k) {
    sr[k] = std::exp(sr[k] - mx);
    sum += sr[k];
  }
  std::fill(sr + n_vis, sr + nk, 0.f);
  l = l * alpha + sum;
  m = mx;
  if (alpha != 1.f)
    for (int i = 0; i < d; ++i) acc_row[i] *= alpha;
  n_visible = n_vis;
}

// A decode item's pages through the SIMD kernel: the bundle's state (w.m, w.l, w.acc, freshly
// initialised) continues over pages[0, n); `token` is the item's query. Decode's one query sits
// at the sequence's last position, so every key of every visited page is visible.
void decode_simd(const Call& c, const Item& it, int32_t token, const int32_t* pages, int32_t n,
                 Scratch& w) {
  for (int32_t u = 0; u < n; ++u) {
    w.slabs[size_t(u)] = c.slab(it.b, pages[u], it.g);
    w.page_tokens[size_t(u)] = c.page_tokens(it.b, pages[u]);
  }
  DecodeRows r;
  r.k = c.k;
  r.v = c.v;
  r.kv = c.kv_dt.bits == 32             ? KvStorage::kF32
         : c.kv_dt.code == kDLBfloat ? KvStorage::kBf16
                                     : KvStorage::kF16;
  r.d = c.s.d;
  r.nh = it.nh;
  r.q = w.qf.data();
  r.slab = w.slabs.data();
  r.token_stride = c.s.pages.token;
  r.tokens = w.page_tokens.data();
  r.n_pages = n;
  r.m = w.m.data();
  r.l = w.l.data();
  r.acc = w.acc.data();
  r.scratch = w.simd_scratch();
  r.prefetch = c.prefetch;
  if (c.decode_isa == CpuIsa::kAvx512Bf16) {  // q as stored; one decode token per item
    r.q_bf16 = static_cast<const uint16_t*>(c.q) + (int64_t(token) * c.s.hq + it.h0) * c.s.d;
    r.score_scale = c.s.scale;
  }
#ifdef SIEVE_X86_DECODE
  if (c.decode_isa == CpuIsa::kAvx512Bf16) decode_rows_avx512_bf16(r);
  else if (c.decode_isa == CpuIsa::kAvx512) decode_rows_avx512(r);
  else decode_rows_avx2(r);
#endif
}

// The tile's keys and values for the SIMD prefill kernel (load_key_rows), K's rows padded with
// zeros to nkp, a multiple of kPrefillKeyAlign. Returns nk; nkp into *nkp.
int gather_prefill_keys(const Call& c, const Item& it, const int32_t* pages, int n_pages,
                        Scratch& w, int* nkp) {
  const int nk = load_key_rows(c, it, pages, n_pages, w);
  *nkp = (nk + kPrefillKeyAlign - 1) / kPrefillKeyAlign * kPrefillKeyAlign;
  std::fill(w.kf.data() + int64_t(nk) * c.s.d, w.kf.data() + int64_t(*nkp) * c.s.d, 0.f);
  return nk;
}

// A prefill item's pages through the SIMD kernel, a key tile at a time: the state (w.m, w.l,
// w.acc, freshly initialised) of its M rows (token-major, nh heads per token) continues over
// pages[0, n).
void prefill_simd(const Call& c, const Item& it, const int32_t* pages, int32_t n, int M,
                  Scratch& w) {
  PrefillTile t;
  t.q = w.qf.data();
  t.rows = M;
  t.d = c.s.d;
  t.k = w.kf.data();
  t.kt = w.kt.data();
  t.v = w.vf.data();
  t.visible = w.lim.data();
  t.s = w.s.data();
  t.alpha = w.alpha.data();
  t.m = w.m.data();
  t.l = w.l.data();
  t.acc = w.acc.data();
  for (int32_t v = 0; v < n; v += c.pages_per_tile) {
    t.nk = gather_prefill_keys(c, it, pages + v, std::min(c.pages_per_tile, n - v), w, &t.nkp);
    for (int r = 0; r < M; ++r) {  // causal: the keys at or before the row's position
      const int32_t qpos = w.qpos[r / it.nh];
      int vis = t.nk;
      while (vis > 0 && w.kpos[vis - 1] > qpos) --vis;
      w.lim[r] = vis;
    }
#ifdef SIEVE_X86_DECODE
    if (c.prefill_isa == CpuIsa::kAvx512) prefill_tile_avx512(t);
    else prefill_tile_avx2(t);
#endif
  }
}

}  // namespace

void run_item(const Call& c, const Item& it, const int32_t* tokens, Scratch& w) {
  const int d = c.s.d, nh = it.nh, n_tok = it.tok_count, M = n_tok * nh;
  const int32_t* toks = tokens + it.tok_begin;
  const int32_t b = it.b;
  // Query token t of sequence b sits at position len_b - n_b + (t - qo[b]).
  const int32_t pos_offset = c.len(b) - (c.qo[b + 1] - c.qo[b]) - c.qo[b];

  float* qf = w.qf.data();  // [M, d], pre-scaled
  for (int ti = 0; ti < n_tok; ++ti) {
    w.qpos[ti] = pos_offset + toks[ti];
    for (int hj = 0; hj < nh; ++hj)
      load_run(c.q, c.q_dt, (int64_t(toks[ti]) * c.s.hq + it.h0 + hj) * d, d, c.s.scale,
               qf + int64_t(ti * nh + hj) * d);
  }
  float* m = w.m.data();
  float* l = w.l.data();
  float* acc = w.acc.data();
  std::fill_n(m, M, kNegInf);
  std::fill_n(l, M, 0.f);
  std::fill_n(acc, int64_t(M) * d, 0.f);

  int32_t* pages = w.pages.data();
  const int32_t n_visit = visit_pages(c, b, c.row(b, it.qblock, it.h0), w.qpos[n_tok - 1], pages);
  const int32_t v_begin = int32_t(int64_t(n_visit) * it.split / c.n_splits);
  const int32_t v_end = int32_t(int64_t(n_visit) * (it.split + 1) / c.n_splits);

  const bool gemm = c.gemm && M >= kBlasMinRows;
  float* sc = w.s.data();
  if (c.decode_isa != CpuIsa::kPortable) {  // decode: one token, every key of the pages visible
    decode_simd(c, it, toks[0], pages + v_begin, v_end - v_begin, w);
  } else if (c.prefill_isa != CpuIsa::kPortable) {
    prefill_simd(c, it, pages + v_begin, v_end - v_begin, M, w);
  } else {
    for (int32_t v = v_begin; v < v_end; v += c.pages_per_tile) {
      const KeyTile t = gather_keys(c, it, pages + v, std::min(c.pages_per_tile, v_end - v), w);
      // Scores S = (scale q) · kᵀ, [M, nk].
      if (gemm)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, t.nk, d, 1.f, qf, d, t.k, d, 0.f,
                    sc, t.nk);
      else
        for (int r = 0; r < M; ++r) score_row(qf + int64_t(r) * d, t.k, t.nk, d, sc + int64_t(r) * t.nk);

      for (int r = 0; r < M; ++r)
        softmax_update(t.nk, w.kpos.data(), w.qpos[r / nh], d, sc + int64_t(r) * t.nk, m[r], l[r],
                       acc + int64_t(r) * d, w.lim[r]);

      // acc += P · V.
      if (gemm)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, d, t.nk, 1.f, sc, t.nk, t.v, d,
                    1.f, acc, d);
      else
        for (int r = 0; r < M; ++r)
          accumulate_row(sc + int64_t(r) * t.nk, t.v, w.lim[r], d, acc + int64_t(r) * d);
    }
  }

  if (c.n_splits > 1) {  // leave the partial state [acc | m | l]; merge_unit finalises
    float* slot = c.partials + (int64_t(it.unit) * c.n_splits + it.split) * c.partial_floats(nh);
    std::copy_n(acc, int64_t(nh) * d, slot);
    std::copy_n(m, nh, slot + int64_t(nh) * d);
    std::copy_n(l, nh, slot + int64_t(nh) * d + nh);
    return;
  }
  for (int ti = 0; ti < n_tok; ++ti)
    for (int hj = 0; hj < nh; ++hj) {
      const int r = ti * nh + hj;
      finalize_row(c, toks[ti], it.h0 + hj, m[r], l[r], acc + int64_t(r) * d);
    }
}

// Merges the split-KV states of one unit (decode: one token) by their log-sum-exp.
void merge_unit(const Call& c, const Item& unit, const int32_t* tokens, Scratch& w) {
  const int d = c.s.d, nh = unit.nh;
  const int64_t pf = c.partial_floats(nh);
  const float* base = c.partials + int64_t(unit.unit) * c.n_splits * pf;
  auto m_of = [&](int sp, int hj) { return base[sp * pf + int64_t(nh) * d + hj]; };
  auto l_of = [&](int sp, int hj) { return base[sp * pf + int64_t(nh) * d + nh + hj]; };
  float* row = w.row.data();
  for (int hj = 0; hj < nh; ++hj) {
    float mx = kNegInf;
    for (int sp = 0; sp < c.n_splits; ++sp) mx = std::max(mx, m_of(sp, hj));
    float l = 0.f;
    std::fill_n(row, d, 0.f);
    for (int sp = 0; sp < c.n_splits && mx != kNegInf; ++sp) {
      if (m_of(sp, hj) == kNegInf) continue;  // an empty chunk
      const float wgt = std::exp(m_of(sp, hj) - mx);
      l += l_of(sp, hj) * wgt;
      const float* a = base + sp * pf + int64_t(hj) * d;
      for (int i = 0; i < d; ++i) row[i] += a[i] * wgt;
    }
    finalize_row(c, tokens[unit.tok_begin], unit.h0 + hj, mx, l, row);
  }
}

}  // namespace sieve::kernels::cpu
