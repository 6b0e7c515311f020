// CPU top-k (top_k.hpp): candidates = middle items with a finite score, partially ordered by
// (order_key desc, index asc) — a strict total order, so the chosen set is unique and equals the
// CUDA batch's (which finds the same k-th key by radix select and takes ties by index). The
// partial order runs on packed 64-bit keys in a per-thread buffer (no allocation once grown).
#include "sieve/selection/top_k.hpp"

#include <algorithm>
#include <functional>
#include <new>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

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
    const ClippedRow c = clip({b.seg_indptr[s + 1] - b.seg_indptr[s], b.head,
                               segment_tail(b.seg_tail, s, b.tail), b.k});
    const int64_t per_row = c.keeps_all() ? c.n : int64_t(c.head) + c.tail + c.k;
    total += per_row * b.rows_per_segment;
  }
  return total;
}

namespace {
// Rows go to OpenMP threads from this many scored items in the batch (below it a team costs more
// than the rows: Quest at 4K tokens x batch 4 x 8 heads has 8192).
constexpr int64_t kThreadedItems = int64_t(1) << 15;
}  // namespace

int64_t top_k_batch_cpu(const TopKBatch& b, int32_t* indptr, int32_t* indices, int32_t* scratch) {
  const int32_t H = b.rows_per_segment;
  const int64_t rows = int64_t(b.n_segments) * H;
  auto row_of = [&](int64_t r) {
    const int32_t s = int32_t(r / H);
    return TopKRow{b.seg_indptr[s + 1] - b.seg_indptr[s], b.head, segment_tail(b.seg_tail, s, b.tail), b.k};
  };
  auto scores_of = [&](int64_t r) {
    return b.scores + int64_t(b.seg_indptr[r / H]) * b.layout.item_stride + (r % H) * b.layout.head_stride;
  };
  indptr[0] = 0;
  bool threads = false;
#ifdef _OPENMP
  threads = rows > 1 && int64_t(b.seg_indptr[b.n_segments] - b.seg_indptr[0]) * H >= kThreadedItems &&
            omp_get_max_threads() > 1;
#endif
  if (!threads) {
    int64_t w = 0;
    for (int64_t r = 0; r < rows; ++r) {
      w += top_k_row(row_of(r), scores_of(r), b.layout.item_stride, indices + w, scratch);
      indptr[r + 1] = int32_t(w);
    }
    return w;
  }
  // Each row's count first (kept_count of its finite middle items), so that every row knows
  // where its entries go; then the rows on threads, each writing only its own entries (the same
  // bits as one by one).
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const ClippedRow c = clip(row_of(r));
    const float* sc = scores_of(r);
    int32_t finite = 0;
    if (!c.keeps_all())
      for (int32_t j = c.middle_begin(); j < c.middle_end(); ++j)
        finite += order_key(sc[j * b.layout.item_stride]) != 0u;
    indptr[r + 1] = kept_count(c, finite);
  }
  for (int64_t r = 0; r < rows; ++r) indptr[r + 1] += indptr[r];
  bool out_of_memory = false;  // a thread's buffers could not grow: rethrown on this thread
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t r = 0; r < rows; ++r) {
    try {
      thread_local std::vector<int32_t> row_scratch;  // grown once per thread, then reused
      const TopKRow row = row_of(r);
      if (row_scratch.size() < size_t(row.n) + 1) row_scratch.resize(size_t(row.n) + 1);
      top_k_row(row, scores_of(r), b.layout.item_stride, indices + indptr[r], row_scratch.data());
    } catch (const std::bad_alloc&) {
#pragma omp atomic write
      out_of_memory = true;
    }
  }
  if (out_of_memory) throw std::bad_alloc();
  return indptr[rows];
}

}  // namespace sieve::selection
