// The one exception type of Sieve's C++ code (runtime, internal libraries, plugins: the plugin
// SDK names it sieve::plugin::Error): a message plus the ABI status it stands for. The C
// trampolines catch it (and everything else) and turn it into status + last_error, so no
// exception ever crosses the boundary. Installed with the plugin headers; needs only sieve/abi.h.
#pragma once
#include <stdexcept>
#include <string>

#include "sieve/abi.h"

namespace sieve {

class Error : public std::runtime_error {
 public:
  Error(sieve_status status, const std::string& message) : std::runtime_error(message), status_(status) {}
  sieve_status status() const noexcept { return status_; }

 private:
  sieve_status status_;
};

[[noreturn]] inline void fail(sieve_status s, const std::string& message) { throw Error(s, message); }
inline void require(bool ok, sieve_status s, const std::string& message) {
  if (!ok) throw Error(s, message);
}

}  // namespace sieve
