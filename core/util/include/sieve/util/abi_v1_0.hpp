// Where each growable ABI struct's last v1.0 field ends. A producer built against 1.0 fills
// exactly this many bytes; anything a later minor appended is read only through SIEVE_HAS_FIELD.
// tests/abi/v1_0 pins the v1.0 layouts these offsets come from.
#pragma once

#include <cstddef>
#include <type_traits>

#include "sieve/sieve.h"

namespace sieve::util {

template <class T>
constexpr size_t v1_0_size() {
  if constexpr (std::is_same_v<T, sieve_policy_descriptor>)
    return offsetof(sieve_policy_descriptor, cuda_graph) + sizeof(uint32_t);
  else if constexpr (std::is_same_v<T, sieve_plugin>)
    return offsetof(sieve_plugin, kv_store) + sizeof(void*);
  else if constexpr (std::is_same_v<T, sieve_policy_api>)
    return offsetof(sieve_policy_api, end_step) + sizeof(void*);
  else if constexpr (std::is_same_v<T, sieve_kv_store_api>)
    return offsetof(sieve_kv_store_api, bytes_in_use) + sizeof(void*);
  else if constexpr (std::is_same_v<T, sieve_kv_config>)
    return offsetof(sieve_kv_config, keep_pre_rope_k) + sizeof(int32_t);
  else
    return sizeof(T);  // not grown since 1.0
}

}  // namespace sieve::util
