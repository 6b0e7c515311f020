// User text inside a one-line error message: control characters (a newline, ESC sequences that
// would drive the terminal) and bytes that are not UTF-8 are written as C escapes, so the message
// stays one line and shows exactly what was typed. Printable ASCII and valid UTF-8 pass unchanged.
#pragma once
#include <cstdio>
#include <string>
#include <string_view>

namespace sieve {

namespace escape_detail {
// Length of the valid UTF-8 sequence at s[i] that encodes a printable character (no C1 control,
// U+0080..U+009F, no overlong form, no surrogate); 0 when there is none.
inline size_t printable_utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const auto cont = [&](size_t k) { return i + k < s.size() && (b(k) & 0xC0) == 0x80; };
  const unsigned char c = b(0);
  if (c >= 0xC2 && c <= 0xDF && cont(1)) return (c == 0xC2 && b(1) < 0xA0) ? 0 : 2;
  if (c >= 0xE0 && c <= 0xEF && cont(1) && cont(2)) {
    if ((c == 0xE0 && b(1) < 0xA0) || (c == 0xED && b(1) >= 0xA0)) return 0;
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4 && cont(1) && cont(2) && cont(3)) {
    if ((c == 0xF0 && b(1) < 0x90) || (c == 0xF4 && b(1) >= 0x90)) return 0;
    return 4;
  }
  return 0;
}
}  // namespace escape_detail

inline std::string escape_for_message(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += char(c);
      ++i;
      continue;
    }
    if (c >= 0x80) {
      if (const size_t n = escape_detail::printable_utf8_length(s, i)) {
        out.append(s.substr(i, n));
        i += n;
        continue;
      }
    }
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default: {
        char hex[5];
        std::snprintf(hex, sizeof hex, "\\x%02X", unsigned(c));
        out += hex;
      }
    }
    ++i;
  }
  return out;
}

}  // namespace sieve
