// Errors inside a plugin: sieve::Error (sieve/util/error.hpp), a C++ exception that carries an
// ABI status. The C trampolines (policy_api.hpp) catch it and turn it into that status plus the
// instance's last_error message, so nothing ever throws across the boundary. The runtime's
// internal libraries a plugin links (core/selection, the seer gate files) throw the same type.
#pragma once
#include <sieve/abi.h>
#include <sieve/util/error.hpp>
#include <sieve/util/status.hpp>

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace sieve::plugin {

// Concatenate anything streamable into one message: str("page ", 3, " of ", n).
template <class... Args>
std::string str(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

using sieve::Error;
// The name of a status code, for messages and tests ("SIEVE_ERR_CAPACITY", "status 42").
using sieve::status_name;

// Throw an Error whose message is the concatenation of `args`.
template <class... Args>
[[noreturn]] void fail(sieve_status status, Args&&... args) {
  throw Error(status, str(std::forward<Args>(args)...));
}

// Map the exception being handled (call only inside a catch block) to a status and write its
// message to `message`. Error keeps its status; std::bad_alloc -> OUT_OF_MEMORY; any other
// exception -> INTERNAL. Never throws.
sieve_status current_exception_status(std::string& message) noexcept;

}  // namespace sieve::plugin
