// One (context, batch) shape of the policy benchmark and one chain measured on it: the shape, its
// memory estimate, the similar-key context generator, and measure() (a fresh runtime::Session
// per case, the context filled through the chain's on_append hooks, the timed steps).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "policy_device.hpp"
#include "sieve/bench/policy.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/runtime/chain_spec.hpp"

namespace sieve::bench {

constexpr size_t kFillChunkBytes = size_t(64) << 20;  // K+V+q of one fill chunk, all sequences

// ---- the workload of one (context, batch) ----------------------------------------------------

struct Shape {
  uint32_t phase = SIEVE_PHASE_DECODE;
  int32_t layers = 1, hq = 32, hkv = 8, d = 128, page = 16, ctx = 0, batch = 1;
  int32_t n_new = 1;   // tokens per sequence of the timed call (decode: 1)
  int32_t extra = 0;   // tokens appended after the context (decode steps)
  DLDataType dtype = kBF16;
  DLDevice device = kCpu;
  bool similar = false;
  double key_cos = 0.9;
  uint32_t fill_phase = SIEVE_PHASE_DECODE;
  int32_t min_q_block = 1;
  uint64_t seed = 1;
  bool check = false;
  bool prefill() const { return phase == SIEVE_PHASE_PREFILL; }
  int32_t n_fill() const { return prefill() ? ctx - n_new : ctx; }
  int32_t pages_per_seq() const { return kernels::ceil_div(ctx + extra, page) + 1; }
  // Decode on CUDA times the steps twice: eagerly, then with the runner's CUDA graphs on (not
  // with --check: check mode's host copies keep every call eager).
  bool graph_steps() const { return !prefill() && device.device_type == kDLCUDA && !check; }
  // Tokens each sequence gains in the timed calls (warm-up + steps per pass, + the recorded step).
  int32_t decode_growth(int32_t warmup, int32_t steps) const {
    return prefill() ? 0 : (graph_steps() ? 2 : 1) * (warmup + steps) + 1;
  }
};

struct Result {
  std::string chain, error, skipped;
  double step_ms = 0, step_min_ms = 0, step_max_ms = 0, dense_step_ms = 0;
  // Decode on CUDA: the same steps with LayerRunner's CUDA graphs on (layer_graph.hpp), median;
  // the layer calls replayed / captured then, and why layer 0 ran eagerly ("" = graphed).
  double step_graph_ms = 0, step_graph_max_ms = 0;  // max: a step that captured (a page boundary)
  uint64_t graph_replays = 0, graph_captures = 0;
  std::string graph_eager_reason;
  double core_ms = 0, core_dense_ms = 0;  // the core kernel alone on the recorded selection / dense
  double attended = 1;                    // attended keys / causal keys (logical), mean over (token, q head)
  double resident_fraction = 1;           // resident tokens / logical tokens (eviction)
  uint64_t kv_bytes = 0;                  // store bytes in use after the recorded step
  int samples = 0;
  std::string selection;                  // kind/heads/blocks of the recorded selection
  std::vector<std::pair<std::string, HostServices::MetricSummary>> metrics;
};

// Bytes a case needs on its device, beyond what policies allocate (their sidecars and scratch):
// the store, the timed call's tensors, the runner's selection buffers and a fill chunk.
double estimate_bytes(const Shape& s, bool pre_rope);

// Free memory of the device (host: physical memory).
double available_bytes(const DLDevice& dev);

// One sequence's similar-key context (long_context.hpp), converted to the K/V/q dtype rows.
struct SimilarContext {
  HostTensor q, k, v;  // [n_tokens, H, d]
};
SimilarContext make_similar(const Shape& s, int32_t b, int32_t n_tokens);

sieve_geometry geometry_of(const Shape& s);
// Resolves a chain for the geometry: "" or every problem, "; "-separated.
std::string resolve(const runtime::ChainSpec& spec, const runtime::Registry& registry, const sieve_geometry& g,
                    runtime::ResolvedChains* out);

// One chain on one shape: the timed steps (decode) or calls (prefill), then the recorded one.
Result measure(const Shape& s, const std::string& label, const runtime::ChainSpec& spec,
               const runtime::Registry& registry, HostServices& services, const PolicyOptions& o,
               const std::vector<SimilarContext>* similar);

}  // namespace sieve::bench
