// Errors inside a plugin: a C++ exception that carries an ABI status. The C trampolines
// (policy_api.hpp) catch it and turn it into that status plus the instance's last_error message,
// so nothing ever throws across the boundary.
#pragma once
#include <sieve/abi.h>

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

class Error : public std::runtime_error {
 public:
  Error(sieve_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  sieve_status status() const noexcept { return status_; }

 private:
  sieve_status status_;
};

// Throw an Error whose message is the concatenation of `args`.
template <class... Args>
[[noreturn]] void fail(sieve_status status, Args&&... args) {
  throw Error(status, str(std::forward<Args>(args)...));
}

// The name of a status code, for messages and tests ("SIEVE_ERR_CAPACITY").
const char* status_name(sieve_status status) noexcept;

// Map the exception being handled (call only inside a catch block) to a status and write its
// message to `message`. Error keeps its status; std::bad_alloc -> OUT_OF_MEMORY; any other
// exception -> INTERNAL. Never throws.
sieve_status current_exception_status(std::string& message) noexcept;

}  // namespace sieve::plugin
