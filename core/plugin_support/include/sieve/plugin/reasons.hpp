// Reasons: the C++ face of a sieve_reason_sink. validate() reports every reason a geometry or a
// parameter set cannot be served, not just the first; the status follows from what was reported.
#pragma once
#include <sieve/abi.h>

#include <string>
#include <utility>
#include <vector>

#include "sieve/plugin/error.hpp"

namespace sieve::plugin {

class Reasons {
 public:
  Reasons() = default;  // collects only (see messages())
  explicit Reasons(sieve_reason_sink sink) : sink_(sink) {}

  // The request is wrong (a value out of range, an impossible geometry): INVALID_ARGUMENT.
  template <class... Args>
  void invalid(Args&&... args) {
    add(SIEVE_ERR_INVALID_ARGUMENT, str(std::forward<Args>(args)...));
  }
  // The request is valid but this plugin does not do it (a dtype, a device): UNSUPPORTED.
  template <class... Args>
  void unsupported(Args&&... args) {
    add(SIEVE_ERR_UNSUPPORTED, str(std::forward<Args>(args)...));
  }
  void add(sieve_status status, std::string message);

  bool empty() const noexcept { return messages_.empty(); }
  // SIEVE_OK when nothing was reported; INVALID_ARGUMENT if any reason was one; else UNSUPPORTED
  // (or the status of the reasons added).
  sieve_status status() const noexcept { return status_; }
  const std::vector<std::string>& messages() const noexcept { return messages_; }
  // Every reason on one line, "a; b; c" (for create's one error line).
  std::string joined() const;

 private:
  sieve_reason_sink sink_{nullptr, nullptr};
  sieve_status status_ = SIEVE_OK;
  std::vector<std::string> messages_;
};

// Hand one line to a sink; a sink without a callback is ignored. Never throws.
void emit(sieve_reason_sink sink, const char* message) noexcept;

}  // namespace sieve::plugin
