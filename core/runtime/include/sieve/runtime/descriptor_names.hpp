// Human-readable names of a policy descriptor's capability bits and enums, for `sieve plugins`,
// the chain checks' messages and conformance ("prefill,decode", "cpu,cuda", "f32,f16", ...; "-"
// for no bit set).
#pragma once
#include <cstdint>
#include <string>

namespace sieve::runtime {

std::string phase_names(uint32_t phases);
std::string device_names(uint32_t devices);
std::string dtype_names(uint32_t dtypes);
std::string needs_names(uint32_t needs);
std::string kv_layout_names(uint32_t layouts);    // sieve_kv_layout_bits: "hnd,nhd"
std::string kv_feature_names(uint32_t features);  // sieve_kv_feature_bits: "sidecars,eviction"
std::string selection_heads_name(uint32_t heads);
std::string cuda_graph_name(uint32_t level);

}  // namespace sieve::runtime
