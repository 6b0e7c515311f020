// dpxa's select on the CPU: per sequence, KV head and q head, the tile scores of the chosen
// estimator (math/dpxa_math.hpp) and the greedy mass cover of every query block; the kept key
// blocks of each selection row, and the metrics dpxa_density and dpxa_sampled. (Sequence, KV
// head) pairs run on OpenMP threads, each worker with its own scratch.
#pragma once
#include <sieve/sieve.h>

#include <cstdint>
#include <vector>

#include "call_data.hpp"
#include "cpu/tile_shares.hpp"
#include "math/dpxa_math.hpp"

namespace sieve::dpxa {

class CpuSelect {
 public:
  // Fills rows() for the call's n_rows selection rows (query blocks x heads, in selection order).
  // `shares` (mode=deltax): each (query block, q head)'s candidate shares, for DeltaX's attend.
  void run(const sieve_geometry& g, const SelectConfig& c, const sieve_layer_call& call, const sieve_paged_kv& view,
           int32_t n_rows, const sieve_host_services& services, TileShares* shares);
  // rows()[r]: the kept key blocks of row r, ascending.
  const std::vector<std::vector<int32_t>>& rows() const { return rows_; }

 private:
  // One thread's scratch, grown on the first calls and reused (the CPU path's only
  // allocations), and its share of the metrics' sums.
  struct Worker {
    std::vector<float> q, k, row_shares;
    Anchors q_anchors, k_anchors;
    HeadScores scores;
    GreedyScratch greedy;
    std::vector<uint8_t> keep;
    int64_t kept = 0, causal = 0;
    double sampled = 0, logits = 0;
  };
  // The rows of KV head kvh of sequence b (first query block row0).
  void run_kv_head(const sieve_geometry& g, const SelectConfig& c, const sieve_layer_call& call,
                   const sieve_paged_kv& view, int32_t b, int32_t kvh, int32_t row0, TileShares* shares, Worker& w);

  std::vector<Worker> workers_;
  std::vector<int32_t> row0_;
  std::vector<std::vector<int32_t>> rows_;
};

}  // namespace sieve::dpxa
