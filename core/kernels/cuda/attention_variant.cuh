// What the two attention-variant kernels share (attention_variant.cu, attention_variant_mma.cu):
// a CTA's variant row, its spans read and checked, and one span item resolved to a key position,
// physical page and log2-domain bias. Internal to core/kernels/cuda.
#pragma once
#include "attention_cuda_common.cuh"
#include "sieve/attention.h"

namespace sieve::kernels::cuda {

// The query tokens of a CTA of a variant grid: [q0, q1) of sequence b, inside one row block.
struct VariantTile {
  int32_t qo0, n_q, q0, q1, page_base, n_pages, kv_len, first_pos;
  int64_t row;  // the variant row every token of the tile reads (head h0's row head)
};
// Warp-uniform in every warp (query_block_offset reduces across the warp).
__device__ inline VariantTile variant_tile(const AttnParams& p, int32_t b, int32_t tile, int32_t tile_tokens,
                                           int32_t h0) {
  VariantTile t;
  t.qo0 = __ldg(p.qo_indptr + b);
  t.n_q = __ldg(p.qo_indptr + b + 1) - t.qo0;
  const int32_t qb = p.var_q_block, per_block = ceil_div_d(min(qb, max(t.n_q, 1)), tile_tokens);
  const int32_t block = tile / per_block;
  t.q0 = int32_t(min(int64_t(block) * qb + int64_t(tile % per_block) * tile_tokens, int64_t(INT32_MAX)));
  t.q1 = int32_t(min(min(int64_t(t.q0) + tile_tokens, int64_t(block + 1) * qb), int64_t(t.n_q)));
  t.page_base = __ldg(p.kv_indptr + b);
  t.n_pages = __ldg(p.kv_indptr + b + 1) - t.page_base;
  t.kv_len = t.n_pages > 0 ? (t.n_pages - 1) * p.page_size + __ldg(p.kv_last + b) : 0;
  t.first_pos = t.kv_len - t.n_q;
  const int32_t rh = p.var_heads == 0 ? 0 : p.var_heads == 1 ? h0 / p.group : h0;
  t.row = t.q0 < t.q1 ? (query_block_offset(p.qo_indptr, b, qb) + block) * p.var_h + rh : -1;
  return t;
}
// Tiles of sequence b's grid row: query blocks x tiles per block.
__host__ __device__ inline int32_t variant_tiles(int32_t n_q, int32_t q_block, int32_t tile_tokens) {
  if (n_q <= 0) return 0;
  const int32_t qb = q_block < n_q ? q_block : n_q;
  return ((n_q + q_block - 1) / q_block) * ((qb + tile_tokens - 1) / tile_tokens);
}

// Row `row`'s span range [s0, s1), empty (recorded) when outside the spans.
__device__ inline void variant_row_spans(const AttnParams& p, int64_t row, int32_t& s0, int32_t& s1) {
  s0 = __ldg(p.row_spans + 2 * row);
  s1 = __ldg(p.row_spans + 2 * row + 1);
  if (s0 < 0 || s1 < s0 || s1 > p.n_spans) {
    record_error(p.err, kErrVariantRow, row, s0, s1, p.n_spans);
    s0 = s1 = 0;
  }
}

// Span i of a row: KEYS [begin, end) clipped to the keys the tile may see (< limit), PACKED
// entries [begin, end); an empty range (recorded) when malformed.
struct Span {
  int32_t packed, begin, end;
};
__device__ inline Span variant_span(const AttnParams& p, int64_t row, int32_t i, int32_t limit) {
  Span s{__ldg(p.spans + 3 * i), __ldg(p.spans + 3 * i + 1), __ldg(p.spans + 3 * i + 2)};
  const bool ok = (s.packed == SIEVE_SPAN_KEYS || s.packed == SIEVE_SPAN_PACKED) && s.begin >= 0 &&
                  s.end >= s.begin && (s.packed == SIEVE_SPAN_KEYS || s.end <= p.n_packed);
  if (!ok) {
    record_error(p.err, kErrVariantSpan, row, i, s.begin, s.end);
    s.begin = s.end = 0;
  }
  if (s.packed == SIEVE_SPAN_KEYS) s.end = max(s.begin, min(s.end, limit));
  return s;
}

// Item `it` of span s: its key position (INT32_MAX: none), the element offset of its K/V row
// (-1: none), its log2-domain bias (count included) and its count (1 for a key that stands for
// itself). Packed keys past `limit` (no query of the tile sees them) are none.
struct SpanItem {
  int32_t pos;
  int32_t count;
  int64_t off;
  float lbias;
};
__device__ inline SpanItem variant_item(const AttnParams& p, const Span& s, int32_t it, int32_t b,
                                        const VariantTile& t, int32_t kvh, int32_t limit) {
  SpanItem r{INT32_MAX, 1, -1, 0.f};
  const int32_t i = s.begin + it;
  if (i >= s.end) return r;
  int32_t k = i;
  if (s.packed) {
    k = __ldg(p.packed_pos + i);
    const int32_t c = p.packed_count ? __ldg(p.packed_count + i) : 1;
    if (k < 0 || k >= t.kv_len || c < 1) {
      record_error(p.err, kErrPackedKey, t.row, i, k < 0 || k >= t.kv_len ? k : c, t.kv_len);
      return r;
    }
    if (k >= limit) return r;
    r.count = c;
    r.lbias = (p.packed_bias ? __ldg(p.packed_bias + i) * kLog2e : 0.f) + log2f(float(c));
  }
  const int32_t page = p.page_shift >= 0 ? k >> p.page_shift : k / p.page_size;
  const int32_t phys = physical_page(p, b, t.page_base, page);
  if (phys < 0) return r;
  r.pos = k;
  r.off = p.pages.row(phys, kvh, k - page * p.page_size);
  return r;
}

// The log2-domain bias of an item for a query at qpos >= its position: a packed key stands for at
// most the qpos - k + 1 keys the query sees (the causal clip of the count weighting); `bias_only`
// is its bias without the count.
__device__ __forceinline__ float clipped_lbias(int32_t qpos, int32_t kpos, int32_t count, float lbias,
                                               float bias_only) {
  const int32_t seen = qpos - kpos + 1;
  return count <= seen ? lbias : bias_only + log2f(float(seen));
}

}  // namespace sieve::kernels::cuda
