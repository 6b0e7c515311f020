// Shared by the delta plugin's CPU and CUDA tests: a multi-layer ragged decode batch in a
// FakePagedKv, the plugin's parameter values, and the naive reference selection (written from the
// paper's definition, independently of delta_page_plan.hpp and core/selection).
#pragma once
#include <gtest/gtest.h>
#include <sieve/sieve.h>

#include <algorithm>
#include <memory>
#include <numeric>
#include <random>
#include <vector>

#include "mocks/fake_paged_kv.hpp"
#include "support/layer_call.hpp"

namespace sieve::testing {

// The plugin's values in schema order: token_budget, recent, dense_layers, select_layers,
// per_kv_head. The lists are borrowed: keep the object alive across validate/create.
struct DeltaParams {
  int64_t token_budget = 64;
  int64_t recent = 8;
  std::vector<int64_t> dense{0, 1};
  std::vector<int64_t> select{2};
  bool per_kv_head = false;
  sieve_param_value v[5]{};
  const sieve_param_value* values() {
    v[0] = {SIEVE_PARAM_INT, token_budget, 0, nullptr, nullptr, 0};
    v[1] = {SIEVE_PARAM_INT, recent, 0, nullptr, nullptr, 0};
    v[2] = {SIEVE_PARAM_INT_LIST, 0, 0, nullptr, dense.data(), uint32_t(dense.size())};
    v[3] = {SIEVE_PARAM_INT_LIST, 0, 0, nullptr, select.data(), uint32_t(select.size())};
    v[4] = {SIEVE_PARAM_BOOL, per_kv_head ? 1 : 0, 0, nullptr, nullptr, 0};
    return v;
  }
  static constexpr uint32_t kCount = 5;
};

// A batch of sequences (lengths include the token being decoded) over `n_layers` layers.
struct DeltaScenario {
  DeltaScenario(int32_t page_size, std::vector<int32_t> lens_in, int32_t n_layers = 5,
                uint32_t seed = 11)
      : rng(seed), lens(std::move(lens_in)), geometry(make_geometry(page_size, n_layers, lens)),
        store(test_kv_config(geometry, pages_needed(lens, page_size))) {
    for (int32_t len : lens) {
      int32_t id = -1;
      EXPECT_EQ(store.add_sequence(&id), SIEVE_OK);
      EXPECT_EQ(store.append_random(id, len, rng), SIEVE_OK) << store.last_error();
      ids.push_back(id);
    }
  }
  static sieve_geometry make_geometry(int32_t page_size, int32_t n_layers,
                                      const std::vector<int32_t>& lens) {
    sieve_geometry g = test_geometry(page_size, std::max<int32_t>(8, int32_t(lens.size())), 512);
    g.n_layers = n_layers;
    return g;
  }
  static int32_t pages_needed(const std::vector<int32_t>& lens, int32_t page_size) {
    int32_t n = 1;
    for (int32_t len : lens) n += (len + page_size - 1) / page_size;
    return n;
  }
  // The decode call of one layer (one query per sequence, random post-RoPE queries scaled by
  // `sharpness` so the attention has clear winners).
  std::unique_ptr<LayerCall> call(int32_t layer, float sharpness = 3.f) {
    auto c = std::make_unique<LayerCall>(store, geometry, SIEVE_PHASE_DECODE, layer, ids,
                                         std::vector<int32_t>(lens.size(), 1), rng);
    auto* q = static_cast<float*>(c->get()->q->data);
    for (int64_t i = 0; i < sieve::numel(*c->get()->q); ++i) q[i] *= sharpness;
    c->get()->step = step;
    return c;
  }
  int32_t pages(size_t b) const { return (lens[b] + geometry.page_size - 1) / geometry.page_size; }
  int64_t total_pages() const {
    int64_t n = 0;
    for (size_t b = 0; b < lens.size(); ++b) n += pages(b);
    return n;
  }

  std::mt19937 rng;
  std::vector<int32_t> lens;
  sieve_geometry geometry;
  FakePagedKv store;
  std::vector<int32_t> ids;
  uint64_t step = 7;
};

// Pages the last `recent` tokens touch when the last page holds a single token (the most).
inline int64_t worst_window_pages(int64_t recent, int32_t P) {
  return recent <= 1 ? 1 : 1 + (recent - 1 + P - 1) / P;
}

// The paper's page-based selection for one row, from the definition: the pages holding the last
// `recent` tokens, plus the best (budget_pages - those) earlier pages by score (higher first,
// equal scores: lower page first); every page while the sequence has <= budget_pages pages.
// `score(u)` is S_u of page u.
template <class Score>
std::vector<int32_t> reference_row(int32_t len, int64_t recent, int64_t budget, int32_t P,
                                   Score score) {
  const int32_t n = (len + P - 1) / P;
  const int32_t budget_pages = int32_t(budget / P);
  std::vector<int32_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  if (n <= budget_pages) return all;
  std::vector<bool> keep(size_t(n), false);
  int32_t window = 0;
  for (int64_t t = std::max<int64_t>(0, len - recent); t < len; ++t)
    if (!keep[size_t(t / P)]) keep[size_t(t / P)] = true, ++window;
  std::vector<int32_t> earlier;
  for (int32_t u = 0; u < n; ++u)
    if (!keep[size_t(u)]) earlier.push_back(u);
  std::stable_sort(earlier.begin(), earlier.end(),
                   [&](int32_t a, int32_t b) { return score(a) > score(b); });
  for (int32_t i = 0; i < budget_pages - window && i < int32_t(earlier.size()); ++i)
    keep[size_t(earlier[size_t(i)])] = true;
  std::vector<int32_t> out;
  for (int32_t u = 0; u < n; ++u)
    if (keep[size_t(u)]) out.push_back(u);
  return out;
}

}  // namespace sieve::testing
