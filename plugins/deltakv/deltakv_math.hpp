// The stage-3 formulas of Delta-KV shared by the CPU path and the CUDA kernels (host + device):
// the rows a query attends (the safe-anchor prefix and the exact span). The keep rule of stage 1
// lives in core/packing (sieve/packing/keep_rule.hpp), shared with dpxa's mode=deltax; it is
// re-exported here under sieve::deltakv so the plugin's code names it as before.
#pragma once
#include <cmath>
#include <cstdint>

#include "sieve/packing/keep_rule.hpp"

#if defined(__CUDACC__)
#define SIEVE_DKV_HD __host__ __device__ __forceinline__
#else
#define SIEVE_DKV_HD inline
#endif

namespace sieve::deltakv {

using packing::butterfly32;
using packing::delta_keeps;
using packing::fixed_keeps;
using packing::KeepRule;
using packing::key_sums;
using packing::kLanes;
using packing::Metric;
using packing::kCos;
using packing::kL2;
using packing::mix64;
using packing::Packing;
using packing::kDelta;
using packing::kPeriodic;
using packing::kRandom;
using packing::Sums;

enum Phase2 : int32_t { kPhase2On = 0, kPhase2Off = 1, kPhase2Only = 2 };

// Stage 3: the keys query position `pos` attends, given the packed reach[0..m) of its KV head
// (reach[j] = last position anchor j covers, strictly increasing).
//  qs    = first position of the query's block (blocks of q_block positions from 0);
//  safe  = anchors whose run ends before qs (reach < qs): a prefix of the anchors, attended in
//          compressed form (phase 1);
//  exact = positions [exact_begin, pos], exact_begin = reach[safe - 1] + 1 (0 without safe
//          anchors): the rest of the causal span, attended exactly (phase 2).
// Every position 0..pos is thus represented exactly once: inside a safe anchor's run or exactly.
struct RowSpan {
  int32_t safe;         // anchors [0, safe) in phase 1
  int32_t exact_begin;  // phase 2 over positions [exact_begin, pos]
};
SIEVE_DKV_HD int32_t safe_anchors(const int32_t* reach, int32_t m, int32_t qs) {
  int32_t lo = 0, hi = m;  // first anchor with reach >= qs
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (reach[mid] < qs) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
SIEVE_DKV_HD RowSpan row_span(const int32_t* reach, int32_t m, int32_t pos, int32_t q_block) {
  const int32_t qs = pos - pos % q_block;
  RowSpan r;
  r.safe = safe_anchors(reach, m, qs);
  r.exact_begin = r.safe > 0 ? reach[r.safe - 1] + 1 : 0;
  return r;
}

// Anchors a query at `pos` sees with phase 2 off: those that start at or before it (a prefix).
SIEVE_DKV_HD int32_t visible_anchors(const int32_t* anchor, int32_t m, int32_t pos) {
  int32_t lo = 0, hi = m;
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (anchor[mid] <= pos) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Tokens anchor j stands for, for a query at `pos`: its whole run in phase 1 (the run ends before
// the query's block), clipped at the query itself when phase 2 is off (causality).
SIEVE_DKV_HD int32_t anchor_count(int32_t anchor, int32_t reach, int32_t pos) {
  return (reach < pos ? reach : pos) - anchor + 1;
}

}  // namespace sieve::deltakv
