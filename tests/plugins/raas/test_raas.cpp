// The raas plugin, loaded from its .so, over a FakePagedKv behind MockKvStore: eviction order
// (oldest timestamp first; a page the queries keep attending keeps its fresh stamp and stays),
// prompt pages pinned, resident pages bounded by the budget with the freed bytes really returned
// (bytes_in_use flat), the top_ratio mode, the prefill_policy=quest selection (Quest over the
// prompt pages, every decode page), bad input, and `sieve conform` (in process).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sieve/runtime/conformance.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <random>

#include "mocks/fake_paged_kv.hpp"
#include "mocks/mock_host_services.hpp"
#include "mocks/mock_kv_store.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
using ::testing::_;
using ::testing::HasSubstr;
using ::testing::NiceMock;

struct RaasParams {
  int64_t token_budget = 24;
  double alpha = 1e-4;
  double top_ratio = 0.0;
  bool pin_prefill = true;
  bool prefill_quest = false;
  int64_t prefill_budget = 8;
};

class Raas : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = lib_.policy();
    ASSERT_NE(api_, nullptr);
    fake_ = std::make_unique<FakePagedKv>(test_kv_config(g_, 256));
    store_.delegate_to(*fake_);
    ids_.assign(1, -1);
    ASSERT_EQ(fake_->add_sequence(&ids_[0]), SIEVE_OK);
  }
  void TearDown() override {
    if (p_) api_->destroy(p_);
    EXPECT_EQ(host_.live_allocations(), 0u);
  }
  sieve_status create(const RaasParams& r, std::string* error = nullptr) {
    sieve_param_value v[6] = {
        {SIEVE_PARAM_INT, r.token_budget, 0, nullptr, nullptr, 0},
        {SIEVE_PARAM_FLOAT, 0, r.alpha, nullptr, nullptr, 0},
        {SIEVE_PARAM_FLOAT, 0, r.top_ratio, nullptr, nullptr, 0},
        {SIEVE_PARAM_BOOL, r.pin_prefill ? 1 : 0, 0, nullptr, nullptr, 0},
        {SIEVE_PARAM_ENUM, r.prefill_quest ? 1 : 0, 0, r.prefill_quest ? "quest" : "all", nullptr, 0},
        {SIEVE_PARAM_INT, r.prefill_budget, 0, nullptr, nullptr, 0}};
    ReasonLog err;
    const sieve_status s = api_->create(host_.table(), &g_, v, 6, store_.handle(), store_.api(), &p_, err.sink());
    if (error) *error = err.all();
    return s;
  }
  // Append `n` tokens whose keys are `key` in every channel (+ tiny noise), run the hooks of one
  // step on layer 0 (decode: select with a query of all ones, then end_step).
  void run(uint32_t phase, int32_t n, float key, HostSelection* sel = nullptr) {
    std::normal_distribution<float> noise(0.f, 1e-3f);
    sieve::HostTensor k({n, g_.n_kv_heads, g_.head_dim}, sieve::kF32), v = k;
    for (int64_t i = 0; i < k.numel(); ++i) k.set(i, key + noise(rng_)), v.set(i, noise(rng_));
    const int32_t indptr[2] = {0, n};
    for (int32_t layer = 0; layer < g_.n_layers; ++layer) {
      sieve_kv_append a{SIEVE_HEADER_INIT(sieve_kv_append), layer, 1, ids_.data(), indptr, &k.dl(), &v.dl(), nullptr};
      ASSERT_EQ(fake_->append(&a), SIEVE_OK);
    }
    for (int32_t layer = 0; layer < g_.n_layers; ++layer) {  // the hooks of every layer
      LayerCall call(*fake_, g_, phase, layer, ids_, {n}, rng_, store_.handle(), store_.api());
      auto* q = static_cast<float*>(const_cast<DLTensor*>(call.get()->q)->data);
      std::fill(q, q + int64_t(n) * g_.n_q_heads * g_.head_dim, 1.0f);
      sieve_kv_append a{SIEVE_HEADER_INIT(sieve_kv_append), layer, 1, ids_.data(), indptr, &k.dl(), &v.dl(), nullptr};
      ASSERT_EQ(api_->on_append(p_, call.get(), &a), SIEVE_OK) << api_->last_error(p_);
      HostSelection local(8, 256);
      uint32_t stats = 0;
      ASSERT_EQ(api_->select(p_, call.get(), sel ? sel->get() : local.get(), &stats), SIEVE_OK)
          << api_->last_error(p_);
    }
    const int32_t layers[2] = {0, 1};
    int32_t len = 0;
    fake_->seq_len(0, ids_[0], &len);
    sieve_step_end e{SIEVE_HEADER_INIT(sieve_step_end), phase, 0, 1, ids_.data(), &len, layers, 2,
                     store_.handle(), store_.api()};
    ASSERT_EQ(api_->end_step(p_, &e), SIEVE_OK) << api_->last_error(p_);
  }
  std::vector<int32_t> pages() const { return fake_->pages(0, ids_[0]); }
  uint64_t bytes() const {
    uint64_t b = 0;
    fake_->bytes_in_use(&b);
    return b;
  }

  PluginLibrary lib_{"raas"};
  const sieve_policy_api* api_ = nullptr;
  NiceMock<MockHostServices> host_;
  sieve_geometry g_ = test_geometry(4, 2, 512);  // page 4, 4 q heads, 2 KV heads, d 8, 2 layers
  std::unique_ptr<FakePagedKv> fake_;
  NiceMock<MockKvStore> store_;
  std::vector<int32_t> ids_;
  sieve_policy* p_ = nullptr;
  std::mt19937 rng_{5};
};

TEST_F(Raas, EvictsTheOldestPageKeepsTheAttendedOneAndThePinnedPrompt) {
  RaasParams r;
  r.token_budget = 24;  // 6 resident pages, the 2 prompt pages included
  r.alpha = 0.05;
  ASSERT_EQ(create(r), SIEVE_OK);
  run(SIEVE_PHASE_PREFILL, 8, 0.0f);  // 2 prompt pages, keys ~0: never attended
  const std::vector<int32_t> prompt = pages();
  ASSERT_EQ(prompt.size(), 2u);
  // One "milestone" page of large keys: a query of ones attends it every step.
  for (int i = 0; i < 4; ++i) run(SIEVE_PHASE_DECODE, 1, 3.0f);
  const int32_t milestone = pages()[2];
  // The other resident pages, oldest first; a model of "evict the oldest stamp": a new page
  // joins at the back, evictions take from the front.
  const auto start = pages();
  std::vector<int32_t> expected(start.begin() + 3, start.end());
  for (int step = 0; step < 60; ++step) {
    run(SIEVE_PHASE_DECODE, 1, 0.0f);
    const auto now = pages();
    ASSERT_LE(now.size(), 6u) << "step " << step;
    ASSERT_EQ(now[0], prompt[0]) << "prompt pages are pinned";
    ASSERT_EQ(now[1], prompt[1]);
    ASSERT_EQ(now[2], milestone) << "the attended page keeps the newest stamp";
    if (expected.empty() || now.back() != expected.back()) expected.push_back(now.back());
    while (expected.size() > now.size() - 3) expected.erase(expected.begin());
    ASSERT_EQ(std::vector<int32_t>(now.begin() + 3, now.end()), expected) << "step " << step;
  }
}

TEST_F(Raas, FreedBytesReallyReturnMemoryStaysFlat) {
  RaasParams r;
  r.token_budget = 16;
  ASSERT_EQ(create(r), SIEVE_OK);
  run(SIEVE_PHASE_PREFILL, 6, 0.5f);
  std::vector<uint64_t> trace;
  int evictions = 0;
  EXPECT_CALL(store_, evict(_, _, _, _, _)).WillRepeatedly(
      [&](int32_t l, int32_t id, const int32_t* p, int32_t n, uint64_t* freed) {
        const uint64_t before = bytes();
        const sieve_status s = fake_->evict(l, id, p, n, freed);
        EXPECT_EQ(before - bytes(), *freed) << "freed bytes are what bytes_in_use loses";
        EXPECT_GT(*freed, 0u);
        ++evictions;
        return s;
      });
  for (int step = 0; step < 80; ++step) {
    run(SIEVE_PHASE_DECODE, 1, 0.5f);
    trace.push_back(bytes());
  }
  EXPECT_GT(evictions, 0);
  EXPECT_EQ(pages().size(), 4u);
  // Both layers hold 4 pages from step ~10 on: resident bytes stop growing.
  EXPECT_EQ(trace[79], trace[30]);
  EXPECT_EQ(trace[79], 2u * 4u * (trace[79] / 8u));
  EXPECT_LT(trace[79], trace[79] / 4 * 22 / 2) << "dense would hold 22 pages per layer";
}

TEST_F(Raas, TopRatioStampsTheTopPagesAndPrefillQuestSelectsAmongPromptPages) {
  RaasParams r;
  r.token_budget = 12;  // 3 decode pages (prompt pages are Quest's, not budgeted)
  r.top_ratio = 0.2;
  r.prefill_quest = true;
  r.prefill_budget = 8;  // 2 prompt pages per head: the last prompt page + the best other
  ASSERT_EQ(create(r), SIEVE_OK);
  // Prompt: 5 pages, page 1 with large keys (a query of ones prefers it).
  run(SIEVE_PHASE_PREFILL, 4, 0.0f);
  run(SIEVE_PHASE_PREFILL, 4, 2.0f);
  run(SIEVE_PHASE_PREFILL, 12, 0.0f);
  const auto prompt = pages();
  ASSERT_EQ(prompt.size(), 5u);
  HostSelection sel(8, 512);
  for (int step = 0; step < 30; ++step) run(SIEVE_PHASE_DECODE, 1, 0.1f, &sel);
  const auto now = pages();
  ASSERT_EQ(std::vector<int32_t>(now.begin(), now.begin() + 5), prompt) << "prompt pinned";
  EXPECT_LE(now.size(), 5u + 3u);
  ASSERT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_BLOCKS));
  EXPECT_EQ(sel.sel().heads, uint32_t(SIEVE_SEL_PER_Q_HEAD));
  const auto rows = sel.rows();
  ASSERT_EQ(rows.size(), 4u);
  // The run's last select saw the pages before that step's eviction: 5 prompt + the decode ones.
  for (const auto& row : rows) {
    ASSERT_GE(row.size(), 3u);
    EXPECT_EQ(row[0], 1) << "the best prompt page by the Quest bound";
    EXPECT_EQ(row[1], 4) << "the last prompt page is always kept";
    for (size_t i = 2; i < row.size(); ++i) EXPECT_EQ(row[i], int32_t(5 + i - 2)) << "every decode page";
  }
}

TEST_F(Raas, RefusesBadInputWithAStatusAndAMessage) {
  RaasParams r;
  r.token_budget = 2;
  std::string error;
  EXPECT_NE(create(r, &error), SIEVE_OK);
  EXPECT_THAT(error, HasSubstr("token_budget = 2 is below one page"));
  r.token_budget = 16;
  r.prefill_quest = true;
  r.prefill_budget = 2;
  EXPECT_NE(create(r, &error), SIEVE_OK);
  EXPECT_THAT(error, HasSubstr("prefill_budget = 2 is below one page (page_size = 4)"));
  EXPECT_EQ(std::count(error.begin(), error.end(), '\n'), 1) << "one reason, one line: " << error;
  r.prefill_budget = 8;
  r.pin_prefill = false;
  EXPECT_NE(create(r, &error), SIEVE_OK);
  EXPECT_THAT(error, HasSubstr("pin_prefill"));
  r.prefill_quest = false;
  ASSERT_EQ(create(r), SIEVE_OK);
  EXPECT_NE(api_->end_step(p_, nullptr), SIEVE_OK);
  EXPECT_NE(std::string(api_->last_error(p_)), "");
}

// The declared conformance parameters (evictable prompt), then the prefill Quest selection (it
// needs pinned prompt pages; budgets of one page at the largest conformance page size).
TEST(RaasConform, PassesInProcessWithDefaultsAndThePrefillQuestSelection) {
  const std::vector<sieve::runtime::ParamPairs> cases = {
      {},
      {{"token_budget", "64"}, {"pin_prefill", "true"}, {"prefill_policy", "quest"}, {"prefill_budget", "64"}}};
  for (const auto& params : cases) {
    sieve::runtime::ConformOptions o;
    o.isolate = false;
    o.params = params;
    const auto rep = sieve::runtime::conform(std::string(SIEVE_PLUGIN_DIR) + "/libsieve_raas.so", o);
    for (const auto& c : rep.checks)
      EXPECT_FALSE(!c.passed && !c.skipped) << params.size() << " params: " << c.name << ": " << c.detail;
    EXPECT_TRUE(rep.passed());
  }
}

}  // namespace
