// CPU top-k (top_k.hpp): candidates = middle items with a finite score, partially ordered by
// (order_key desc, index asc) — a strict total order, so the chosen set is unique and equals the
// CUDA batch's (which finds the same k-th key by radix select and takes ties by index).
#include "sieve/selection/top_k.hpp"

#include <algorithm>

namespace sieve::selection {

int32_t top_k_row(TopKRow row, const float* scores, int64_t stride, int32_t* out,
                  int32_t* scratch) {
  const ClippedRow c = clip(row);
  if (c.keeps_all()) {
    for (int32_t j = 0; j < c.n; ++j) out[j] = j;
    return c.n;
  }
  int32_t m = 0;
  for (int32_t j = c.middle_begin(); j < c.middle_end(); ++j)
    if (order_key(scores[j * stride]) != 0u) scratch[m++] = j;
  const int32_t take = std::min(m, c.k);
  if (take < m) {
    auto better = [&](int32_t a, int32_t b) {
      const uint32_t ka = order_key(scores[a * stride]), kb = order_key(scores[b * stride]);
      return ka != kb ? ka > kb : a < b;
    };
    std::nth_element(scratch, scratch + take, scratch + m, better);
  }
  std::sort(scratch, scratch + take);
  int32_t w = 0;
  for (int32_t j = 0; j < c.head; ++j) out[w++] = j;
  for (int32_t i = 0; i < take; ++i) out[w++] = scratch[i];
  for (int32_t j = c.middle_end(); j < c.n; ++j) out[w++] = j;
  return w;
}

int64_t top_k_capacity_needed(const TopKBatch& b) {
  int64_t total = 0;
  for (int32_t s = 0; s < b.n_segments; ++s) {
    const ClippedRow c = clip({b.seg_indptr[s + 1] - b.seg_indptr[s], b.head,
                               segment_tail(b.seg_tail, s, b.tail), b.k});
    const int64_t per_row = c.keeps_all() ? c.n : int64_t(c.head) + c.tail + c.k;
    total += per_row * b.rows_per_segment;
  }
  return total;
}

int64_t top_k_batch_cpu(const TopKBatch& b, int32_t* indptr, int32_t* indices, int32_t* scratch) {
  const int32_t H = b.rows_per_segment;
  int64_t w = 0;
  int32_t r = 0;
  indptr[0] = 0;
  for (int32_t s = 0; s < b.n_segments; ++s) {
    const int32_t n = b.seg_indptr[s + 1] - b.seg_indptr[s];
    const int32_t tail = segment_tail(b.seg_tail, s, b.tail);
    for (int32_t h = 0; h < H; ++h) {
      w += top_k_row({n, b.head, tail, b.k},
                     b.scores + int64_t(b.seg_indptr[s]) * b.layout.item_stride +
                         h * b.layout.head_stride,
                     b.layout.item_stride, indices + w, scratch);
      indptr[++r] = int32_t(w);
    }
  }
  return w;
}

}  // namespace sieve::selection
