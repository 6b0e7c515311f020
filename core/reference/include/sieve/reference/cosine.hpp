// Cosine similarity of two float vectors, summed in f64: the one definition the reference
// statistics (long_context.hpp) and the diagnostics (sieve delta-diag) share.
#pragma once
#include <cstdint>

namespace sieve::reference {

// a·b / (‖a‖ ‖b‖) over d values. Zero vectors, as Delta-KV's keep rule (packing/keep_rule.hpp):
// two zero vectors are the same vector (1), a zero and a non-zero vector are unrelated (0).
// d <= 0 compares two empty (zero) vectors: 1. NaN in either vector gives NaN.
double cosine(const float* a, const float* b, int64_t d);

}  // namespace sieve::reference
