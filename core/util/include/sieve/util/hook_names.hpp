// The names of sieve_hook_bits, for messages (shared by the runtime and plugin support).
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>

#include "sieve/policy.h"

namespace sieve {

// "select, attend" for SIEVE_HOOK_SELECT | SIEVE_HOOK_ATTEND, in the hooks' call order; bits the
// ABI does not define as hex; "no hook" for 0.
inline std::string hook_names(uint32_t bits) {
  static constexpr struct {
    uint32_t bit;
    const char* name;
  } kHooks[] = {{SIEVE_HOOK_ON_APPEND, "on_append"}, {SIEVE_HOOK_SELECT, "select"},
                {SIEVE_HOOK_ATTEND, "attend"},       {SIEVE_HOOK_OBSERVE, "observe"},
                {SIEVE_HOOK_CORRECT, "correct"},     {SIEVE_HOOK_END_STEP, "end_step"}};
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  uint32_t known = 0;
  for (const auto& h : kHooks) {
    known |= h.bit;
    if (bits & h.bit) add(h.name);
  }
  if (bits & ~known) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%x", unsigned(bits & ~known));
    add(std::string("unknown bits ") + hex);
  }
  return out.empty() ? "no hook" : out;
}

}  // namespace sieve
