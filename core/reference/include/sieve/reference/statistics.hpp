// Summaries the diagnostics report over many (query, head) rows: a mean with its lower tail, and
// the rank agreement of two attention rows (sieve delta-diag, the long-context generator's
// checks). f64 throughout.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace sieve::reference {

// The p-quantile of ascending `sorted` values as the lower neighbour: sorted[floor(p (n − 1))]
// (no interpolation, so it is always one of the values). p in [0, 1]; `sorted` non-empty.
double lower_quantile(std::span<const double> sorted, double p);

struct Summary {
  double mean = 0, p10 = 0;  // p10: lower_quantile(·, 0.1)
  int64_t n = 0;
};
// Mean and p10 of v; all zero for an empty v.
Summary summarize(std::vector<double> v);

// Spearman rank correlation: tied values share their mean rank, then Pearson of the ranks. Rows
// without spread rank nothing: 1 when both are constant (or have fewer than two values), 0 when
// only one is. Throws std::invalid_argument when the sizes differ.
double spearman(std::span<const double> a, std::span<const double> b);

}  // namespace sieve::reference
