// What the fuzz targets check beyond "no crash", shared: a violated property aborts with a line
// saying which (the driver, or libFuzzer, then keeps the input), and an error message must be one
// non-empty line of printable text (user bytes escaped, sieve/util/printable.hpp).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <string>

namespace sieve::fuzz {

[[noreturn]] inline void violated(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz property violated: %s: %s\n", what, detail.c_str());
  std::abort();
}

inline void check_message_line(const std::string& message) {
  if (message.empty()) violated("a refusal without a message", "");
  for (unsigned char c : message)
    if (c < 0x20 || c == 0x7F) violated("a message holds a control byte (unescaped user text)", message);
}

}  // namespace sieve::fuzz
