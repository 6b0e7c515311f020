// The diagnostics' summaries (core/reference statistics.hpp): Spearman against hand-computed rank
// correlations (ties, reversal, a monotone transform, rows without spread) and the mean / lower
// quantile summary.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "sieve/reference/statistics.hpp"

namespace {

using sieve::reference::lower_quantile;
using sieve::reference::spearman;
using sieve::reference::summarize;

// The ranks are half-integers and their sums exact; what rounds is the final sqrt and division
// (one rounding each) against the expected value's own one or two: 4 ulp covers them.
constexpr double kTol = 4 * DBL_EPSILON;

TEST(Spearman, HandComputedWithoutTies) {
  // Rank differences (-1, 1, -1, 1, 0): rho = 1 - 6 * 4 / (5 * (25 - 1)) = 0.8.
  const std::vector<double> a = {1, 2, 3, 4, 5}, b = {2, 1, 4, 3, 5};
  EXPECT_NEAR(spearman(a, b), 0.8, kTol);
  EXPECT_NEAR(spearman(b, a), 0.8, kTol);
}

TEST(Spearman, TiesShareTheirMeanRank) {
  // Ranks (0, 1.5, 1.5, 3) and (0, 1, 2, 3) around 1.5: sab = 4.5, saa = 4.5, sbb = 5.
  const std::vector<double> a = {1, 2, 2, 3}, b = {1, 2, 3, 4};
  EXPECT_NEAR(spearman(a, b), 4.5 / std::sqrt(4.5 * 5), kTol);
  EXPECT_NEAR(spearman(a, b), 3 / std::sqrt(10.0), kTol);
}

TEST(Spearman, OnlyTheOrderCounts) {
  const std::vector<double> a = {0.3, -1.2, 4.0, 0.01, 2.5, 1e-9};
  std::vector<double> up, down;
  for (double x : a) up.push_back(std::exp(3 * x) + 1), down.push_back(-x * x * x);
  EXPECT_DOUBLE_EQ(spearman(a, up), 1.0);
  EXPECT_DOUBLE_EQ(spearman(a, down), -1.0);
}

TEST(Spearman, RowsWithoutSpreadAndBadSizes) {
  const std::vector<double> flat = {0.25, 0.25, 0.25}, other = {0.5, 0.5, 0.5}, ramp = {0.1, 0.2, 0.7};
  EXPECT_EQ(spearman(flat, other), 1.0);  // neither ranks anything
  EXPECT_EQ(spearman(flat, ramp), 0.0);   // one does, the other cannot follow
  EXPECT_EQ(spearman(std::vector<double>{3.0}, std::vector<double>{-1.0}), 1.0);
  EXPECT_EQ(spearman(std::vector<double>{}, std::vector<double>{}), 1.0);
  EXPECT_THROW(spearman(flat, std::vector<double>{1, 2}), std::invalid_argument);
}

TEST(Summarize, MeanAndLowerTenthPercentile) {
  const auto s = summarize({7, 3, 10, 0, 5, 1, 9, 2, 8, 4, 6});  // 0..10 shuffled
  EXPECT_EQ(s.n, 11);
  EXPECT_DOUBLE_EQ(s.mean, 5.0);
  EXPECT_EQ(s.p10, 1.0);  // sorted[floor(0.1 * 10)]
  const auto ten = summarize({10, 9, 8, 7, 6, 5, 4, 3, 2, 1});
  EXPECT_EQ(ten.p10, 1.0);  // floor(0.1 * 9) = 0: the smallest
  EXPECT_DOUBLE_EQ(ten.mean, 5.5);
  const auto none = summarize({});
  EXPECT_EQ(none.n, 0);
  EXPECT_EQ(none.mean, 0.0);
  EXPECT_EQ(none.p10, 0.0);
}

TEST(Summarize, LowerQuantileIsAlwaysOneOfTheValues) {
  const std::vector<double> v = {1, 2, 3, 4};
  EXPECT_EQ(lower_quantile(v, 0.5), 2.0);  // floor(1.5): the lower neighbour, no interpolation
  EXPECT_EQ(lower_quantile(v, 0.0), 1.0);
  EXPECT_EQ(lower_quantile(v, 1.0), 4.0);
  EXPECT_THROW(lower_quantile(std::vector<double>{}, 0.5), std::invalid_argument);
}

}  // namespace
