// The page budget of one DELTA selection row as a closed-form function of the sequence's length,
// shared verbatim by the CPU path and the CUDA kernels so both plan the same rows.
//
// A sequence of `len` tokens has n = ceil(len / P) pages. Its recency window is the last
// `recent` tokens; the pages holding them are the last `window` pages, where
//   window = n - floor(max(0, len - recent) / P)
// which is the paper's ceil(recent / P) when the last page is full, and can be one page more when
// the window straddles a page boundary (the window is kept exactly, whatever the alignment).
// The row keeps those pages and the `budget_pages - window` best earlier pages by S_u, so it
// attends exactly budget_pages pages once the sequence outgrows the budget, and every page before
// (n <= budget_pages: dense).
#pragma once
#include <cstdint>

#include "sieve/util/host_device.hpp"

namespace sieve::delta {

struct RowPlan {
  int32_t n;       // pages of the sequence
  int32_t window;  // last pages always kept (they hold the last `recent` tokens)
  int32_t k;       // best earlier pages kept by score
  // Pages the row lists (when every score is finite).
  SIEVE_HD int32_t count() const { return n <= window + k ? n : window + k; }
};

SIEVE_HD int32_t ceil_pages(int64_t tokens, int32_t page_size) {
  return tokens > 0 ? int32_t((tokens + page_size - 1) / page_size) : 0;
}

// The paper's ceil(recent / P): the window in pages when the last page is full.
SIEVE_HD int32_t aligned_window_pages(int64_t recent, int32_t page_size) {
  return ceil_pages(recent, page_size);
}

// The most pages the last `recent` tokens can touch (last page holding a single token).
SIEVE_HD int32_t max_window_pages(int64_t recent, int32_t page_size) {
  return recent <= 1 ? 1 : ceil_pages(recent - 1, page_size) + 1;
}

SIEVE_HD RowPlan plan_row(int64_t len, int64_t recent, int32_t budget_pages,
                                int32_t page_size) {
  RowPlan r{};
  r.n = ceil_pages(len, page_size);
  const int64_t first_recent = len > recent ? len - recent : 0;
  r.window = r.n - int32_t(first_recent / page_size);
  r.k = budget_pages > r.window ? budget_pages - r.window : 0;
  return r;
}

// Tokens of a sequence from its page-table row.
SIEVE_HD int64_t resident_tokens(int32_t n_pages, int32_t last_page_len, int32_t page_size) {
  return n_pages > 0 ? int64_t(n_pages - 1) * page_size + last_page_len : 0;
}

}  // namespace sieve::delta
