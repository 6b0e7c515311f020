// The CPU attention kernel's view of one call (private to core/kernels/cpu): the arguments bound
// to plain pointers (plan.cpp), the work items it is cut into, each thread's scratch, and the
// stages run over the items (tile.cpp: attention; page_stats.cpp: the statistics sweep).
#pragma once
#include <dlpack/dlpack.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/kernels/attention_cpu.hpp"

namespace sieve::kernels::cpu {

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
// The SIMD prefill kernel's rows per tile: each key tile it gathers (and widens) serves this many
// rows; q, accumulators, scores, keys and values of a tile (~420 KiB at head dim 128) stay in L2.
constexpr int kSimdTileRows = 256;

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
  CpuIsa prefill_isa = CpuIsa::kPortable;  // prefill tiles: SIMD kernel (prefill_rows.hpp), or
                                           // BLAS / loops
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
inline int32_t visit_pages(const Call& c, int32_t b, int64_t row, int32_t max_pos, int32_t* pages) {
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

// ---- the work items: the rows of a few query tokens x a head bundle against their pages ------

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

// ---- per-thread scratch (grows to the call's sizes, then is reused: no per-page allocation) ---

template <class T>
inline void grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

struct Scratch {
  std::vector<float> qf, acc, m, l, s, kf, vf, row, pmax;
  std::vector<float> kt, alpha;  // the SIMD prefill tile's transposed keys, rescale factors
  std::vector<int32_t> pages, kpos, qpos, lim, page_tokens;
  std::vector<int64_t> slabs;
  std::vector<float> simd;  // the SIMD decode kernel's scratch, 64-byte aligned inside

  float* simd_scratch() {
    const uintptr_t p = reinterpret_cast<uintptr_t>(simd.data());
    return reinterpret_cast<float*>((p + 63) & ~uintptr_t(63));
  }

  // Sizes every buffer for the call (a no-op once a thread has seen a call this large).
  static Scratch& for_call(const Call& c);
};

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

// ---- the stages (items run in parallel; see attention_cpu.cpp) --------------------------------

// Points the call at the arguments' memory and sizes its tiles (plan.cpp).
void bind(const sieve_attention_args& a, const CpuAttentionOptions& opt, CallBuffers& buf,
          Call& c);
// The work items: each (sequence, query block)'s computed tokens in chunks of at most
// tile_rows / nh, one unit per chunk and head bundle, each unit split n_splits ways (plan.cpp).
void plan(Call& c, const CpuAttentionOptions& opt, int threads, CallBuffers& buf);
// One item's attention: its output rows, or its split's partial state (tile.cpp).
void run_item(const Call& c, const Item& it, const int32_t* tokens, Scratch& w);
// Merges the split-KV states of one unit (decode: one token) by their log-sum-exp (tile.cpp).
void merge_unit(const Call& c, const Item& unit, const int32_t* tokens, Scratch& w);
// Column `column` of page_mass for sequence b's logical pages [p_begin, p_end), max over the
// query heads of KV heads [g_begin, g_end). Needs every computed row's lse (c.lse_all)
// (page_stats.cpp). A page's value depends on that page alone: any split of the pages gives
// the same bits.
void page_mass_sweep(const Call& c, int32_t b, int32_t g_begin, int32_t g_end, int32_t column,
                     int32_t p_begin, int32_t p_end, Scratch& w);

}  // namespace sieve::kernels::cpu
