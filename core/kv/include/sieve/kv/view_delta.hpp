// How one layer's view changes from the previous view of that layer, and how the new page ids
// are merged from the previous ones.
//
// From one decode step to the next a view's page table barely moves: every last_page_len does,
// and a sequence whose last page filled gains one page; its earlier pages stay where they were
// (appends only push pages at the end of a sequence's list; only evict and remove_sequence take
// pages out, and those force a full rebuild, see PagedStoreBase::view). So the store describes
// the new table against the previous one in a small packed array, O(batch + pages added), and
// the page ids are merged where the table lives: on the host by the CPU store (`apply`, a copy
// per sequence), by a kernel in the CUDA store (`merged_page`, one entry per thread); the tests
// hold the two to the same result.
//
// The packed array (int32, contiguous so that a device store uploads it in one copy), B = batch:
//   [0, B+1)          indptr of the new view
//   [B+1, 2B+1)       last_page_len of the new view
//   [2B+1, 3B+1)      keep_from[b]: where sequence b's pages start in the previous indices
//   [3B+1, 4B+1)      keep[b]: how many leading pages sequence b keeps from the previous view
//   [4B+1, 5B+2)      added_indptr: CSR over `added`, per sequence
//   [5B+2, 5B+2+A)    added: the pages that follow the kept ones, in token order
// A full rebuild is the same array with keep[b] = 0 and every page in `added`.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define SIEVE_KV_HD __host__ __device__
#else
#define SIEVE_KV_HD
#endif

namespace sieve::kv {

enum class ViewChange {
  kNone,         // the table is the previous one: nothing to publish
  kLastPageLen,  // same pages, last_page_len moved: only that slice changed
  kPages,        // pages added (or a full rebuild): merge the indices, publish the whole array
};

struct ViewDelta {
  ViewChange change = ViewChange::kNone;
  int32_t batch = 0;
  int32_t nnz = 0;                 // pages in the new view
  const int32_t* packed = nullptr; // the layout above, packed_size(batch, n_added) entries
  int32_t n_added = 0;

  static constexpr size_t header_size(int32_t batch) { return 5 * size_t(batch) + 2; }
  static constexpr size_t packed_size(int32_t batch, int32_t n_added) {
    return header_size(batch) + size_t(n_added);
  }
  static constexpr size_t last_at(int32_t batch) { return size_t(batch) + 1; }
};

// Entry i (0 <= i < nnz) of the new view's indices, from the packed array and the previous
// view's indices (read only for kept pages, so it may be null when nothing is kept).
SIEVE_KV_HD inline int32_t merged_page(const int32_t* packed, int32_t batch, const int32_t* previous,
                                       int32_t i) {
  const int32_t* indptr = packed;
  const int32_t* keep_from = packed + 2 * batch + 1;
  const int32_t* keep = packed + 3 * batch + 1;
  const int32_t* added_indptr = packed + 4 * batch + 1;
  const int32_t* added = packed + 5 * batch + 2;
  // The sequence owning entry i: the last b with indptr[b] <= i (empty sequences are skipped
  // because their successor has the same indptr).
  int32_t lo = 0, hi = batch;
  while (hi - lo > 1) {
    const int32_t mid = lo + (hi - lo) / 2;
    if (indptr[mid] <= i) lo = mid;
    else hi = mid;
  }
  const int32_t k = i - indptr[lo];
  return k < keep[lo] ? previous[keep_from[lo] + k] : added[added_indptr[lo] + (k - keep[lo])];
}

// All nnz entries of the new indices into `out`, sequence by sequence (host).
inline void apply_view_delta(const int32_t* packed, int32_t batch, const int32_t* previous, int32_t* out) {
  const int32_t* indptr = packed;
  const int32_t* keep_from = packed + 2 * batch + 1;
  const int32_t* keep = packed + 3 * batch + 1;
  const int32_t* added_indptr = packed + 4 * batch + 1;
  const int32_t* added = packed + 5 * batch + 2;
  for (int32_t b = 0; b < batch; ++b) {
    int32_t* dst = out + indptr[b];
    if (keep[b] > 0) std::memcpy(dst, previous + keep_from[b], size_t(keep[b]) * sizeof(int32_t));
    const int32_t n_added = added_indptr[b + 1] - added_indptr[b];
    if (n_added > 0) std::memcpy(dst + keep[b], added + added_indptr[b], size_t(n_added) * sizeof(int32_t));
  }
}

}  // namespace sieve::kv
