// The one place that lists the KV stores `sieve conform` checks: the registry's (the core's own,
// then every plugin's, each named as a session names it).
#include "sieve/runtime/conformance.hpp"

namespace sieve::runtime {

StoreUnderTest store_under_test(const StoreEntry& e) {
  // A 1.0 table says nothing of its devices: it is run on the CPU.
  return {e.name, e.source, e.api, SIEVE_DEVICE_CPU};
}

std::vector<StoreUnderTest> known_stores(const Registry& registry) {
  std::vector<StoreUnderTest> out;
  for (const StoreEntry& e : registry.stores()) out.push_back(store_under_test(e));
  return out;
}

}  // namespace sieve::runtime
