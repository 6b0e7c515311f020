// Delta-KV on the CPU, one (sequence, KV head) at a time over f32 copies of its keys and values:
// stage 1 (keep mask) and stage 2 (anchors and their reach) from core/packing, stage 3 (one query
// row) here. The plugin's CPU path and the tests use these; the CUDA kernels follow the same
// formulas (deltakv_math.hpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "deltakv_math.hpp"
#include "sieve/packing/pack_cpu.hpp"

namespace sieve::deltakv {

// Stages 1-2 (keep mask, pack) are the shared CPU packing of core/packing.
using packing::keep_mask;
using packing::pack;

// What stage 3 needs besides the packed lists.
struct AttendRule {
  int32_t q_block;      // query block of the safe-anchor test (positions from 0)
  int32_t phase2;       // Phase2
  bool count_weighting; // add ln(count) to each anchor's logit
  float scale;          // logit scale
};

// Stage 3 for one query row at position `pos` (keys kf/vf [n][d] of its KV head, q [d]):
// softmax over the phase-1 anchors (logit scale·q·k̂_j + ln count_j) and the phase-2 exact keys,
// both in f32, into out [d]. `scores` holds at least m + pos + 1 floats.
inline void attend_row(const AttendRule& r, const float* q, const float* kf, const float* vf,
                       int32_t d, const int32_t* anchor, const int32_t* reach, int32_t m,
                       int32_t pos, float* scores, float* out) {
  int32_t n_anchor = 0, exact_begin = pos + 1;  // anchors [0, n_anchor), exact [exact_begin, pos]
  if (r.phase2 == kPhase2Off) {
    n_anchor = visible_anchors(anchor, m, pos);
  } else {
    const RowSpan span = row_span(reach, m, pos, r.q_block);
    exact_begin = span.exact_begin;
    n_anchor = r.phase2 == kPhase2Only ? 0 : span.safe;
  }
  auto dot = [&](int32_t key) {
    float s = 0.f;
    const float* k = kf + int64_t(key) * d;
    for (int32_t i = 0; i < d; ++i) s += q[i] * k[i];
    return s * r.scale;
  };
  float mx = -std::numeric_limits<float>::infinity();
  int32_t c = 0;
  for (int32_t j = 0; j < n_anchor; ++j, ++c) {
    float z = dot(anchor[j]);
    if (r.count_weighting) z += std::log(float(anchor_count(anchor[j], reach[j], pos)));
    scores[c] = z;
    mx = std::max(mx, z);
  }
  for (int32_t i = exact_begin; i <= pos; ++i, ++c) {
    scores[c] = dot(i);
    mx = std::max(mx, scores[c]);
  }
  std::fill(out, out + d, 0.f);
  if (c == 0) return;
  double sum = 0;
  c = 0;
  auto add = [&](int32_t key) {
    const float w = std::exp(scores[c++] - mx);
    sum += w;
    const float* v = vf + int64_t(key) * d;
    for (int32_t i = 0; i < d; ++i) out[i] += w * v[i];
  };
  for (int32_t j = 0; j < n_anchor; ++j) add(anchor[j]);
  for (int32_t i = exact_begin; i <= pos; ++i) add(i);
  const float inv = float(1.0 / sum);
  for (int32_t i = 0; i < d; ++i) out[i] *= inv;
}

}  // namespace sieve::deltakv
