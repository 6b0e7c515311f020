// The name of an ABI status code, for messages: the runtime, the plugin SDK (installed with its
// headers) and the tests use this one.
#pragma once
#include <string>

#include "sieve/abi.h"

namespace sieve {
// "SIEVE_ERR_VERSION", or nullptr for a value the ABI does not define.
constexpr const char* known_status_name(int status) noexcept {
  switch (status) {
    case SIEVE_OK: return "SIEVE_OK";
    case SIEVE_ERR_INVALID_ARGUMENT: return "SIEVE_ERR_INVALID_ARGUMENT";
    case SIEVE_ERR_UNSUPPORTED: return "SIEVE_ERR_UNSUPPORTED";
    case SIEVE_ERR_VERSION: return "SIEVE_ERR_VERSION";
    case SIEVE_ERR_OUT_OF_MEMORY: return "SIEVE_ERR_OUT_OF_MEMORY";
    case SIEVE_ERR_CAPACITY: return "SIEVE_ERR_CAPACITY";
    case SIEVE_ERR_DEVICE: return "SIEVE_ERR_DEVICE";
    case SIEVE_ERR_NOT_FOUND: return "SIEVE_ERR_NOT_FOUND";
    case SIEVE_ERR_INTERNAL: return "SIEVE_ERR_INTERNAL";
  }
  return nullptr;
}
// "SIEVE_ERR_VERSION", or "status 42" for a value the ABI does not define.
inline std::string status_name(int status) {
  const char* name = known_status_name(status);
  return name ? name : "status " + std::to_string(status);
}
}  // namespace sieve
