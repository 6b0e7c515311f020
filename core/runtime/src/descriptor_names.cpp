#include "sieve/runtime/descriptor_names.hpp"

#include <initializer_list>
#include <utility>

#include "sieve/kv_store.h"
#include "sieve/policy.h"

namespace sieve::runtime {

namespace {
std::string bit_names(uint32_t v, std::initializer_list<std::pair<uint32_t, const char*>> names) {
  std::string out;
  for (auto& [bit, name] : names) {
    if (!(v & bit)) continue;
    if (!out.empty()) out += ",";
    out += name;
  }
  return out.empty() ? "-" : out;
}
}  // namespace

std::string phase_names(uint32_t v) {
  return bit_names(v, {{SIEVE_PHASE_PREFILL, "prefill"}, {SIEVE_PHASE_DECODE, "decode"}});
}
std::string device_names(uint32_t v) {
  return bit_names(v, {{SIEVE_DEVICE_CPU, "cpu"}, {SIEVE_DEVICE_CUDA, "cuda"}});
}
std::string dtype_names(uint32_t v) {
  return bit_names(v, {{SIEVE_DTYPE_F32, "f32"}, {SIEVE_DTYPE_F16, "f16"}, {SIEVE_DTYPE_BF16, "bf16"}});
}
std::string needs_names(uint32_t v) {
  return bit_names(v, {{SIEVE_NEEDS_PAGE_STATS, "page_stats"},
                       {SIEVE_NEEDS_PRE_ROPE_K, "pre_rope_k"},
                       {SIEVE_NEEDS_PRE_ROPE_Q, "pre_rope_q"},
                       {SIEVE_NEEDS_WEIGHTS_FILE, "weights_file"},
                       {SIEVE_NEEDS_SIDECARS, "sidecars"}});
}
std::string kv_layout_names(uint32_t layouts) {
  return bit_names(layouts, {{SIEVE_KV_LAYOUT_HND, "hnd"}, {SIEVE_KV_LAYOUT_NHD, "nhd"},
                             {SIEVE_KV_LAYOUT_COMBINED, "combined"}});
}
std::string kv_feature_names(uint32_t features) {
  return bit_names(features, {{SIEVE_KV_FEATURE_SIDECARS, "sidecars"}, {SIEVE_KV_FEATURE_EVICTION, "eviction"},
                              {SIEVE_KV_FEATURE_PRE_ROPE_K, "pre_rope_k"},
                              {SIEVE_KV_FEATURE_ENGINE_PAGES, "engine_pages"}});
}
std::string selection_heads_name(uint32_t h) {
  switch (h) {
    case SIEVE_SEL_PER_SEQUENCE: return "per_sequence";
    case SIEVE_SEL_PER_KV_HEAD: return "per_kv_head";
    case SIEVE_SEL_PER_Q_HEAD: return "per_q_head";
    default: return "unknown(" + std::to_string(h) + ")";
  }
}
std::string cuda_graph_name(uint32_t level) {
  switch (level) {
    case SIEVE_CUDA_GRAPH_NONE: return "none";
    case SIEVE_CUDA_GRAPH_STATIC_SHAPES: return "static_shapes";
    case SIEVE_CUDA_GRAPH_FULL: return "full";
    default: return "unknown(" + std::to_string(level) + ")";
  }
}

}  // namespace sieve::runtime
