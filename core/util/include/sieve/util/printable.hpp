// Untrusted text (file names, bytes from a file, anything a user typed) made safe to put in a
// one-line message: newline, CR and tab as \n \r \t, other control characters (C0, DEL, C1) and
// bytes that are not valid UTF-8 as \xNN, so a message stays one line, shows exactly what was
// given and cannot drive the terminal, while readable UTF-8 passes unchanged. A backslash stays
// as it is, which makes printable(printable(s)) == printable(s): the CLI's last line of defence
// (core/cli/src/error_line.cpp) escapes whole messages whose parts were escaped already.
// Long text is cut at max_bytes (npos: never), with a mark saying how much was left out.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace sieve {

namespace detail {
// Length of the valid UTF-8 sequence (not a C1 control, not overlong, not a surrogate) starting
// at s[i], or 0.
inline size_t utf8_sequence(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  const size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? (c < 0xf0 ? 3 : 0) : c >= 0xc2 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((b(k) & 0xc0) != 0x80) return 0;
  if (n == 2 && c == 0xc2 && b(1) < 0xa0) return 0;  // U+0080..U+009F: C1 controls
  if (n == 3 && ((c == 0xe0 && b(1) < 0xa0) || (c == 0xed && b(1) >= 0xa0))) return 0;
  if (n == 4 && ((c == 0xf0 && b(1) < 0x90) || (c == 0xf4 && b(1) >= 0x90))) return 0;
  return n;
}
}  // namespace detail

inline std::string printable(std::string_view s, size_t max_bytes = 256) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  size_t i = 0;
  while (i < s.size() && out.size() < max_bytes) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
      ++i;
    } else if (const size_t n = c >= 0x80 ? detail::utf8_sequence(s, i) : 0; n > 0) {
      out.append(s.substr(i, n));
      i += n;
    } else if (c == '\n' || c == '\r' || c == '\t') {
      out += {'\\', c == '\n' ? 'n' : c == '\r' ? 'r' : 't'};
      ++i;
    } else {
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
      ++i;
    }
  }
  if (i < s.size()) out += "... (" + std::to_string(s.size() - i) + " more bytes)";
  return out;
}

}  // namespace sieve
