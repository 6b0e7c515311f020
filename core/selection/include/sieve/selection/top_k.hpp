// Per-row top-k with forced head/tail items and deterministic ties — the selection step of the
// score-then-select policies (Quest, RaaS's top_ratio, ...). The CPU functions here and the CUDA
// batch in top_k_cuda.hpp choose the same items bit for bit: both rank by order_key() (below) and
// break ties by index.
//
// A row has items [0, n). It always keeps [0, head) and [n - tail, n) (the "forced" items, clipped
// to the row), and the k best of the middle [head, n - tail) by score: higher score first, equal
// scores -> lower index first. An item scored -inf or NaN is never picked by the top-k part (so a
// row may keep fewer than head + tail + k). When n <= head + tail + k the row keeps all n items
// (the dense case, whatever the scores). The kept indices are written in ascending order (a
// selection row must be strictly increasing).
#pragma once
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SIEVE_SELECTION_HD __host__ __device__ __forceinline__
#else
#define SIEVE_SELECTION_HD inline
#endif

namespace sieve::selection {

struct TopKRow {
  int32_t n;     // items of the row
  int32_t head;  // first items always kept
  int32_t tail;  // last items always kept
  int32_t k;     // best middle items kept
};

// The forced prefix/suffix of a row, clipped so they never overlap or exceed n.
struct ClippedRow {
  int32_t n, head, tail, k;
  SIEVE_SELECTION_HD bool keeps_all() const { return int64_t(n) <= int64_t(head) + tail + k; }
  SIEVE_SELECTION_HD int32_t middle_begin() const { return head; }
  SIEVE_SELECTION_HD int32_t middle_end() const { return n - tail; }
};
SIEVE_SELECTION_HD ClippedRow clip(TopKRow r) {
  ClippedRow c{};
  c.n = r.n > 0 ? r.n : 0;
  c.head = r.head < 0 ? 0 : (r.head > c.n ? c.n : r.head);
  c.tail = r.tail < 0 ? 0 : (r.tail > c.n - c.head ? c.n - c.head : r.tail);
  c.k = r.k < 0 ? 0 : r.k;
  return c;
}

// A total order on scores as an unsigned key: larger key = better score. -inf and NaN map to 0
// (never picked); -0 and +0 share a key. Both CPU and CUDA rank by this key, so they agree
// exactly (no float comparison subtleties).
SIEVE_SELECTION_HD uint32_t order_key(float score) {
  if (score != score) return 0u;  // NaN
  if (score == 0.0f) score = 0.0f;  // -0 -> +0
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(score);
#else
  std::memcpy(&u, &score, sizeof(u));
#endif
  if (u == 0xff800000u) return 0u;  // -inf
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// Items a row keeps, given how many of its middle items have a finite score (order_key > 0).
SIEVE_SELECTION_HD int32_t kept_count(const ClippedRow& c, int32_t finite_middle) {
  if (c.keeps_all()) return c.n;
  return c.head + c.tail + (finite_middle < c.k ? finite_middle : c.k);
}

// One row on the CPU: item j is scored scores[j * stride]. `out` receives the kept indices in
// ascending order (room for min(n, head + tail + k)); `scratch` holds at least n int32. Returns
// the number written. No allocation once the calling thread's key buffer (8 bytes per item) has
// grown to its longest row (std::bad_alloc if it cannot).
int32_t top_k_row(TopKRow row, const float* scores, int64_t stride, int32_t* out, int32_t* scratch);

// ---- Batched rows, the layout the CUDA version shares -------------------------------------
// Rows come in segments (e.g. the pages of one sequence) with H rows per segment (e.g. query
// heads): row r = s * H + h has n = seg_indptr[s + 1] - seg_indptr[s] items, and item j of it is
// scored scores[(seg_indptr[s] + j) * item_stride + h * head_stride] — a score array laid out
// like the page table with a head dimension: [nnz, H] (item_stride H, head_stride 1) or
// [H, nnz] (item_stride 1, head_stride nnz; what the CUDA bound writes: rows read contiguously).
struct ScoreLayout {
  int64_t item_stride;
  int64_t head_stride;
};
struct TopKBatch {
  const float* scores;
  ScoreLayout layout;
  const int32_t* seg_indptr;  // [n_segments + 1]
  int32_t n_segments;
  int32_t rows_per_segment;   // H
  int32_t head, tail, k;      // the same for every row
  // Optional [n_segments]: the rows of segment s keep their last seg_tail[s] items instead of
  // `tail` (e.g. raas's prompt Quest: the last prompt page and every decode page after it).
  const int32_t* seg_tail = nullptr;
};

// The forced tail of segment s's rows: seg_tail[s] when given, else the batch's tail.
SIEVE_SELECTION_HD int32_t segment_tail(const int32_t* seg_tail, int32_t s, int32_t tail) {
  return seg_tail ? seg_tail[s] : tail;
}

// Upper bound of the entries the batch writes (host side, from the segment sizes).
int64_t top_k_capacity_needed(const TopKBatch& b);

// CPU: write the batch as a CSR selection (indptr [n_rows + 1], indices). `scratch` holds at
// least max segment size int32. Returns the entries written; checks nothing. Rows run on OpenMP
// threads in batches of 2^15 scored items or more (the same entries). Throws only std::bad_alloc
// (a thread's key or row buffer could not grow; top_k_row's the same).
int64_t top_k_batch_cpu(const TopKBatch& b, int32_t* indptr, int32_t* indices, int32_t* scratch);

}  // namespace sieve::selection
