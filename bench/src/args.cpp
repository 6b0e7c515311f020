#include "sieve/bench/args.hpp"

#include <cstdlib>

namespace sieve::bench {

bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace sieve::bench
