// Which query rows of one sequence the Δ-correction recomputes densely, and which anchor corrects
// each other row, as closed-form functions of the sequence's query count s, gamma and tail. Shared
// verbatim by the CPU path and the CUDA kernels, so both apply the same rule by construction.
//
// With local query index l in [0, s) (attention.h: query l of the sequence):
//   s_p = max(0, s - (s mod gamma + max(tail, gamma)))    first tail row
//   anchors: l = 0, gamma, 2 gamma, ... < s_p             (anchor_count = ceil(s_p / gamma))
//   tail:    l in [s_p, s)                                 dense rows, replaced whole
//   other l < s_p: corrected by anchor a = l / gamma (the preceding anchor)
// The dense rows handed to the core kernel (q_rows) are the anchors followed by the tail, which
// is ascending in l because every anchor is < s_p.
#pragma once
#include <cstdint>

#include "sieve/util/host_device.hpp"

namespace sieve::delta_correction {

struct SeqRows {
  int64_t s;        // query rows of the sequence
  int64_t s_p;      // first tail row
  int64_t anchors;  // anchor rows (all < s_p)

  SIEVE_HD int64_t tail_rows() const { return s - s_p; }
  SIEVE_HD int64_t dense_rows() const { return anchors + (s - s_p); }
  // The j-th dense row (0 <= j < dense_rows()), as a local query index.
  SIEVE_HD int64_t dense_row(int64_t j, int64_t gamma) const {
    return j < anchors ? j * gamma : s_p + (j - anchors);
  }
};

SIEVE_HD SeqRows seq_rows(int64_t s, int64_t gamma, int64_t tail) {
  if (s <= 0) return {0, 0, 0};
  const int64_t keep = s % gamma + (tail > gamma ? tail : gamma);
  const int64_t s_p = s > keep ? s - keep : 0;
  return {s, s_p, (s_p + gamma - 1) / gamma};
}

// What happens to row l of a sequence.
enum class RowRole : int32_t { kAnchor = 0, kCorrected = 1, kTail = 2 };

SIEVE_HD RowRole row_role(const SeqRows& r, int64_t l, int64_t gamma) {
  if (l >= r.s_p) return RowRole::kTail;
  return l % gamma == 0 ? RowRole::kAnchor : RowRole::kCorrected;
}

// Weight of the next anchor's correction for a corrected row l with `interpolate`: the linear
// blend (1 - w) Δ_a + w Δ_{a+1}, w = (l mod gamma) / gamma, when anchor a + 1 exists; 0 (the
// preceding anchor's correction alone) when it does not or without interpolation.
SIEVE_HD float next_anchor_weight(const SeqRows& r, int64_t l, int64_t gamma,
                                        bool interpolate) {
  if (!interpolate) return 0.f;
  const int64_t a = l / gamma;
  if (a + 1 >= r.anchors) return 0.f;
  return float(l % gamma) / float(gamma);
}

// ---- The tiled anchor path (CUDA): blocks of `qa` anchors --------------------------------------
// Anchor k of a sequence with s queries and kv_len resident tokens sits at position
// kv_len − s + k·gamma. Anchor block t = anchors [t·qa, min((t+1)·qa, anchors)). Its bulk keys are
// the whole key blocks (kb pages each) before its first anchor, blocks [0, bulk_blocks); its near
// keys the pages from there to the page of its last anchor (causality inside them is the kernel's).
SIEVE_HD int64_t anchor_blocks(const SeqRows& r, int64_t qa) { return (r.anchors + qa - 1) / qa; }
SIEVE_HD int64_t bulk_blocks(const SeqRows& r, int64_t kv_len, int64_t t, int64_t qa, int64_t gamma,
                                   int64_t page_size, int64_t kb) {
  return (kv_len - r.s + t * qa * gamma) / (page_size * kb);
}
SIEVE_HD int64_t near_end_page(const SeqRows& r, int64_t kv_len, int64_t t, int64_t qa, int64_t gamma,
                                     int64_t page_size) {
  const int64_t last = ((t + 1) * qa < r.anchors ? (t + 1) * qa : r.anchors) - 1;
  return (kv_len - r.s + last * gamma) / page_size + 1;
}
// Near-key selection rows of a sequence: one per query block of qa·gamma queries of the original
// layout (rows past the anchor blocks stay empty).
SIEVE_HD int64_t near_rows(const SeqRows& r, int64_t qa, int64_t gamma) {
  return r.s > 0 ? (r.s + qa * gamma - 1) / (qa * gamma) : 0;
}
SIEVE_HD int64_t near_first_page(const SeqRows& r, int64_t kv_len, int64_t t, int64_t qa, int64_t gamma,
                                       int64_t page_size, int64_t kb) {
  return bulk_blocks(r, kv_len, t, qa, gamma, page_size, kb) * kb;
}
SIEVE_HD int64_t near_pages(const SeqRows& r, int64_t kv_len, int64_t t, int64_t qa, int64_t gamma,
                                  int64_t page_size, int64_t kb) {
  if (t >= anchor_blocks(r, qa)) return 0;
  return near_end_page(r, kv_len, t, qa, gamma, page_size) -
         near_first_page(r, kv_len, t, qa, gamma, page_size, kb);
}

}  // namespace sieve::delta_correction
