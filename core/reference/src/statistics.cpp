#include "sieve/reference/statistics.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

namespace sieve::reference {

namespace {
// Ranks 0..n-1 in ascending order of x; a run of equal values shares the mean of its ranks.
std::vector<double> ranks(std::span<const double> x) {
  std::vector<size_t> idx(x.size());
  std::iota(idx.begin(), idx.end(), size_t(0));
  std::sort(idx.begin(), idx.end(), [&](size_t i, size_t j) { return x[i] < x[j]; });
  std::vector<double> r(x.size());
  for (size_t i = 0; i < idx.size();) {
    size_t j = i;
    while (j + 1 < idx.size() && x[idx[j + 1]] == x[idx[i]]) ++j;
    for (size_t k = i; k <= j; ++k) r[idx[k]] = 0.5 * double(i + j);
    i = j + 1;
  }
  return r;
}
}  // namespace

double lower_quantile(std::span<const double> sorted, double p) {
  if (sorted.empty()) throw std::invalid_argument("lower_quantile of no values");
  return sorted[size_t(p * double(sorted.size() - 1))];
}

Summary summarize(std::vector<double> v) {
  Summary s;
  s.n = int64_t(v.size());
  if (v.empty()) return s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  std::sort(v.begin(), v.end());
  s.p10 = lower_quantile(v, 0.1);
  return s;
}

double spearman(std::span<const double> a, std::span<const double> b) {
  if (a.size() != b.size())
    throw std::invalid_argument("spearman of rows of " + std::to_string(a.size()) + " and " +
                                std::to_string(b.size()) + " values");
  if (a.size() < 2) return 1.0;
  const std::vector<double> ra = ranks(a), rb = ranks(b);
  // Both rank vectors are a permutation of (tied) 0..n-1: their mean is (n - 1) / 2.
  const double mean = 0.5 * double(a.size() - 1);
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    sab += (ra[i] - mean) * (rb[i] - mean);
    saa += (ra[i] - mean) * (ra[i] - mean);
    sbb += (rb[i] - mean) * (rb[i] - mean);
  }
  if (saa == 0 || sbb == 0) return saa == sbb ? 1.0 : 0.0;
  return sab / std::sqrt(saa * sbb);
}

}  // namespace sieve::reference
