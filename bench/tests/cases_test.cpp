// The suite's block selections (bench/src/cases.cpp) hold the contract of sieve/attention.h for
// every case the suite runs: one row per (sequence, query block, KV head), each row non-empty,
// strictly increasing, inside the sequence's key blocks and causal (no block starts past the row's
// last query), with the query's own (local) block in it. Host only: the GPU cases' rows are built
// on the host too.
#include "cases.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "sieve/kernels/attention_args.hpp"

namespace sieve::bench {
namespace {

void expect_contract(const Case& c) {
  SCOPED_TRACE(c.name);
  const reference::SelectionRows rows = make_selection(c, 0x5e1 + uint64_t(c.sparsity * 1000));
  const int32_t np = kernels::ceil_div(c.ctx, c.page_size);
  const int32_t n_blocks = kernels::key_blocks(np, c.k_block_pages);
  const int32_t block_keys = c.k_block_pages * c.page_size;
  const int32_t qb = c.prefill() ? c.q_block : 1;
  const int32_t n_qb = kernels::query_blocks(n_new(c), qb);
  ASSERT_EQ(rows.size(), size_t(c.batch) * size_t(n_qb) * size_t(c.hkv));
  for (size_t r = 0; r < rows.size(); ++r) {
    const auto& row = rows[r];
    const int32_t t = int32_t(r / size_t(c.hkv)) % n_qb;
    const int32_t last_pos = c.prefill() ? std::min((t + 1) * qb, c.ctx) - 1 : c.ctx - 1;
    ASSERT_FALSE(row.empty()) << "row " << r;
    for (size_t i = 1; i < row.size(); ++i) ASSERT_LT(row[i - 1], row[i]) << "row " << r << " entry " << i;
    ASSERT_GE(row.front(), 0) << "row " << r;
    ASSERT_LT(row.back(), n_blocks) << "row " << r;
    ASSERT_EQ(row.back(), last_pos / block_keys) << "row " << r << ": the local block, and nothing past it";
  }
}

// The contract for every sparse case of a list; how many there were.
int expect_contract_of_sparse(const std::vector<Case>& cases) {
  int sparse = 0;
  for (const Case& c : cases)
    if (!c.dense()) {
      expect_contract(c);
      ++sparse;
    }
  return sparse;
}

TEST(BenchCases, EveryGpuSelectionHoldsTheRowContract) { EXPECT_GT(expect_contract_of_sparse(gpu_cases(false)), 0); }

TEST(BenchCases, EveryCpuSelectionHoldsTheRowContract) { EXPECT_GT(expect_contract_of_sparse(cpu_cases(false)), 0); }

}  // namespace
}  // namespace sieve::bench
