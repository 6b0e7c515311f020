// Overflow-checked integer arithmetic for sizes computed from untrusted input (file headers,
// config values): a wrapped product would make a tiny file "match" a huge layout, so every such
// size goes through here and an overflow becomes one sieve::Error line naming what was computed.
#pragma once
#include <cstdint>
#include <string>

#include "sieve/util/error.hpp"

namespace sieve {

// a * b, or throws SIEVE_ERR_INVALID_ARGUMENT "<what> overflows 64 bits".
inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail(SIEVE_ERR_INVALID_ARGUMENT, what + " overflows 64 bits");
  return r;
}
inline int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail(SIEVE_ERR_INVALID_ARGUMENT, what + " overflows 64 bits");
  return r;
}
// The product of all factors (e.g. a tensor's element count).
inline int64_t checked_product(std::initializer_list<int64_t> factors, const std::string& what) {
  int64_t r = 1;
  for (int64_t f : factors) r = checked_mul(r, f, what);
  return r;
}

}  // namespace sieve
