// sieve::require for checks on a per-call path: the message is built only when the check fails
// (a std::string from a long literal, std::to_string and concatenation are heap allocations that
// every passing call would pay for). Pass a literal, or a callable that returns the message.
#pragma once
#include <concepts>
#include <string>

#include "sieve/util/error.hpp"

namespace sieve {

inline void require(bool ok, sieve_status s, const char* message) {
  if (!ok) throw Error(s, message);
}

template <class MakeMessage>
  requires std::invocable<MakeMessage&>
void require(bool ok, sieve_status s, MakeMessage&& make_message) {
  if (!ok) throw Error(s, std::string(make_message()));
}

}  // namespace sieve
