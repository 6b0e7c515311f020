// The selection-quality probe of `sieve conform`: a workload in which a few keys per (sequence,
// KV head), at random depths, are strongly aligned with every query of that KV head's group, so
// that any selection that scores keys against queries must attend them. A selection computed
// from the wrong data (K read with the wrong page layout, the wrong head, stale pages) misses them.
//
// Planting rewrites a Workload in place: the queries of group g of sequence b become
// sqrt(head_dim) * u (u a random unit direction of that (b, g)), and each planted key becomes
// logit * u, so q . k * scale = `logit` at the default scale 1/sqrt(head_dim), while the other
// keys' logits stay ~N(0, 1). Planted keys lie in pages wholly before the sequence's first query
// (visible to every query, causal prefill included), one per page, never in the last two pages.
#pragma once
#include <cstdint>
#include <vector>

#include "sieve/reference/workload.hpp"

namespace sieve::reference {

struct PlantedKeys {
  int32_t n_kv_heads = 0;
  // [batch * n_kv_heads]: the token positions planted for (sequence b, KV head g) at b * n_kv_heads + g.
  std::vector<std::vector<int32_t>> positions;
  int64_t count() const;
};

// Plants `per_head` keys per (sequence, KV head) of `w` (fewer in sequences too short to hold
// them: none in a sequence of fewer than per_head + 2 whole pages before its queries).
PlantedKeys plant_keys(Workload& w, int32_t per_head, double logit, uint64_t seed);

// Share of the planted keys' dense softmax mass (f64, causal) that `args` attends, over every
// computed (query token, query head) row: 1 when every planted key is attended, 0 when none is.
// `kept` (optional, [batch][pages of the sequence]): 0 marks a logical page evicted after the call,
// whose keys count as missed. -1 when nothing was planted. Preconditions of attend_reference.
double planted_recall(const sieve_attention_args& args, const PlantedKeys& planted,
                      const std::vector<std::vector<uint8_t>>* kept = nullptr);

}  // namespace sieve::reference
