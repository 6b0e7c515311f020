// An independent, deliberately naive StreamingLLM reference for the streaming plugin's tests:
// token by token, every query at position p attends token j < min(sink, p + 1) and every token
// j in (p - window, p]; a row lists the pages (j / page_size) of every token its queries attend.
#pragma once
#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

namespace sieve::testing {

struct StreamingCase {
  int32_t kv_len;  // resident tokens, the new ones included
  int32_t n_new;   // query tokens of this call (the last n_new of the sequence)
};

inline std::vector<int32_t> streaming_reference_row(int64_t kv_len, int64_t n_new, int32_t q_block,
                                                    int64_t block, int64_t sink, int64_t window,
                                                    int32_t page_size) {
  std::set<int32_t> pages;
  for (int64_t i = block * q_block; i < std::min((block + 1) * q_block, n_new); ++i) {
    const int64_t pos = kv_len - n_new + i;
    for (int64_t tok = 0; tok <= pos; ++tok)
      if (tok < sink || tok > pos - window) pages.insert(int32_t(tok / page_size));
  }
  return {pages.begin(), pages.end()};
}

// Every row of a call, in selection row order (sequence-major, then query block).
inline std::vector<std::vector<int32_t>> streaming_reference(const std::vector<StreamingCase>& seqs,
                                                             bool decode, int64_t sink,
                                                             int64_t window, int32_t page_size) {
  const int32_t q_block = decode ? 1 : page_size;
  std::vector<std::vector<int32_t>> rows;
  for (const StreamingCase& c : seqs)
    for (int64_t t = 0; t * q_block < c.n_new; ++t)
      rows.push_back(streaming_reference_row(c.kv_len, c.n_new, q_block, t, sink, window, page_size));
  return rows;
}

inline int64_t total_entries(const std::vector<std::vector<int32_t>>& rows) {
  int64_t n = 0;
  for (const auto& r : rows) n += int64_t(r.size());
  return n;
}

}  // namespace sieve::testing
