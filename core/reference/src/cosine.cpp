#include "sieve/reference/cosine.hpp"

#include <cmath>

namespace sieve::reference {

double cosine(const float* a, const float* b, int64_t d) {
  double ab = 0, aa = 0, bb = 0;
  for (int64_t i = 0; i < d; ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  if (aa > 0 && bb > 0) return ab / std::sqrt(aa * bb);
  if (std::isnan(aa) || std::isnan(bb)) return std::nan("");
  return aa == 0 && bb == 0 ? 1.0 : 0.0;
}

}  // namespace sieve::reference
