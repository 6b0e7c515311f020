// One attention call on a synthetic workload, run the way a host runs a model layer (a KV store,
// the layer's chain, the core kernels) and measured against the f64 reference: the shared path
// of `sieve attn` and of the numeric part of `sieve conform`, so no plugin grades itself.
//
// The keys come from sieve::reference::Workload (random, with a few heavy directions per KV head
// so attention is not uniform); the earlier context enters the store directly, the call's new
// tokens go through LayerRunner::run_layer like a model's layer would send them.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/host_services.hpp"

namespace sieve::runtime {

struct SyntheticSpec {
  uint32_t phase = SIEVE_PHASE_DECODE;
  int32_t n_q_heads = 32, n_kv_heads = 8, head_dim = 128, page_size = 16;
  int32_t n_layers = 1;  // the model's layer count (policies may check it)
  // Layers 0 .. run_layers-1 run in order in the one step, each on the same K/V and queries (an
  // instance that serves several layers, DELTA, selects at one and reuses at the next); metrics
  // are the worst over them. At most n_layers.
  int32_t run_layers = 1;
  std::vector<int32_t> context = {4096};  // tokens per sequence after the call (ragged allowed)
  int32_t new_tokens = 1;                  // per sequence in prefill (clipped to the context)
  DLDataType kv_dtype{kDLFloat, 32, 1};
  DLDevice device{kDLCPU, 0};
  uint64_t seed = 1;
  int32_t timing_reps = 3;  // repetitions of the dense core kernel timed for the ratio
  bool check = true;        // LayerRunner checks (selection contents, finite outputs)
  // Keys/queries/values from reference::make_long_context (realistic adjacent-token similarity,
  // RoPE, sink, heavy runs; seed = seed + sequence) instead of Workload's random ones.
  bool similar_keys = false;
  // > 0: the selection-quality probe (reference/planted.hpp): this many keys per (sequence, KV
  // head) aligned with the group's queries at `planted_logit`; the report's planted_recall says
  // how much of their mass the chain attended (and kept resident after end_step).
  int32_t planted_keys = 0;
  double planted_logit = 32;
};

struct SyntheticReport {
  double rel_err = 0;            // ‖o − o_dense‖ / ‖o_dense‖, o_dense in f64
  double kernel_rel_err = -1;    // ‖o − o_ref(selection used)‖ / ‖·‖: the kernel's own error
                                 // (-1 when an attend/correct hook changed the output)
  double recall = 1;             // dense softmax mass on the attended keys
  double attended_fraction = 1;  // attended keys / causal keys, averaged over (token, head)
  double planted_recall = -1;    // with planted_keys: see SyntheticSpec (-1: nothing planted)
  int64_t non_finite = 0;
  uint64_t evicted_bytes = 0;    // store bytes end_step released (eviction)
  uint64_t kv_bytes = 0;         // store bytes_in_use after the call
  double chain_seconds = 0;      // the layer call through the chain (append included), synced
  double dense_seconds = 0;      // the core dense kernel alone on the same cache (median)
  uint64_t hook_allocations = 0; // allocations through the services table during the call
  std::string device;
  std::vector<std::pair<std::string, HostServices::MetricSummary>> metrics;
};

// Runs `chain` (layers 0 .. run_layers-1 of the model) on the workload of `spec`. Returns false
// with one line in *error on a setup failure or when a plugin misbehaves (that line names the
// plugin, the layer and the hook).
bool run_synthetic(const SyntheticSpec& spec, const ChainSpec& chain, const Registry& registry,
                   SyntheticReport* report, std::string* error);

}  // namespace sieve::runtime
