// Integer option values of sieve_bench (the suite's and the policy benchmark's flags): one parser,
// so every flag refuses the same things (empty, trailing characters, out of range).
#pragma once
#include <cstdint>
#include <string>

namespace sieve::bench {

// A whole decimal integer in [lo, hi] into *out; false (out untouched) otherwise.
bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out);

}  // namespace sieve::bench
