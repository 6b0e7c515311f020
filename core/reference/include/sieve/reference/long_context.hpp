// Synthetic long contexts whose queries and keys have realistic adjacent-token similarity.
//
// Random normal keys (Workload) have adjacent cosine ~0, so every delta/anchor method degenerates
// on them (every key is its own anchor). Real models' keys are highly similar to their
// neighbours (paper 001 §6: a global similarity floor from the projection, content drift that
// raises adjacent similarity further, RoPE adding positional adjacency). This generator builds
// each KV head's keys (and each query head's queries) from those three parts:
//
//   pre-RoPE x_t = m·mean + drift_t + white_t                (per head, per token)
//     mean     a fixed unit direction per head, |m|² = floor·d: the similarity floor (the
//              cosine of two far-apart keys before RoPE is ~ floor); it lies in the
//              low-frequency half of the RoPE pairs (LLaMA keys keep their large stable
//              channels there), so RoPE erodes it over hundreds of tokens, not one;
//     drift_t  an AR(1) process per coordinate, drift_t = ρ·drift_{t-1} + √(1-ρ²)·ε_t, with
//              variance `drift`·d: slowly varying content (semantic adjacency);
//     white_t  independent normal noise with variance (1 - floor - drift)·d: token-level change.
//   The pre-RoPE adjacent cosine is then ~ floor + drift·ρ, the cosine at distance m is
//   ~ floor + drift·ρ^m; `drift` is solved from `adjacent_cos` (the pre-RoPE target).
//   RoPE (base `rope_base`, pairs (i, i+d/2) as in LLaMA) is applied at the token's position;
//   it lowers the adjacent cosine a little (high-frequency pairs) and makes the floor decay with
//   distance, as in real models.
//
// Attention structure (added after RoPE, i.e. position-independent content):
//   - locality: the query head's mean contains `local_logit`·√d/m of its KV head's key mean, so
//     q·k gets a RoPE-relative bias of ~local_logit at distance 0 that decays with distance;
//   - sink: key 0 carries a sink direction every query leans to (+sink_logit);
//   - heavy runs: runs of keys (mean length heavy_run tokens, covering heavy_fraction of the
//     keys) carry one of heavy_directions directions per KV head; query head h leans to
//     direction h % heavy_directions (+heavy_logit), so a few distant blocks carry real mass.
// Values: normal noise mixed with an AR(1) drift of weight value_drift (KVMerger: values show
// little adjacency).
//
// Defaults are tuned (d = 128, 2048 tokens, 8 KV / 16 q heads) so that the delta anchor walk
// (keep and re-anchor when cos(x, anchor) < τ) keeps about what the paper reports for
// LLaMA-3.1 8B: paper K keep 0.20 / 0.34 / 0.49 / 0.70 at τ = 0.75 / 0.78 / 0.83 / 0.88 (§4.3
// and Table 3's KV reductions 65.8% / 50.9% / 29.5%), generator 0.25 / 0.31 / 0.45 / 0.74; Q keep
// at τ = 0.75: paper ~0.20, generator 0.17. Adjacent-key cosine: mean 0.87, p10 0.83, p90 0.91
// (post-RoPE), above KVMerger's cos(1) ≈ 0.54 bound; far keys (512 apart) ~0.22.
// (docs/methods/dpxa.md has the table; tests/plugins/dpxa checks it.)
#pragma once
#include <cstdint>
#include <vector>

namespace sieve::reference {

struct Workload;

struct LongContextSpec {
  int32_t n_q_heads = 8;
  int32_t n_kv_heads = 2;
  int32_t head_dim = 128;
  int32_t n_tokens = 4096;
  uint64_t seed = 1;
  // Keys (pre-RoPE): floor = cosine of far-apart keys, adjacent_cos = adjacent-key cosine,
  // drift_rho = per-token correlation of the content drift.
  double key_floor = 0.45;
  double key_adjacent_cos = 0.88;
  double key_drift_rho = 0.95;
  // Queries, the same three parts (lower: the sink and heavy leans below add constant parts
  // that raise the queries' similarity on their own).
  double query_floor = 0.30;
  double query_adjacent_cos = 0.72;
  double query_drift_rho = 0.95;
  double adjacent_spread = 0.04;  // per head: adjacent_cos ± spread (uniform)
  double rope_base = 10000.0;  // 0: no RoPE
  double local_logit = 2.0;
  double sink_logit = 5.0;
  int32_t heavy_directions = 4;
  double heavy_fraction = 0.03;
  double heavy_run = 16.0;
  double heavy_logit = 5.0;
  double value_drift = 0.3;
};

// Token-major tensors: q [n_tokens, n_q_heads, d], k and v [n_tokens, n_kv_heads, d].
struct LongContext {
  LongContextSpec spec;
  std::vector<float> q, k, v;
  const float* q_at(int32_t t, int32_t h) const {
    return q.data() + (int64_t(t) * spec.n_q_heads + h) * spec.head_dim;
  }
  const float* k_at(int32_t t, int32_t g) const {
    return k.data() + (int64_t(t) * spec.n_kv_heads + g) * spec.head_dim;
  }
  const float* v_at(int32_t t, int32_t g) const {
    return v.data() + (int64_t(t) * spec.n_kv_heads + g) * spec.head_dim;
  }
};

// Throws std::invalid_argument (naming the field) on a bad spec.
LongContext make_long_context(const LongContextSpec& spec);

// Overwrites the K/V pages and the queries of `w` (every sequence b gets its own context of
// kv_len[b] tokens, seed spec.seed + b; the queries are its last n_new[b] tokens). Heads and
// head_dim come from the workload; n_tokens and the seed from the workload/spec as said.
void fill_workload(Workload& w, LongContextSpec spec);

// Statistics used to check the generator against the paper (and by tests).
struct AdjacencyStats {
  double mean = 0, p10 = 0, p50 = 0, p90 = 0;  // adjacent-token cosine over tokens and heads
  double far_mean = 0;                          // cosine at distance `far`
};
// x: token-major [n_tokens, n_heads, d].
AdjacencyStats measure_adjacency(const std::vector<float>& x, int32_t n_tokens, int32_t n_heads,
                                 int32_t d, int32_t far = 512);
// Fraction of vectors the cosine delta anchor walk keeps (chunks of `chunk` tokens, the first of
// each chunk an anchor; keep and re-anchor when cos(x, anchor) < threshold), over all heads.
double measure_anchor_keep(const std::vector<float>& x, int32_t n_tokens, int32_t n_heads,
                           int32_t d, double threshold, int32_t chunk = 128);

}  // namespace sieve::reference
