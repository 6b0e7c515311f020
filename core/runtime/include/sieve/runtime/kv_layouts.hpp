// Whether a chain can read the pages a store hands out. A store whose views are not compact HND
// (an engine's NHD or combined pool) may serve only chains whose every plugin declares that
// layout (sieve_policy_descriptor.kv_layouts, ABI 1.1) and, where a chain leaves attention to the
// core kernel, only if the core kernel reads it; anything else would read the wrong bytes, so
// the session refuses it when it is created, naming the store, the plugin and the layout.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sieve/runtime/chain_spec.hpp"

namespace sieve::runtime {

// The layouts the core attention kernels read (sieve_kv_layout_bits).
uint32_t core_kernel_kv_layouts();

// "hnd", "nhd", "combined".
const char* kv_layout_name(uint32_t layout_bit);

// One line per reason `chains` cannot run over views of `layout_bit` from store `store_label`
// (empty: it can). HND is always readable.
std::vector<std::string> kv_layout_refusals(const ResolvedChains& chains, uint32_t layout_bit,
                                            const std::string& store_label);

}  // namespace sieve::runtime
