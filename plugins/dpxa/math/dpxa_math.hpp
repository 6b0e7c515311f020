// DPXA on the CPU over one head's contiguous float Q and K of one sequence: anchors, tile scores,
// the greedy cover and the exact tile masses (for calibration, tests and results). Used by the
// plugin's CPU path and by `sieve calibrate dpxa`; the arithmetic is dpxa_tiles.hpp's, shared
// with the CUDA kernels.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dpxa_tiles.hpp"

namespace sieve::dpxa {

struct Config {
  Estimator estimator = kDpxa;
  int32_t block = 128;         // B: query and key block tokens
  float q_threshold = 0.75f;   // delta-anchor cosine thresholds (dpxa)
  float k_threshold = 0.75f;
  int32_t stride = 8;          // S (xattn, stride)
  float scale = 0.f;           // logit scale (1/sqrt(d))
};

const char* estimator_name(Estimator e);

// Delta anchors of every B-token block of x [n, d] (row-major): offsets[blk * B + i], counts[blk].
struct Anchors {
  std::vector<uint8_t> offsets;
  std::vector<int32_t> counts;
};
void block_anchors(const float* x, int64_t n, int32_t d, int32_t B, float threshold, Anchors& out);

// Tile scores of every row of one head: q [n_new, d] (the sequence's last n_new tokens), k
// [kv_len, d]. Rows are the query blocks t = 0.. in order; row t's tiles are key blocks
// 0 .. spans[t].n_candidates - 1 at tiles[row_start[t] + j]. q_anchors / k_anchors are needed by
// the dpxa estimator only (may be null otherwise).
struct HeadScores {
  std::vector<RowSpan> spans;
  std::vector<int64_t> row_start;  // [rows + 1]
  std::vector<TileLse> tiles;
};
void score_head(const Config& c, const float* q, int64_t n_new, const float* k, int64_t kv_len,
                int32_t d, const Anchors* q_anchors, const Anchors* k_anchors, HeadScores& out);

// The kept key blocks of one row (forced + greedy until the kept share of the sampled mass
// reaches tau), as flags keep[0 .. n_candidates). Returns the number kept.
struct GreedyScratch {
  std::vector<float> w;
  std::vector<uint64_t> order;
};
int32_t greedy_row(const RowSpan& r, const TileLse* tiles, float tau, uint8_t* keep,
                   GreedyScratch& scratch);
// The normalised sampled weights of one row (w_j / Σ w), e.g. to calibrate on.
void row_shares(const RowSpan& r, const TileLse* tiles, std::vector<float>& shares);

// Exact attention mass of every tile of one head, averaged over the row's queries: mass[row_start
// [t] + j] = (1/|t|) Σ_{i in t} Σ_{keys of block j} softmax_i (f64; rows sum to 1). Same layout
// as HeadScores.
void true_tile_mass(const float* q, int64_t n_new, const float* k, int64_t kv_len, int32_t d,
                    int32_t B, double scale, std::vector<double>& mass);

// Calibration (XAttention's per-head τ): the rows of one head on the calibration data, each with
// its tile scores and exact tile masses (true_tile_mass; a row sums to 1).
struct CalibrationRow {
  RowSpan span;
  std::vector<TileLse> tiles;
  std::vector<double> mass;
};
// Mean over rows of the exact mass the kept tiles (greedy_row at tau) cover.
double mass_recall(const std::vector<CalibrationRow>& rows, float tau);
// The smallest tau (to 1e-4, by bisection: recall grows with tau) whose mass_recall reaches
// `target`; 1 when even tau = 1 falls short. *achieved gets the recall at the returned tau.
float calibrate_tau(const std::vector<CalibrationRow>& rows, double target, double* achieved);

// Per-(layer, q head) thresholds: a text file of lines `layer head tau` ('#' starts a comment).
// Returns "" or a message naming the file, the line and what is wrong (a directory, FIFO or a
// file over kMaxThresholdsBytes is refused by sieve/util/file_input.hpp's rules).
struct Thresholds {
  int32_t n_layers = 0, n_heads = 0;
  std::vector<float> tau;  // [layer * n_heads + head]; NaN: not given (use the global tau)
  float at(int32_t layer, int32_t head, float fallback) const;
};
constexpr uint64_t kMaxThresholdsBytes = 16u << 20;
std::string load_thresholds(const std::string& path, int32_t n_layers, int32_t n_heads,
                            Thresholds& out);

}  // namespace sieve::dpxa
