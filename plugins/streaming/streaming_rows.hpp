// The page list of one StreamingLLM selection row, as a closed-form function of the sequence's
// length, its number of new queries and the row's query block. Shared verbatim by the CPU path
// and the CUDA kernel, so both produce the same lists by construction.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define SIEVE_STREAMING_HD __host__ __device__ __forceinline__
#else
#define SIEVE_STREAMING_HD inline
#endif

namespace sieve::streaming {

// Pages [0, sink_end) and [window_begin, window_end), with sink_end <= window_begin <= window_end
// (when the sink and the window overlap or touch, window_begin is clamped to sink_end, so no page
// is listed twice and the list is strictly increasing).
struct RowPages {
  int32_t sink_end;
  int32_t window_begin;
  int32_t window_end;
  SIEVE_STREAMING_HD int32_t count() const { return sink_end + (window_end - window_begin); }
  // The j-th page of the row's list (0 <= j < count()).
  SIEVE_STREAMING_HD int32_t page(int32_t j) const {
    return j < sink_end ? j : window_begin + (j - sink_end);
  }
};

// Queries at token positions [first, last] (0-based, last < resident tokens): each attends the
// first `sink` tokens and the `window` tokens ending at itself; the row lists every page holding
// any of them for any of the queries.
SIEVE_STREAMING_HD RowPages row_pages(int64_t first, int64_t last, int64_t sink, int64_t window,
                                      int32_t page_size) {
  if (last < 0 || first > last) return {0, 0, 0};
  const int64_t sink_tokens = sink < last + 1 ? sink : last + 1;
  const int64_t window_first = first - window + 1 > 0 ? first - window + 1 : 0;
  const int32_t sink_end = int32_t((sink_tokens + page_size - 1) / page_size);
  int32_t window_begin = int32_t(window_first / page_size);
  const int32_t window_end = int32_t(last / page_size + 1);
  if (window_begin < sink_end) window_begin = sink_end;
  return {sink_end, window_begin, window_end};
}

// Query blocks of a sequence with `n_new` queries (attention.h: ceil(n_new / q_block)).
SIEVE_STREAMING_HD int32_t query_blocks(int64_t n_new, int32_t q_block) {
  return n_new > 0 ? int32_t((n_new + q_block - 1) / q_block) : 0;
}

// Row of query block t of a sequence with `kv_len` resident tokens whose last `n_new` are its
// queries (attention.h: query i sits at position kv_len - n_new + i).
SIEVE_STREAMING_HD RowPages block_pages(int64_t kv_len, int64_t n_new, int32_t q_block, int64_t t,
                                        int64_t sink, int64_t window, int32_t page_size) {
  const int64_t q_first = t * q_block;
  const int64_t q_end = q_first + q_block < n_new ? q_first + q_block : n_new;
  const int64_t base = kv_len - n_new;
  return row_pages(base + q_first, base + q_end - 1, sink, window, page_size);
}

// Resident tokens of a sequence from its page-table row.
SIEVE_STREAMING_HD int64_t resident_tokens(int32_t n_pages, int32_t last_page_len,
                                           int32_t page_size) {
  return n_pages > 0 ? int64_t(n_pages - 1) * page_size + last_page_len : 0;
}

}  // namespace sieve::streaming
