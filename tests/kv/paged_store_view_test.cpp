// Incremental views of the paged CPU store (view_delta.hpp): every view of a long random serving
// run matches a model of the resident tokens, and a decode step re-publishes only what changed.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "kv_test_support.hpp"
#include "sieve/kv/paged_store.hpp"
#include "sieve/kv/view_delta.hpp"
#include "view_scenario.hpp"

using namespace sieve;

namespace {

using kv_test::make_append;
using kv_test::make_config;
using kv_test::Store;
using kv_test::ViewScenario;
using kv_test::ViewTables;
using kv::ViewDelta;

struct CpuBackend final : kv_test::Backend {
  const DLTensor* tokens(const HostTensor& h, int) override { return &h.dl(); }
  ViewTables read(const sieve_paged_kv& view) override {
    ViewTables t;
    auto i32 = [](const DLTensor& d) {
      const int32_t* p = data_ptr<int32_t>(d);
      return std::vector<int32_t>(p, p + d.shape[0]);
    };
    t.indptr = i32(view.indptr);
    t.indices = i32(view.indices);
    t.last = i32(view.last_page_len);
    t.indptr_host.assign(view.indptr_host, view.indptr_host + view.batch + 1);
    t.last_host.assign(view.last_page_len_host, view.last_page_len_host + view.batch);
    const size_t n = size_t(numel(view.k_pages));
    t.k.assign(data_ptr<float>(view.k_pages), data_ptr<float>(view.k_pages) + n);
    t.v.assign(data_ptr<float>(view.v_pages), data_ptr<float>(view.v_pages) + n);
    return t;
  }
};

sieve_kv_config scenario_config(int max_batch) {
  return make_config(ViewScenario::kLayers, ViewScenario::kHkv, ViewScenario::kD, ViewScenario::kPage, kF32,
                     ViewScenario::kPages, kCpu, max_batch);
}

}  // namespace

TEST(PagedCpuStoreViews, EveryViewOfARandomServingRunIsExact) {
  for (uint32_t seed : {1u, 2u, 3u}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Store st(scenario_config(8));
    CpuBackend be;
    ViewScenario run(st, be, 8, seed);
    run.run(500);
    EXPECT_GT(run.views_checked(), 1000);
  }
}

// White box: which views merge new indices (the indices move to the other buffer) and which
// leave the table as it was.
TEST(PagedCpuStoreViews, ADecodeStepMergesIndicesOnlyWhenAPageIsAdded) {
  const int page = 16;
  Store st(make_config(1, 1, 4, page, kF32, 64, kCpu, 4));
  std::vector<int32_t> ids = {st.add(), st.add()};
  auto step = [&](std::vector<int32_t> counts) {
    std::vector<int32_t> indptr = {0, counts[0], counts[0] + counts[1]};
    HostTensor k({indptr.back(), 1, 4}, kF32), v({indptr.back(), 1, 4}, kF32);
    auto a = make_append(0, ids, indptr, &k.dl(), &v.dl());
    ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK) << st.error();
  };
  auto view = [&](std::vector<int32_t> batch) {
    sieve_paged_kv v{};
    EXPECT_EQ(st.api->view(st.s, 0, batch.data(), int32_t(batch.size()), &v), SIEVE_OK) << st.error();
    return v;
  };
  step({15, 3});  // 1 + 1 pages, last 15 and 3
  sieve_paged_kv v0 = view(ids);
  const void* first = v0.indices.data;
  sieve_paged_kv again = view(ids);
  EXPECT_EQ(again.indices.data, first) << "no change: nothing merged";
  step({1, 1});  // 16 and 4: no page added
  sieve_paged_kv v1 = view(ids);
  EXPECT_EQ(v1.indices.data, first) << "last_page_len moved only";
  EXPECT_EQ(v1.last_page_len_host[0], 16);
  EXPECT_EQ(v1.last_page_len_host[1], 4);
  std::vector<int32_t> before(data_ptr<int32_t>(v1.indices), data_ptr<int32_t>(v1.indices) + 2);
  step({1, 0});  // the first sequence gains a page: the second one's page moves up by one
  sieve_paged_kv v2 = view(ids);
  EXPECT_NE(v2.indices.data, first) << "a page was added: merged into the other buffer";
  ASSERT_EQ(v2.indices.shape[0], 3);
  EXPECT_EQ(v2.indptr_host[1], 2);
  EXPECT_EQ(data_ptr<int32_t>(v2.indices)[0], before[0]);
  EXPECT_EQ(data_ptr<int32_t>(v2.indices)[2], before[1]);
  EXPECT_EQ(v2.last_page_len_host[0], 1);
  // Another batch order is a full rebuild; the same order again afterwards is incremental.
  sieve_paged_kv r = view({ids[1], ids[0]});
  EXPECT_EQ(r.indptr_host[1], 1);
  EXPECT_EQ(data_ptr<int32_t>(r.indices)[0], before[1]);
  EXPECT_EQ(data_ptr<int32_t>(r.indices)[1], before[0]);
}

// A new sequence that gets a removed sequence's id (and, here, its pages in another order) must
// not be described against the old one's pages, even when it holds more pages than they did.
TEST(PagedCpuStoreViews, ASequenceReusingARemovedIdIsRebuilt) {
  const int page = 16;
  Store st(make_config(1, 1, 4, page, kF32, 64, kCpu, 4));
  std::vector<int32_t> ids = {st.add(), st.add()};
  auto append = [&](std::vector<int32_t> counts, float base) {
    std::vector<int32_t> indptr = {0, counts[0], counts[0] + counts[1]};
    HostTensor k({indptr.back(), 1, 4}, kF32), v({indptr.back(), 1, 4}, kF32);
    for (int64_t r = 0; r < indptr.back(); ++r)
      for (int i = 0; i < 4; ++i) k.set(r * 4 + i, base + float(r));
    auto a = make_append(0, ids, indptr, &k.dl(), &v.dl());
    ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK) << st.error();
  };
  append({2 * page, 5}, 0);  // the first sequence: two full pages
  sieve_paged_kv v{};
  ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 2, &v), SIEVE_OK);
  ASSERT_EQ(st.api->remove_sequence(st.s, ids[0]), SIEVE_OK);
  int32_t again = -1;
  ASSERT_EQ(st.api->add_sequence(st.s, &again), SIEVE_OK);
  ASSERT_EQ(again, ids[0]) << "the test needs the id reused";
  append({3 * page, 0}, 1000);  // three pages: the freed two (last freed first) and a new one
  ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 2, &v), SIEVE_OK) << st.error();
  ASSERT_EQ(v.indptr_host[1], 3);
  for (int t = 0; t < 3 * page; ++t) {
    const int32_t p = data_ptr<int32_t>(v.indices)[t / page];
    EXPECT_EQ(data_ptr<float>(v.k_pages)[(int64_t(p) * page + t % page) * 4], 1000.0f + float(t)) << "token " << t;
  }
}

// The CUDA store's per-entry merge (merged_page, one thread per entry) and the CPU store's
// per-sequence copies (apply_view_delta) agree on random deltas: empty sequences, sequences that
// keep everything, nothing (a rebuild), or part of their previous pages, ragged additions.
TEST(ViewDelta, PerEntryMergeEqualsPerSequenceCopies) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t B = 1 + int32_t(rng() % 20);
    std::vector<int32_t> previous(size_t(1 + rng() % 200));
    for (auto& p : previous) p = int32_t(rng() % 100000);
    std::vector<int32_t> indptr{0}, last, keep_from, keep, added_indptr{0}, added;
    for (int32_t b = 0; b < B; ++b) {
      const int32_t k = rng() % 4 == 0 ? 0 : int32_t(rng() % 12);
      const int32_t from = k ? int32_t(rng() % (previous.size() - std::min<size_t>(previous.size(), size_t(k)) + 1)) : 0;
      const int32_t kk = std::min<int32_t>(k, int32_t(previous.size()) - from);
      const int32_t n_add = rng() % 3 == 0 ? 0 : int32_t(rng() % 5);
      keep_from.push_back(from);
      keep.push_back(kk);
      for (int32_t i = 0; i < n_add; ++i) added.push_back(-1 - int32_t(rng() % 1000));
      added_indptr.push_back(int32_t(added.size()));
      indptr.push_back(indptr.back() + kk + n_add);
      last.push_back(kk + n_add ? 1 : 0);
    }
    std::vector<int32_t> packed;
    for (auto* part : {&indptr, &last, &keep_from, &keep, &added_indptr, &added})
      packed.insert(packed.end(), part->begin(), part->end());
    ASSERT_EQ(packed.size(), ViewDelta::packed_size(B, int32_t(added.size())));
    const int32_t nnz = indptr.back();
    std::vector<int32_t> by_sequence(size_t(nnz) + 1, 12345), by_entry(size_t(nnz) + 1, 12345);
    kv::apply_view_delta(packed.data(), B, previous.data(), by_sequence.data());
    for (int32_t i = 0; i < nnz; ++i) by_entry[size_t(i)] = kv::merged_page(packed.data(), B, previous.data(), i);
    ASSERT_EQ(by_sequence, by_entry) << "trial " << trial;
    EXPECT_EQ(by_sequence.back(), 12345) << "wrote past nnz";
    // Spot check against the definition: sequence b = its kept pages, then its added ones.
    for (int32_t b = 0; b < B; ++b)
      for (int32_t j = 0; j < indptr[b + 1] - indptr[b]; ++j)
        ASSERT_EQ(by_sequence[size_t(indptr[b] + j)],
                  j < keep[b] ? previous[size_t(keep_from[b] + j)] : added[size_t(added_indptr[b] + j - keep[b])]);
  }
}
