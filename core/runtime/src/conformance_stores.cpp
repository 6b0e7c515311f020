// The one place that lists the KV stores `sieve conform` checks: the core's own, then every
// plugin's. (When the registry names stores itself, this list becomes its list.)
#include "sieve/kv/paged_store.hpp"
#include "sieve/runtime/conformance.hpp"

namespace sieve::runtime {

namespace {
std::string store_name(const sieve_kv_store_api* api) {
  if (SIEVE_HAS_FIELD(api, sieve_kv_store_api, descriptor) && api->descriptor && is_identifier(api->descriptor->name))
    return api->descriptor->name;
  return bounded_text(api->name);
}
}  // namespace

std::vector<StoreUnderTest> known_stores(const std::vector<LoadedPlugin>& plugins) {
  std::vector<StoreUnderTest> out;
  out.push_back({store_name(kv::paged_cpu_store_api()), "built-in", kv::paged_cpu_store_api(), SIEVE_DEVICE_CPU});
  if (const sieve_kv_store_api* cuda = kv::paged_cuda_store_api())  // NULL in a build without CUDA
    out.push_back({store_name(cuda), "built-in", cuda, SIEVE_DEVICE_CUDA});
  for (const auto& p : plugins)
    if (p.kv_store()) out.push_back({store_name(p.kv_store()), p.path, p.kv_store(), SIEVE_DEVICE_CPU});
  return out;
}

}  // namespace sieve::runtime
