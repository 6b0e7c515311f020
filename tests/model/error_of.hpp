// The one-line message a refusal carries, for tests that check what a user reads.
#pragma once
#include <string>

#include "sieve/util/error.hpp"

namespace sieve::test {

// The message of the sieve::Error `f` throws ("" if it does not throw).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const sieve::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace sieve::test
