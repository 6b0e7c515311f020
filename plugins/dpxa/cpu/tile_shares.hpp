// The CPU hand-over from dpxa's select to DeltaX's attend: each (query block, q head)'s candidate
// tile shares, in a per-q-head selection's row order; attend ranks a row's kept tiles by them.
#pragma once
#include <sieve/sieve.h>

#include <cstdint>
#include <vector>

#include "math/dpxa_tiles.hpp"

namespace sieve::dpxa {

struct TileShares {
  std::vector<float> shares;
  std::vector<int64_t> start;  // where row (query block of the batch, q head) starts in shares

  // Lays out the rows of `call`: its B-token query blocks, n_q_heads heads each.
  void layout(const sieve_layer_call& call, int32_t B, int32_t n_q_heads) {
    start.clear();
    int64_t off = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      for (int32_t t = 0; t * int64_t(B) < n_new; ++t) {
        const int32_t nc = row_span(call.kv_len_host[b], n_new, B, t).n_candidates;
        for (int32_t h = 0; h < n_q_heads; ++h, off += nc) start.push_back(off);
      }
    }
    start.push_back(off);
    shares.resize(size_t(off));
  }
  // Row (query block `block` of the batch, q head h).
  float* row(int64_t block, int32_t h, int32_t n_q_heads) { return shares.data() + start[size_t(block * n_q_heads + h)]; }
};

}  // namespace sieve::dpxa
