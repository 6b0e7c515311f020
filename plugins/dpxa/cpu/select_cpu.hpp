// dpxa's select on the CPU: per sequence, KV head and q head, the tile scores of the chosen
// estimator (math/dpxa_math.hpp) and the greedy mass cover of every query block; the kept key
// blocks of each selection row, and the metrics dpxa_density and dpxa_sampled.
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
  // Scratch, grown on the first calls and reused (the CPU path's only allocations).
  std::vector<float> q_, k_, row_shares_;
  Anchors q_anchors_, k_anchors_;
  HeadScores scores_;
  GreedyScratch greedy_;
  std::vector<uint8_t> keep_;
  std::vector<std::vector<int32_t>> rows_;
};

}  // namespace sieve::dpxa
