// An exception that carries an ABI status. Used inside the C++ side of a table implementation;
// the C trampolines catch it (and everything else) and turn it into status + last_error, so no
// exception ever crosses the boundary.
#pragma once
#include <stdexcept>
#include <string>

#include "sieve/abi.h"

namespace sieve {
struct Error : std::runtime_error {
  sieve_status status;
  Error(sieve_status s, const std::string& message) : std::runtime_error(message), status(s) {}
};
[[noreturn]] inline void fail(sieve_status s, const std::string& message) { throw Error(s, message); }
inline void require(bool ok, sieve_status s, const std::string& message) {
  if (!ok) throw Error(s, message);
}
}  // namespace sieve
