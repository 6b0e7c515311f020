// CPU top-k (top_k.hpp): candidates = middle items with a finite score, partially ordered by
// (order_key desc, index asc) — a strict total order, so the chosen set is unique and equals the
// CUDA batch's (which finds the same k-th key by radix select and takes ties by index). The
// partial order runs on packed 64-bit keys in a per-thread buffer (no allocation once grown).
#include "sieve/selection/top_k.hpp"

#include <algorithm>
#include <functional>
#include <vector>

namespace sieve::selection {

int32_t top_k_row(TopKRow row, const float* scores, int64_t stride, int32_t* out,
                  int32_t* scratch) {
  const ClippedRow c = clip(row);
  if (c.keeps_all()) {
    for (int32_t j = 0; j < c.n; ++j) out[j] = j;
    return c.n;
  }
  // Each candidate as one integer: order_key in the high half, ~index in the low half, so a
  // larger integer is a better (score, index) pair in the same strict order as ranking by key
  // then lower index (the same chosen set), compared without reloading or re-keying the scores.
  thread_local std::vector<uint64_t> keys;  // grown once per thread, then reused
  if (keys.size() < size_t(c.n)) keys.resize(size_t(c.n));
  int32_t m = 0;
  for (int32_t j = c.middle_begin(); j < c.middle_end(); ++j)
    if (const uint32_t k = order_key(scores[j * stride]); k != 0u)
      keys[size_t(m++)] = uint64_t(k) << 32 | uint64_t(~uint32_t(j));
  const int32_t take = std::min(m, c.k);
  if (take < m) std::nth_element(keys.begin(), keys.begin() + take, keys.begin() + m, std::greater<>());
  for (int32_t i = 0; i < take; ++i) scratch[i] = int32_t(~uint32_t(keys[size_t(i)]));
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
    const ClippedRow c = clip({b.seg_indptr[s + 1] - b.seg_indptr[s], b.head, b.tail, b.k});
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
    for (int32_t h = 0; h < H; ++h) {
      w += top_k_row({n, b.head, b.tail, b.k},
                     b.scores + int64_t(b.seg_indptr[s]) * b.layout.item_stride +
                         h * b.layout.head_stride,
                     b.layout.item_stride, indices + w, scratch);
      indptr[++r] = int32_t(w);
    }
  }
  return w;
}

}  // namespace sieve::selection
