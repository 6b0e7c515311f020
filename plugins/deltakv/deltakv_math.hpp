// The stage-3 formulas of Delta-KV shared by the CPU path and the CUDA kernels (host + device):
// the rows a query attends (the safe-anchor prefix and the exact span) and their description as
// the core kernel's attention variant. The keep rule of stage 1
// lives in core/packing (sieve/packing/keep_rule.hpp), shared with dpxa's mode=deltax; it is
// re-exported here under sieve::deltakv so the plugin's code names it as before.
#pragma once
#include <cmath>
#include <cstdint>

#include "sieve/packing/keep_rule.hpp"
#include "sieve/util/host_device.hpp"

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
SIEVE_HD int32_t safe_anchors(const int32_t* reach, int32_t m, int32_t qs) {
  int32_t lo = 0, hi = m;  // first anchor with reach >= qs
  while (lo < hi) {
    const int32_t mid = (lo + hi) / 2;
    if (reach[mid] < qs) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}
SIEVE_HD RowSpan row_span(const int32_t* reach, int32_t m, int32_t pos, int32_t q_block) {
  const int32_t qs = pos - pos % q_block;
  RowSpan r;
  r.safe = safe_anchors(reach, m, qs);
  r.exact_begin = r.safe > 0 ? reach[r.safe - 1] + 1 : 0;
  return r;
}

// Anchors a query at `pos` sees with phase 2 off: those that start at or before it (a prefix).
SIEVE_HD int32_t visible_anchors(const int32_t* anchor, int32_t m, int32_t pos) {
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
SIEVE_HD int32_t anchor_count(int32_t anchor, int32_t reach, int32_t pos) {
  return (reach < pos ? reach : pos) - anchor + 1;
}

// Stage 3 as the core kernel's attention variant (sieve_attention_variant, rows per KV head): the
// spans of the row whose queries start at position qs, over the packed anchors of its (sequence,
// KV head) at entries [base, base + m) of packed_pos (the anchors, counts reach - anchor + 1) and
// its n resident keys. phase2 = on: the safe anchors, then the exact keys from exact_begin (the
// core kernel stops each query at its own position); only: the exact keys alone; off: every
// anchor, the core kernel's causal clip of counts doing the rest (an anchor after the query is not
// seen, the run holding the query counts up to it). Writes 1 or 2 spans {kind, begin, end} to
// out and returns how many; qs must start a block of q_block positions for on/only.
SIEVE_HD int32_t variant_spans(int32_t phase2, const int32_t* reach, int32_t m, int32_t qs, int32_t q_block,
                                   int32_t base, int32_t n, int32_t (*out)[3]) {
  constexpr int32_t kKeys = 0, kPacked = 1;  // sieve_span_kind (attention.h)
  if (phase2 == kPhase2Off) {
    out[0][0] = kPacked, out[0][1] = base, out[0][2] = base + m;
    return 1;
  }
  const RowSpan span = row_span(reach, m, qs, q_block);
  int32_t k = 0;
  if (phase2 == kPhase2On) out[k][0] = kPacked, out[k][1] = base, out[k][2] = base + span.safe, ++k;
  out[k][0] = kKeys, out[k][1] = span.exact_begin, out[k][2] = n;
  return k + 1;
}

// Query tokens per variant row: one row per sequence with phase2 = off (every query sees the same
// anchors); else q_block when every sequence's first query position starts a block of q_block
// positions (a whole prefill), otherwise one token per row.
inline int32_t variant_q_block(int32_t phase2, int32_t q_block, int32_t max_seq_len, const int32_t* qo_indptr_host,
                               const int32_t* kv_len_host, int32_t batch) {
  if (phase2 == kPhase2Off) return max_seq_len;
  for (int32_t b = 0; b < batch; ++b)
    if ((kv_len_host[b] - (qo_indptr_host[b + 1] - qo_indptr_host[b])) % q_block != 0) return 1;
  return q_block;
}

}  // namespace sieve::deltakv
