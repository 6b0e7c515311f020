// Chains against the page layout of their store (kv_layouts.hpp).
#include "sieve/runtime/kv_layouts.hpp"

#include <cstddef>

namespace sieve::runtime {

// The core kernels (CPU and CUDA) address pages through the view's strides (util/page_layout.hpp).
uint32_t core_kernel_kv_layouts() { return SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED; }

const char* kv_layout_name(uint32_t layout_bit) {
  switch (layout_bit) {
    case SIEVE_KV_LAYOUT_HND: return "hnd";
    case SIEVE_KV_LAYOUT_NHD: return "nhd";
    case SIEVE_KV_LAYOUT_COMBINED: return "combined";
    default: return "unknown";
  }
}

std::vector<std::string> kv_layout_refusals(const ResolvedChains& chains, uint32_t layout_bit,
                                            const std::string& store_label) {
  std::vector<std::string> out;
  if (layout_bit == SIEVE_KV_LAYOUT_HND) return out;
  const std::string head = "KV store '" + store_label + "' hands out " + kv_layout_name(layout_bit) + " pages, but ";
  for (const ResolvedInstance& inst : chains.instances) {
    const sieve_policy_descriptor& d = inst.descriptor();
    const uint32_t declared = SIEVE_HAS_FIELD(&d, sieve_policy_descriptor, kv_layouts) ? d.kv_layouts : 0;
    if (!(declared & layout_bit))
      out.push_back(head + "plugin '" + inst.plugin.name() + "' (instance " + inst.label +
                    ") reads only the layouts its descriptor declares in kv_layouts" +
                    (declared ? "" : " (none: compact hnd)") + "; choose layout=hnd or a plugin that reads " +
                    kv_layout_name(layout_bit));
  }
  if (core_kernel_kv_layouts() & layout_bit) return out;
  // A phase with no chains (or a layer's empty chain) is dense attention by the core kernel.
  bool core_kernel = false;
  for (const auto& per_phase : chains.chains) {
    core_kernel |= per_phase.empty();
    for (const auto& chain : per_phase) {
      bool overridden = false;
      for (size_t i : chain) overridden |= chains.instances[i].api().attend != nullptr;
      core_kernel |= !overridden;
    }
  }
  if (core_kernel) out.push_back(head + "the core attention kernel reads only compact hnd pages");
  return out;
}

}  // namespace sieve::runtime
