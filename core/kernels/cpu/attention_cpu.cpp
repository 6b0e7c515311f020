// CPU paged attention: online softmax (flash-style) with f32 accumulation over K/V pages.
//
// Work is split into items of (sequence, KV head, head bundle, query tile[, KV split]) and run
// with OpenMP. A head bundle is every query head that reads one selection row through one KV head
// (the whole GQA group, or a single head for PER_Q_HEAD selections), so each K/V page is loaded
// and converted to f32 once for all of the bundle's heads. Prefill tiles gather a few pages of
// keys and, when the tile is big enough, run Q·Kᵀ and P·V with cblas_sgemm; decode and small
// tiles use vectorizable loops over contiguous floats. Decode with fewer items than threads
// splits each sequence's pages into chunks and merges the partial softmax states by their
// log-sum-exp. Page statistics (decode) are a second sweep over the attended pages with the final
// lse.
#include "sieve/kernels/attention_cpu.hpp"

#include <cblas.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <new>
#include <vector>

#include "cpu_loops.hpp"
#include "attention_variant_cpu.hpp"
#include "decode_rows.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kernels {
namespace {

using cpu::accumulate_row;
using cpu::dot;
using cpu::load_rows;
using cpu::load_run;
using cpu::score_row;
using cpu::store_run;
using cpu::store_zeros;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Prefill key tile: gather pages until ~64 keys, so a tile is a reasonable GEMM operand.
constexpr int kTileKeys = 64;
// Keep every GEMM at M*N*K <= 2^18: the operands stay in L2, and OpenBLAS runs a call this small
// on the calling thread (GEMM_MULTITHREAD_THRESHOLD), so OpenMP workers do not contend for its
// thread pool.
constexpr int64_t kGemmMaxWork = int64_t(1) << 18;
constexpr int kBlasMinRows = 16;
constexpr int kBlasMinHeadDim = 32;
constexpr int kMaxTileRows = 128;
constexpr int kMinPagesPerSplit = 8;
constexpr int kMaxSplits = 64;

// ---- the call, read-only inside the parallel regions -----------------------------------------

struct Call {
  AttentionShape s;
  const void* q = nullptr;
  DLDataType q_dt{};
  void* out = nullptr;
  DLDataType out_dt{};
  const void* k = nullptr;
  const void* v = nullptr;
  DLDataType kv_dt{};
  const int32_t* qo = nullptr;         // host qo_indptr
  const int32_t* kv_indptr = nullptr;  // host mirror
  const int32_t* kv_last = nullptr;    // host mirror
  const int32_t* kv_ids = nullptr;     // physical page ids
  const int32_t* sel_indptr = nullptr;
  const int32_t* sel_ids = nullptr;
  const int64_t* c_b = nullptr;        // query blocks before each sequence (selection rows)
  const uint8_t* row_mask = nullptr;   // q_rows as a mask over query tokens; null = all
  float* lse = nullptr;                // args.lse, or null
  float* lse_all = nullptr;            // every computed row's lse, for the stats sweep
  float* page_mass = nullptr;
  float* partials = nullptr;           // split-KV states
  int pages_per_tile = 1;              // pages gathered per key tile
  int tile_rows = 1;                   // query rows (tokens x bundle heads) per tile, at most
  int max_pages = 0;                   // pages of the longest sequence
  bool gemm = false;                   // BLAS allowed for this call's prefill tiles
  CpuIsa decode_isa = CpuIsa::kPortable;  // decode rows: SIMD kernel (decode_rows.hpp) or loops
  bool prefetch = true;                   // ... with software prefetch
  int n_splits = 1;

  int32_t pages(int32_t b) const { return kv_indptr[b + 1] - kv_indptr[b]; }
  int32_t len(int32_t b) const {
    const int32_t n = pages(b);
    return n == 0 ? 0 : (n - 1) * s.page_size + kv_last[b];
  }
  int32_t page_tokens(int32_t b, int32_t p) const {
    return p == pages(b) - 1 ? kv_last[b] : s.page_size;
  }
  // Element offset of token 0 of logical page p, KV head g (its tokens s.pages.token apart).
  int64_t slab(int32_t b, int32_t p, int32_t g) const {
    return s.pages.row(kv_ids[kv_indptr[b] + p], g, 0);
  }
  // The tile loops read a page's keys in place: f32 pages whose tokens are adjacent (HND).
  bool in_place() const { return kv_dt.bits == 32 && s.pages.slab_contiguous(s.d); }
  // Selection row read by query head `h` of sequence b, query block t; -1 when dense.
  int64_t row(int32_t b, int32_t t, int32_t h) const {
    if (s.dense) return -1;
    return selection_row(c_b[b], t, s.sel_h, selection_head(s.sel_heads, h, s.group));
  }
  int64_t partial_floats(int nh) const { return int64_t(nh) * (s.d + 2); }
};

// Logical pages a selection row (or every page, row < 0) attends, in increasing order, up to
// the page holding max_pos (causality: later pages hold no visible key). Returns the count.
int32_t visit_pages(const Call& c, int32_t b, int64_t row, int32_t max_pos, int32_t* pages) {
  const int32_t np = c.pages(b);
  const int32_t last = std::min(np - 1, max_pos / c.s.page_size);
  int32_t n = 0;
  if (row < 0) {
    for (int32_t p = 0; p <= last; ++p) pages[n++] = p;
    return n;
  }
  const int32_t kbp = c.s.k_block_pages;
  for (int32_t e = c.sel_indptr[row]; e < c.sel_indptr[row + 1]; ++e) {
    const int32_t p0 = c.sel_ids[e] * kbp;
    const int32_t p1 = std::min(p0 + kbp, np);
    for (int32_t p = p0; p < p1; ++p) {
      if (p > last) return n;
      pages[n++] = p;
    }
  }
  return n;
}

// ---- per-thread scratch (grows to the call's sizes, then is reused: no per-page allocation) ---

template <class T>
void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

struct Scratch {
  std::vector<float> qf, acc, m, l, s, kf, vf, row, pmax;
  std::vector<int32_t> pages, kpos, qpos, lim, page_tokens;
  std::vector<int64_t> slabs;
  std::vector<float> simd;  // the SIMD decode kernel's scratch, 64-byte aligned inside

  float* simd_scratch() {
    const uintptr_t p = reinterpret_cast<uintptr_t>(simd.data());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
  }

  // Sizes every buffer for the call (a no-op once a thread has seen a call this large).
  static Scratch& for_call(const Call& c) {
    static thread_local Scratch w;
    const size_t rows = size_t(c.tile_rows), d = size_t(c.s.d);
    const size_t keys = size_t(c.pages_per_tile) * size_t(c.s.page_size);
    grow(w.qf, rows * d);
    grow(w.acc, rows * d);
    grow(w.m, rows);
    grow(w.l, rows);
    grow(w.lim, rows);
    grow(w.qpos, rows);
    grow(w.s, rows * keys);
    grow(w.kf, keys * d);
    grow(w.vf, keys * d);
    grow(w.kpos, keys);
    grow(w.row, d);
    grow(w.pages, size_t(std::max(c.max_pages, 1)));
    if (c.page_mass) grow(w.pmax, size_t(std::max(c.max_pages, 1)) * size_t(c.s.page_size));
    if (c.decode_isa != CpuIsa::kPortable) {
      grow(w.slabs, size_t(std::max(c.max_pages, 1)));
      grow(w.page_tokens, size_t(std::max(c.max_pages, 1)));
      grow(w.simd, size_t(cpu::decode_scratch_floats(c.tile_rows)) + 16);
    }
    return w;
  }
};

// ---- one tile: the rows of a few query tokens x a head bundle against their pages ------------

struct Item {
  int32_t b;          // sequence
  int32_t g;          // KV head
  int32_t h0, nh;     // query heads [h0, h0 + nh) of the bundle
  int32_t qblock;     // selection query block (row); 0 when dense
  int32_t tok_begin;  // range in the call's token list
  int32_t tok_count;
  int32_t split;      // KV chunk (decode split-KV), 0 when not split
  int32_t unit;       // index of the (tokens, bundle) unit: its split-KV state slots
};

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

// K and V of the tile's pages as [nk, d] f32 with each key's position; a single compact f32 page
// is read in place, anything else is converted (or gathered) into the scratch buffers.
struct KeyTile {
  const float* k;
  const float* v;
  int nk;
};
KeyTile gather_keys(const Call& c, const Item& it, const int32_t* pages, int n_pages,
                    Scratch& w) {
  const int d = c.s.d;
  int32_t* kpos = w.kpos.data();
  if (n_pages == 1 && c.in_place()) {
    const int64_t o = c.slab(it.b, pages[0], it.g);
    const int nk = c.page_tokens(it.b, pages[0]);
    for (int i = 0; i < nk; ++i) kpos[i] = pages[0] * c.s.page_size + i;
    return {static_cast<const float*>(c.k) + o, static_cast<const float*>(c.v) + o, nk};
  }
  int nk = 0;
  for (int u = 0; u < n_pages; ++u) {
    const int n = c.page_tokens(it.b, pages[u]);
    const int64_t o = c.slab(it.b, pages[u], it.g);
    load_rows(c.k, c.kv_dt, o, n, d, c.s.pages.token, w.kf.data() + int64_t(nk) * d);
    load_rows(c.v, c.kv_dt, o, n, d, c.s.pages.token, w.vf.data() + int64_t(nk) * d);
    for (int i = 0; i < n; ++i) kpos[nk + i] = pages[u] * c.s.page_size + i;
    nk += n;
  }
  return {w.kf.data(), w.vf.data(), nk};
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
  cpu::DecodeRows r;
  r.k = c.k;
  r.v = c.v;
  r.kv = c.kv_dt.bits == 32             ? cpu::KvStorage::kF32
         : c.kv_dt.code == kDLBfloat ? cpu::KvStorage::kBf16
                                     : cpu::KvStorage::kF16;
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
  if (c.decode_isa == CpuIsa::kAvx512Bf16) cpu::decode_rows_avx512_bf16(r);
  else if (c.decode_isa == CpuIsa::kAvx512) cpu::decode_rows_avx512(r);
  else cpu::decode_rows_avx2(r);
#endif
}

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

// ---- page statistics (decode): Σ over a page's tokens of the max over heads of p_h(t) ---------

// Column `column` of page_mass for sequence b, max over the query heads of KV heads
// [g_begin, g_end). Needs every computed row's lse (c.lse_all).
void page_mass_sweep(const Call& c, int32_t b, int32_t g_begin, int32_t g_end, int32_t column,
                     Scratch& w) {
  const int d = c.s.d;
  const int32_t len = c.len(b);
  const int32_t token = c.qo[b];  // decode: one query per sequence
  float* pmax = w.pmax.data();
  std::fill_n(pmax, len, 0.f);
  if (!c.row_mask || c.row_mask[token]) {
    float* qf = w.qf.data();
    float* sc = w.s.data();
    int32_t* pages = w.pages.data();
    for (int32_t g = g_begin; g < g_end; ++g) {
      for (int32_t h = g * c.s.group; h < (g + 1) * c.s.group; ++h) {
        const float lse = c.lse_all[int64_t(token) * c.s.hq + h];
        if (lse == kNegInf) continue;  // attended nothing
        load_run(c.q, c.q_dt, (int64_t(token) * c.s.hq + h) * d, d, c.s.scale, qf);
        const int32_t n = visit_pages(c, b, c.row(b, 0, h), len - 1, pages);
        for (int32_t u = 0; u < n; ++u) {
          const int nt = c.page_tokens(b, pages[u]);
          const int64_t o = c.slab(b, pages[u], g);
          const float* kt = static_cast<const float*>(c.k) + o;
          if (!c.in_place()) {
            load_rows(c.k, c.kv_dt, o, nt, d, c.s.pages.token, w.kf.data());
            kt = w.kf.data();
          }
          score_row(qf, kt, nt, d, sc);
          float* pm = pmax + int64_t(pages[u]) * c.s.page_size;
          for (int i = 0; i < nt; ++i) pm[i] = std::max(pm[i], std::exp(sc[i] - lse));
        }
      }
    }
  }
  for (int32_t p = 0; p < c.pages(b); ++p) {
    const float* pm = pmax + int64_t(p) * c.s.page_size;
    float sum = 0.f;
    for (int i = 0; i < c.page_tokens(b, p); ++i) sum += pm[i];
    c.page_mass[(int64_t(c.kv_indptr[b]) + p) * c.s.stats_h + column] = sum;
  }
}

// ---- one call: checks, binding, planning, execution -------------------------------------------

sieve_status fail(std::string* error, sieve_status st, std::string msg) {
  if (error) *error = std::move(msg);
  return st;
}

// Everything attend_cpu refuses, with the status it returns.
sieve_status validate(const sieve_attention_args& a, std::string* error) {
  if (std::string e = check_attention_args(a); !e.empty())
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT, e);
  if (std::string e = unsupported_attention_request(a); !e.empty())
    return fail(error, SIEVE_ERR_UNSUPPORTED, e);
  if (a.q->device.device_type != kDLCPU)
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT,
                "q: on " + device_name(a.q->device) +
                    ", but the CPU kernel needs every tensor in host memory (kDLCPU)");
  if (std::string e = check_page_table_contents(a, data_ptr<const int32_t>(a.kv->indices));
      !e.empty())
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT, e);
  if (a.selection && a.selection->kind == SIEVE_SEL_BLOCKS) {
    if (std::string e = check_selection_contents(a, data_ptr<const int32_t>(a.selection->indptr),
                                                 data_ptr<const int32_t>(a.selection->indices));
        !e.empty())
      return fail(error, SIEVE_ERR_INVALID_ARGUMENT, e);
  }
  // q_rows in host memory was range-checked by check_attention_args.
  return SIEVE_OK;
}

sieve_status check_isa(CpuIsa isa, std::string* error) {
  if (cpu_isa_available(isa)) return SIEVE_OK;
  return fail(error, SIEVE_ERR_UNSUPPORTED,
              std::string("options.isa: this CPU (or build) has no ") +
                  (isa == CpuIsa::kAvx512Bf16 ? "AVX-512F/BW/BF16 with FMA and F16C"
                   : isa == CpuIsa::kAvx512   ? "AVX-512F/BW with FMA and F16C"
                                              : "AVX2 with FMA and F16C"));
}

// Per-call buffers of the calling thread (reused across calls).
struct CallBuffers {
  std::vector<int64_t> c_b;
  std::vector<uint8_t> mask;
  std::vector<float> lse_all;
  std::vector<float> partials;
  std::vector<int32_t> tokens;  // computed query tokens, grouped by (sequence, query block)
  std::vector<Item> units;      // (tokens, bundle) tiles
  std::vector<Item> items;      // units x KV splits
};

// The decode kernel for `allowed` (validated as available) and the call: the widest allowed that
// takes its dtypes and whose vector width divides its head dim.
CpuIsa decode_isa(CpuIsa allowed, const AttentionShape& s, DLDataType q_dt, DLDataType kv_dt) {
  const int32_t d = s.d;
  const bool bf16 = allowed == CpuIsa::kAvx512Bf16 ||
                    (allowed == CpuIsa::kAuto && cpu_isa_available(CpuIsa::kAvx512Bf16));
  const bool avx512 = bf16 || allowed == CpuIsa::kAvx512 ||
                      (allowed == CpuIsa::kAuto && cpu_isa_available(CpuIsa::kAvx512));
  const bool avx2 = avx512 || allowed == CpuIsa::kAvx2 ||
                    (allowed == CpuIsa::kAuto && cpu_isa_available(CpuIsa::kAvx2));
  const bool all_bf16 = q_dt.code == kDLBfloat && kv_dt.code == kDLBfloat;
  if (bf16 && all_bf16 && d % 32 == 0) return CpuIsa::kAvx512Bf16;
  if (avx512 && d % 16 == 0) return CpuIsa::kAvx512;
  if (avx2 && d % 8 == 0) return CpuIsa::kAvx2;
  return CpuIsa::kPortable;
}

// Points the call at the arguments' memory and sizes its tiles.
void bind(const sieve_attention_args& a, const CpuAttentionOptions& opt, CallBuffers& buf,
          Call& c) {
  const sieve_paged_kv& kv = *a.kv;
  c.s = attention_shape(a);
  const AttentionShape& s = c.s;
  c.q = data_ptr<const void>(*a.q);
  c.q_dt = a.q->dtype;
  c.out = data_ptr<void>(*a.out);
  c.out_dt = a.out->dtype;
  c.k = data_ptr<const void>(kv.k_pages);
  c.v = data_ptr<const void>(kv.v_pages);
  c.kv_dt = kv.k_pages.dtype;
  c.qo = a.qo_indptr_host;
  c.kv_indptr = kv.indptr_host;
  c.kv_last = kv.last_page_len_host;
  c.kv_ids = data_ptr<const int32_t>(kv.indices);
  c.lse = a.lse ? data_ptr<float>(*a.lse) : nullptr;
  if (!s.dense) {
    c.sel_indptr = data_ptr<const int32_t>(a.selection->indptr);
    c.sel_ids = data_ptr<const int32_t>(a.selection->indices);
    buf.c_b.resize(size_t(s.batch) + 1);
    query_block_offsets(c.qo, s.batch, s.q_block, buf.c_b.data());
    c.c_b = buf.c_b.data();
  }
  if (a.q_rows) {
    buf.mask.assign(size_t(s.n_q_tokens), 0);
    const int32_t* rows = data_ptr<const int32_t>(*a.q_rows);
    for (int64_t i = 0; i < s.q_rows; ++i) buf.mask[size_t(rows[i])] = 1;
    c.row_mask = buf.mask.data();
  }
  if (s.stats != SIEVE_STATS_NONE) {
    c.page_mass = data_ptr<float>(*a.page_mass);
    buf.lse_all.assign(size_t(s.n_q_tokens) * s.hq, kNegInf);
    c.lse_all = buf.lse_all.data();
  }
  for (int32_t b = 0; b < s.batch; ++b) c.max_pages = std::max(c.max_pages, c.pages(b));

  const int nh = !s.dense && s.sel_heads == SIEVE_SEL_PER_Q_HEAD ? 1 : s.group;
  c.gemm = opt.use_blas && s.prefill && s.d >= kBlasMinHeadDim;
  c.decode_isa = s.prefill ? CpuIsa::kPortable : decode_isa(opt.isa, s, c.q_dt, c.kv_dt);
  c.prefetch = opt.prefetch;
  c.pages_per_tile = s.prefill ? std::max(1, kTileKeys / s.page_size) : 1;
  const int64_t tile_keys = int64_t(c.pages_per_tile) * s.page_size;
  const int rows_cap =
      int(std::clamp<int64_t>(kGemmMaxWork / (tile_keys * s.d), kBlasMinRows, kMaxTileRows));
  c.tile_rows = (s.prefill ? std::max(1, rows_cap / nh) : 1) * nh;
}

// The work items: each (sequence, query block)'s computed tokens in chunks of at most
// tile_rows / nh, one unit per chunk and head bundle, each unit split n_splits ways.
void plan(Call& c, const CpuAttentionOptions& opt, int threads, CallBuffers& buf) {
  const AttentionShape& s = c.s;
  const int nh = !s.dense && s.sel_heads == SIEVE_SEL_PER_Q_HEAD ? 1 : s.group;
  const int32_t tok_cap = c.tile_rows / nh;
  buf.tokens.clear();
  buf.units.clear();
  for (int32_t b = 0; b < s.batch; ++b) {
    const int32_t n_b = c.qo[b + 1] - c.qo[b];
    const int32_t qb = s.dense ? std::max(n_b, 1) : s.q_block;  // dense: one block per sequence
    for (int32_t t = 0; t < query_blocks(n_b, qb); ++t) {
      auto close_chunk = [&](int32_t begin) {
        const int32_t count = int32_t(buf.tokens.size()) - begin;
        if (count == 0) return;
        for (int32_t g = 0; g < s.hkv; ++g)
          for (int32_t h0 = g * s.group; h0 < (g + 1) * s.group; h0 += nh)
            buf.units.push_back(Item{b, g, h0, nh, s.dense ? 0 : t, begin, count, 0,
                                     int32_t(buf.units.size())});
      };
      int32_t chunk_begin = int32_t(buf.tokens.size());
      for (int32_t i = t * qb; i < std::min((t + 1) * qb, n_b); ++i) {
        const int32_t token = c.qo[b] + i;
        if (c.row_mask && !c.row_mask[token]) continue;
        buf.tokens.push_back(token);
        if (int32_t(buf.tokens.size()) - chunk_begin == tok_cap) {
          close_chunk(chunk_begin);
          chunk_begin = int32_t(buf.tokens.size());
        }
      }
      close_chunk(chunk_begin);
    }
  }

  // Decode with fewer units than threads: split each unit's pages so every thread has work.
  const int64_t n_units = int64_t(buf.units.size());
  c.n_splits = 1;
  if (!s.prefill && n_units > 0) {
    if (opt.kv_splits > 0) {
      c.n_splits = std::min(opt.kv_splits, kMaxSplits);
    } else if (n_units < threads) {
      const int64_t want = (2 * int64_t(threads) + n_units - 1) / n_units;
      c.n_splits = int(std::clamp<int64_t>(std::min<int64_t>(want, c.max_pages / kMinPagesPerSplit),
                                           1, kMaxSplits));
    }
  }
  buf.items.clear();
  for (const Item& u : buf.units)
    for (int32_t sp = 0; sp < c.n_splits; ++sp) {
      buf.items.push_back(u);
      buf.items.back().split = sp;
    }
  if (c.n_splits > 1) {
    buf.partials.resize(size_t(n_units) * size_t(c.n_splits) * size_t(c.partial_floats(nh)));
    c.partials = buf.partials.data();
  }
}

// Runs body(i, scratch) for i < n over `threads` OpenMP threads; false if scratch ran out of
// memory (nothing may throw out of a parallel region).
template <class Body>
bool parallel_for(int64_t n, int threads, const Call& c, Body body) {
  std::atomic<bool> ok{true};
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) {
    try {
      body(i, Scratch::for_call(c));
    } catch (const std::bad_alloc&) {
      ok = false;
    }
  }
  return ok;
}

sieve_status run(const sieve_attention_args& a, const CpuAttentionOptions& opt,
                 std::string* error) {
  if (sieve_status st = validate(a, error); st != SIEVE_OK) return st;
  if (sieve_status st = check_isa(opt.isa, error); st != SIEVE_OK) return st;
#ifdef _OPENMP
  int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  if (opt.threads <= 0) {
    // Small calls (a small model's decode step) run on the calling thread: waking an OpenMP team
    // costs more than the work, and far more when the cores are busy (measured: 44 vs 3400
    // tokens/s for the 5-layer stories260K decode on a loaded 2-core machine).
    const AttentionShape s = attention_shape(a);
    const int64_t per_query = s.nnz_pages * int64_t(s.page_size) * s.d * s.group / std::max(1, s.batch);
    const int64_t work = per_query * int64_t(s.n_q_tokens) * s.hkv;  // ~ multiply-adds of Q K^T
    if (work < (int64_t(1) << 20)) threads = 1;
  }
#else
  const int threads = 1;
#endif
  if (attention_variant(a)) return attend_variant_cpu(a, threads, error);
  static thread_local CallBuffers buf;
  Call c;
  bind(a, opt, buf, c);
  plan(c, opt, threads, buf);

  // `buf` is thread_local: the workers get plain pointers to the calling thread's copy.
  const int32_t* tokens = buf.tokens.data();
  const Item* items = buf.items.data();
  const Item* units = buf.units.data();
  bool ok = parallel_for(int64_t(buf.items.size()), threads, c, [&](int64_t i, Scratch& w) {
    run_item(c, items[i], tokens, w);
  });
  if (ok && c.n_splits > 1)
    ok = parallel_for(int64_t(buf.units.size()), threads, c, [&](int64_t i, Scratch& w) {
      merge_unit(c, units[i], tokens, w);
    });
  if (ok && c.page_mass) {
    const AttentionShape& s = c.s;
    if (s.stats == SIEVE_STATS_PAGE_MASS_PER_KV_HEAD)
      ok = parallel_for(int64_t(s.batch) * s.hkv, threads, c, [&](int64_t i, Scratch& w) {
        const int32_t b = int32_t(i / s.hkv), g = int32_t(i % s.hkv);
        page_mass_sweep(c, b, g, g + 1, g, w);
      });
    else
      ok = parallel_for(s.batch, threads, c, [&](int64_t b, Scratch& w) {
        page_mass_sweep(c, int32_t(b), 0, s.hkv, 0, w);
      });
  }
  if (!ok) return fail(error, SIEVE_ERR_OUT_OF_MEMORY, "attend_cpu: out of host memory for scratch");
  return SIEVE_OK;
}

}  // namespace

bool cpu_isa_available(CpuIsa isa) {
#ifdef SIEVE_X86_DECODE
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c");
  static const bool avx512 =
      avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  static const bool avx512_bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  if (isa == CpuIsa::kAvx512Bf16) return avx512_bf16;
  if (isa == CpuIsa::kAvx2) return avx2;
  if (isa == CpuIsa::kAvx512) return avx512;
#else
  if (isa == CpuIsa::kAvx2 || isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Bf16) return false;
#endif
  return true;
}

sieve_status attend_cpu(const sieve_attention_args& args, const CpuAttentionOptions& options,
                        std::string* error) {
  try {
    return run(args, options, error);
  } catch (const std::bad_alloc&) {
    return fail(error, SIEVE_ERR_OUT_OF_MEMORY, "attend_cpu: out of host memory");
  } catch (const std::exception& e) {
    return fail(error, SIEVE_ERR_INTERNAL, std::string("attend_cpu: ") + e.what());
  }
}

sieve_status attend_cpu(const sieve_attention_args& args, std::string* error) {
  return attend_cpu(args, CpuAttentionOptions{}, error);
}

}  // namespace sieve::kernels
