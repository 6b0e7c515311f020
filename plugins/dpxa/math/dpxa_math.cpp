// DPXA on the CPU (see dpxa_math.hpp). Compiled with -ffp-contract=off: the tile arithmetic must
// round exactly as the CUDA kernels do.
#include "dpxa_math.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <sstream>

#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"
#include "sieve/util/printable.hpp"

namespace sieve::dpxa {

const char* estimator_name(Estimator e) {
  switch (e) {
    case kDpxa: return "dpxa";
    case kXattn: return "xattn";
    case kStride: return "stride";
  }
  return "?";
}

void block_anchors(const float* x, int64_t n, int32_t d, int32_t B, float threshold,
                   Anchors& out) {
  const int64_t blocks = (n + B - 1) / B;
  out.offsets.assign(size_t(blocks * B), 0);
  out.counts.assign(size_t(blocks), 0);
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const float* base = x + blk * B * d;
    const int32_t len = int32_t(std::min<int64_t>(B, n - blk * B));
    auto row = [&](int32_t i) { return base + int64_t(i) * d; };
    out.counts[size_t(blk)] =
        delta_anchors(row, len, d, threshold, out.offsets.data() + blk * B);
  }
}

void score_head(const Config& c, const float* q, int64_t n_new, const float* k, int64_t kv_len,
                int32_t d, const Anchors* qa, const Anchors* ka, HeadScores& out) {
  const int32_t B = c.block;
  const int32_t rows = int32_t((n_new + B - 1) / B);
  out.spans.resize(size_t(rows));
  out.row_start.assign(size_t(rows) + 1, 0);
  for (int32_t t = 0; t < rows; ++t) {
    out.spans[t] = row_span(kv_len, n_new, B, t);
    out.row_start[t + 1] = out.row_start[t] + out.spans[t].n_candidates;
  }
  out.tiles.resize(size_t(out.row_start[rows]));
  const float scale_over_s = c.scale / float(std::max(c.stride, 1));
  std::vector<float> acc(static_cast<size_t>(B));
  for (int32_t t = 0; t < rows; ++t) {
    const RowSpan& r = out.spans[t];
    const int64_t q0 = int64_t(t) * B;
    const int32_t nq = int32_t(std::min<int64_t>(B, n_new - q0));
    auto qrow = [&](int32_t i) { return q + (q0 + i) * d; };
    for (int32_t j = 0; j < r.n_candidates; ++j) {
      const int64_t k0 = int64_t(j) * B;
      const int32_t nk = int32_t(std::min<int64_t>(B, kv_len - k0));
      auto krow = [&](int32_t i) { return k + (k0 + i) * d; };
      const TileGeometry g{r.first, k0, nq, nk, d};
      TileLse& tile = out.tiles[size_t(out.row_start[t] + j)];
      switch (c.estimator) {
        case kDpxa:
          tile = score_dpxa(g, qrow, qa->offsets.data() + int64_t(t) * B, qa->counts[t], krow,
                            ka->offsets.data() + int64_t(j) * B, ka->counts[j], c.scale);
          break;
        case kXattn: tile = score_xattn(g, qrow, krow, c.stride, scale_over_s, acc.data()); break;
        case kStride: tile = score_stride(g, qrow, krow, c.stride, c.scale); break;
      }
    }
  }
}

int32_t greedy_row(const RowSpan& r, const TileLse* tiles, float tau, uint8_t* keep,
                   GreedyScratch& s) {
  const int32_t n = r.n_candidates;
  s.w.resize(size_t(n));
  const float z = row_weights(tiles, n, s.w.data());
  s.order.clear();
  int32_t kept = 0;
  for (int32_t j = 0; j < n; ++j) {
    keep[j] = forced(r, j) ? 1 : 0;
    if (keep[j]) ++kept;
    else s.order.push_back(order_key(s.w[j], j));
  }
  std::sort(s.order.begin(), s.order.end(), std::greater<uint64_t>());
  return kept + greedy_walk(r, s.w.data(), z, tau, s.order.data(), int32_t(s.order.size()), keep);
}

void row_shares(const RowSpan& r, const TileLse* tiles, std::vector<float>& shares) {
  shares.resize(size_t(r.n_candidates));
  const float z = row_weights(tiles, r.n_candidates, shares.data());
  for (float& w : shares) w = z > 0 ? w / z : 0.f;
}

void true_tile_mass(const float* q, int64_t n_new, const float* k, int64_t kv_len, int32_t d,
                    int32_t B, double scale, std::vector<double>& mass) {
  const int64_t rows = (n_new + B - 1) / B;
  std::vector<int64_t> start(size_t(rows) + 1, 0);
  for (int64_t t = 0; t < rows; ++t)
    start[t + 1] = start[t] + row_span(kv_len, n_new, B, int32_t(t)).n_candidates;
  mass.assign(size_t(start[rows]), 0.0);
  std::vector<double> logit(static_cast<size_t>(kv_len));
  const int64_t base = kv_len - n_new;
  for (int64_t i = 0; i < n_new; ++i) {
    const int64_t pos = base + i, t = i / B;
    const float* qi = q + i * d;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t p = 0; p <= pos; ++p) {
      double s = 0;
      for (int32_t x = 0; x < d; ++x) s += double(qi[x]) * k[p * d + x];
      logit[p] = s * scale;
      mx = std::max(mx, logit[p]);
    }
    double z = 0;
    for (int64_t p = 0; p <= pos; ++p) z += (logit[p] = std::exp(logit[p] - mx));
    const int64_t nq = std::min<int64_t>(B, n_new - t * B);
    for (int64_t p = 0; p <= pos; ++p) mass[size_t(start[t] + p / B)] += logit[p] / z / double(nq);
  }
}

double mass_recall(const std::vector<CalibrationRow>& rows, float tau) {
  if (rows.empty()) return 1.0;
  GreedyScratch scratch;
  std::vector<uint8_t> keep;
  double sum = 0;
  for (const CalibrationRow& r : rows) {
    keep.resize(size_t(r.span.n_candidates));
    greedy_row(r.span, r.tiles.data(), tau, keep.data(), scratch);
    double covered = 0, total = 0;
    for (int32_t j = 0; j < r.span.n_candidates; ++j) {
      total += r.mass[size_t(j)];
      if (keep[size_t(j)]) covered += r.mass[size_t(j)];
    }
    sum += total > 0 ? covered / total : 1.0;
  }
  return sum / double(rows.size());
}

float calibrate_tau(const std::vector<CalibrationRow>& rows, double target, double* achieved) {
  float lo = 0.f, hi = 1.f;
  if (mass_recall(rows, 0.f) >= target) hi = 0.f;
  else if (mass_recall(rows, 1.f) < target) lo = hi = 1.f;
  while (hi - lo > 1e-4f) {  // invariant: recall(lo) < target <= recall(hi)
    const float mid = 0.5f * (lo + hi);
    (mass_recall(rows, mid) >= target ? hi : lo) = mid;
  }
  if (achieved) *achieved = mass_recall(rows, hi);
  return hi;
}

float Thresholds::at(int32_t layer, int32_t head, float fallback) const {
  if (layer < 0 || layer >= n_layers || head < 0 || head >= n_heads) return fallback;
  const float t = tau[size_t(layer) * n_heads + head];
  return std::isnan(t) ? fallback : t;
}

std::string load_thresholds(const std::string& path, int32_t n_layers, int32_t n_heads,
                            Thresholds& out) {
  out.n_layers = n_layers;
  out.n_heads = n_heads;
  out.tau.assign(size_t(std::max(n_layers, 0)) * std::max(n_heads, 0),
                 std::numeric_limits<float>::quiet_NaN());
  std::string text;
  try {
    text = read_text_file(path, "thresholds file", kMaxThresholdsBytes);
  } catch (const Error& e) {
    return e.what();
  }
  std::istringstream in(text);
  std::string line;
  for (int lineno = 1; std::getline(in, line); ++lineno) {
    if (auto h = line.find('#'); h != std::string::npos) line.erase(h);
    std::istringstream ss(line);
    long long layer, head;
    double tau;
    if (!(ss >> layer)) continue;  // blank / comment line
    std::string rest;
    if (!(ss >> head >> tau) || (ss >> rest))
      return printable(path) + ":" + std::to_string(lineno) + ": expected `layer head tau`, got '" + printable(line, 80) +
             "'";
    if (layer < 0 || layer >= n_layers || head < 0 || head >= n_heads)
      return printable(path) + ":" + std::to_string(lineno) + ": layer " + std::to_string(layer) + " head " +
             std::to_string(head) + " is outside the model's " + std::to_string(n_layers) +
             " layers x " + std::to_string(n_heads) + " query heads";
    if (!(tau >= 0 && tau <= 1))
      return printable(path) + ":" + std::to_string(lineno) + ": tau " + std::to_string(tau) +
             " is outside [0, 1]";
    out.tau[size_t(layer) * n_heads + size_t(head)] = float(tau);
  }
  return "";
}

}  // namespace sieve::dpxa
