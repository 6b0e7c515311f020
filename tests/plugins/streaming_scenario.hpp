// A ragged batch in a FakePagedKv plus the layer call over it, for the streaming plugin's tests,
// and the checks that a written selection matches the naive reference.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "mocks/fake_paged_kv.hpp"
#include "streaming_reference.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"

namespace sieve::testing {

inline constexpr int32_t kTestLayer = 1;

struct StreamingScenario {
  StreamingScenario(int32_t page_size, std::vector<StreamingCase> cases_in, uint32_t phase_in,
                    uint32_t seed = 7, sieve_kv_store* kv = nullptr,
                    const sieve_kv_store_api* kv_api = nullptr)
      : rng(seed),
        cases(std::move(cases_in)),
        phase(phase_in),
        geometry(test_geometry(page_size, std::max<int32_t>(8, int32_t(cases.size())), 4096)),
        store(test_kv_config(geometry, pages_needed(cases, page_size))) {
    std::vector<int32_t> ids, n_new;
    for (const StreamingCase& c : cases) {
      int32_t id = -1;
      EXPECT_EQ(store.add_sequence(&id), SIEVE_OK);
      EXPECT_EQ(store.append_random(id, c.kv_len, rng), SIEVE_OK) << store.last_error();
      ids.push_back(id);
      n_new.push_back(c.n_new);
    }
    call = std::make_unique<LayerCall>(store, geometry, phase, kTestLayer, ids, n_new, rng, kv, kv_api);
  }
  static int32_t pages_needed(const std::vector<StreamingCase>& cases, int32_t page_size) {
    int32_t n = 1;
    for (const StreamingCase& c : cases) n += (c.kv_len + page_size - 1) / page_size;
    return n;
  }
  bool decode() const { return phase == SIEVE_PHASE_DECODE; }
  std::vector<std::vector<int32_t>> reference(int64_t sink, int64_t window) const {
    return streaming_reference(cases, decode(), sink, window, geometry.page_size);
  }
  int64_t rows() const {
    int64_t r = 0;
    const int32_t q_block = decode() ? 1 : geometry.page_size;
    for (const StreamingCase& c : cases) r += (c.n_new + q_block - 1) / q_block;
    return r;
  }

  std::mt19937 rng;
  std::vector<StreamingCase> cases;
  uint32_t phase;
  sieve_geometry geometry;
  FakePagedKv store;
  std::unique_ptr<LayerCall> call;
};

// The selection header, every list, and that nothing outside [0, n_rows] / [0, nnz) was written.
inline void expect_selection_is(const sieve_selection& sel, const std::vector<int32_t>& indptr,
                                const std::vector<int32_t>& indices,
                                const std::vector<std::vector<int32_t>>& expected, bool decode,
                                int32_t page_size) {
  EXPECT_EQ(sel.kind, uint32_t(SIEVE_SEL_BLOCKS));
  EXPECT_EQ(sel.heads, uint32_t(SIEVE_SEL_PER_SEQUENCE));
  EXPECT_EQ(sel.q_block, decode ? 1 : page_size);
  EXPECT_EQ(sel.k_block_pages, 1);
  ASSERT_EQ(sel.n_rows, int32_t(expected.size()));
  const int64_t nnz = total_entries(expected);
  ASSERT_EQ(indptr[0], 0);
  for (size_t r = 0; r < expected.size(); ++r) {
    ASSERT_EQ(indptr[r + 1] - indptr[r], int32_t(expected[r].size())) << "row " << r;
    const std::vector<int32_t> got(indices.begin() + indptr[r], indices.begin() + indptr[r + 1]);
    EXPECT_EQ(got, expected[r]) << "row " << r;
  }
  for (size_t i = expected.size() + 1; i < indptr.size(); ++i)
    EXPECT_EQ(indptr[i], kSelectionPoison) << "indptr[" << i << "] past n_rows was written";
  for (size_t i = size_t(nnz); i < indices.size(); ++i)
    EXPECT_EQ(indices[i], kSelectionPoison) << "indices[" << i << "] past nnz was written";
}

}  // namespace sieve::testing
