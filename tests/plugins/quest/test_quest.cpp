// The quest plugin, loaded from its .so with dlopen, over a FakePagedKv behind MockKvStore:
// decode selections against quest_reference.hpp (min/max recomputed from the keys, full sort)
// over several steps at ragged lengths, per query head and with gqa_share; the dense case;
// prefill maintains metadata and leaves the selection alone; a decode-only chain is caught up
// with a warning; bad input; no allocation in hooks; `sieve conform` passes (in process).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sieve/runtime/conformance.hpp>
#include <sieve/runtime/host_services.hpp>

#include <iostream>
#include <random>

#include "mocks/fake_paged_kv.hpp"
#include "mocks/mock_host_services.hpp"
#include "mocks/mock_kv_store.hpp"
#include "quest_reference.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
using ::testing::_;
using ::testing::HasSubstr;
using ::testing::NiceMock;

class Quest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(lib_.loaded()) << lib_.path() << ": " << lib_.error();
    const sieve_plugin* plugin = lib_.negotiate();
    ASSERT_NE(plugin, nullptr);
    api_ = plugin->policy;
    ASSERT_NE(api_, nullptr);
  }
  void TearDown() override {
    for (sieve_policy* p : policies_) api_->destroy(p);
    EXPECT_EQ(host_.live_allocations(), 0u);
  }
  void make_store(const sieve_geometry& g, const sieve::KvLayout* layout = nullptr) {
    fake_ = std::make_unique<FakePagedKv>(test_kv_config(g, 512));
    if (layout) fake_->set_layout(*layout);
    store_ = std::make_unique<NiceMock<MockKvStore>>();
    store_->delegate_to(*fake_);
  }
  sieve_policy* create(const sieve_geometry& g, int64_t budget, bool gqa_share, std::string* error = nullptr) {
    sieve_param_value v[2] = {{SIEVE_PARAM_INT, budget, 0, nullptr, nullptr, 0},
                              {SIEVE_PARAM_BOOL, gqa_share ? 1 : 0, 0, nullptr, nullptr, 0}};
    sieve_policy* p = nullptr;
    ReasonLog err;
    const sieve_status s = api_->create(host_.table(), &g, v, 2, store_->handle(), store_->api(), &p, err.sink());
    if (error) *error = err.all();
    if (s != SIEVE_OK || !p) return nullptr;
    policies_.push_back(p);
    return p;
  }
  // Append n_new[b] random tokens to every sequence (all layers) and run on_append on `layer`.
  std::unique_ptr<LayerCall> step(sieve_policy* p, uint32_t phase, int32_t layer,
                                  const std::vector<int32_t>& n_new) {
    for (size_t b = 0; b < ids_.size(); ++b)
      if (n_new[b] > 0) {
        EXPECT_EQ(fake_->append_random(ids_[b], n_new[b], rng_), SIEVE_OK);
      }
    auto call = std::make_unique<LayerCall>(*fake_, geometry_, phase, layer, ids_, n_new, rng_,
                                            store_->handle(), store_->api());
    sieve_kv_append a{};
    a.hdr = SIEVE_HEADER_INIT(sieve_kv_append);
    a.layer = layer;
    a.batch = int32_t(ids_.size());
    a.seq_ids = ids_.data();
    a.token_indptr = call->qo_indptr().data();
    if (p) {
      EXPECT_EQ(api_->on_append(p, call->get(), &a), SIEVE_OK) << api_->last_error(p);
    }
    return call;
  }
  void check_decode(sieve_policy* p, LayerCall& call, int32_t budget_pages, bool gqa_share) {
    HostSelection sel(int64_t(ids_.size()) * geometry_.n_q_heads, 4096);
    uint32_t stats = 0;
    ASSERT_EQ(api_->select(p, call.get(), sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
    EXPECT_EQ(stats, uint32_t(SIEVE_STATS_NONE));
    const auto want = quest_reference(call.view(), *call.get()->q, geometry_.n_q_heads, budget_pages, gqa_share);
    int32_t max_pages = 0;
    for (int32_t b = 0; b < call.get()->batch; ++b)
      max_pages = std::max(max_pages, call.view().indptr_host[b + 1] - call.view().indptr_host[b]);
    if (max_pages <= budget_pages) {
      EXPECT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_ALL)) << "every sequence fits: dense";
      return;
    }
    ASSERT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_BLOCKS));
    EXPECT_EQ(sel.sel().heads, uint32_t(gqa_share ? SIEVE_SEL_PER_KV_HEAD : SIEVE_SEL_PER_Q_HEAD));
    EXPECT_EQ(sel.sel().k_block_pages, 1);
    EXPECT_EQ(sel.sel().q_block, 1);
    EXPECT_EQ(sel.rows(), want);
  }

  PluginLibrary lib_{"quest"};
  const sieve_policy_api* api_ = nullptr;
  NiceMock<MockHostServices> host_;
  std::vector<sieve_policy*> policies_;
  sieve_geometry geometry_ = test_geometry(4, 3, 256);  // 4 q heads, 2 KV heads, d 8, page 4
  std::unique_ptr<FakePagedKv> fake_;
  std::unique_ptr<NiceMock<MockKvStore>> store_;
  std::vector<int32_t> ids_;
  std::mt19937 rng_{17};
};

TEST_F(Quest, DecodeSelectionsMatchTheReferenceOverSteps) {
  for (const bool gqa_share : {false, true}) {
    SCOPED_TRACE(gqa_share ? "gqa_share" : "per query head");
    make_store(geometry_);
    ids_.assign(3, -1);
    for (auto& id : ids_) ASSERT_EQ(fake_->add_sequence(&id), SIEVE_OK);
    sieve_policy* p = create(geometry_, 20, gqa_share);  // 5 pages of 4
    ASSERT_NE(p, nullptr);
    EXPECT_CALL(host_, alloc(_, _, _)).Times(0);  // hooks never allocate
    // Prefill (ragged: 37, 9, 61 tokens): metadata only, the selection is left alone.
    auto pre = step(p, SIEVE_PHASE_PREFILL, 1, {37, 9, 61});
    HostSelection untouched(64, 64);
    uint32_t stats = 0;
    ASSERT_EQ(api_->select(p, pre->get(), untouched.get(), &stats), SIEVE_OK) << api_->last_error(p);
    EXPECT_EQ(untouched.sel().kind, uint32_t(SIEVE_SEL_ALL));
    EXPECT_EQ(untouched.indptr()[0], kSelectionPoison) << "prefill must not write the selection";
    pre.reset();
    for (int s = 0; s < 9; ++s) {
      auto call = step(p, SIEVE_PHASE_DECODE, 1, {1, 1, 1});
      check_decode(p, *call, 5, gqa_share);
    }
    ::testing::Mock::VerifyAndClearExpectations(&host_);
    for (sieve_policy* q : policies_) api_->destroy(q);
    policies_.clear();
  }
}

// Engine page layouts (ABI 1.1 strided views): a store that keeps the same K laid out HND, NHD or
// as a combined pool gives bit-identical selections over prefill and decode steps (the min/max
// sidecar and the bounds are read through the view's strides).
TEST_F(Quest, EngineLayoutsGiveTheSameSelections) {
  auto run = [&](const sieve::KvLayout* layout) {
    rng_.seed(23);
    make_store(geometry_, layout);
    ids_.assign(3, -1);
    for (auto& id : ids_) EXPECT_EQ(fake_->add_sequence(&id), SIEVE_OK);
    sieve_policy* p = create(geometry_, 20, false);
    std::vector<std::vector<int32_t>> rows;
    if (!p) return rows;
    step(p, SIEVE_PHASE_PREFILL, 1, {37, 9, 61}).reset();
    for (int s = 0; s < 5; ++s) {
      auto call = step(p, SIEVE_PHASE_DECODE, 1, {1, 1, 1});
      HostSelection sel(int64_t(ids_.size()) * geometry_.n_q_heads, 4096);
      uint32_t stats = 0;
      EXPECT_EQ(api_->select(p, call->get(), sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
      EXPECT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_BLOCKS));
      for (const auto& r : sel.rows()) rows.push_back(r);
    }
    for (sieve_policy* q : policies_) api_->destroy(q);  // before the next store replaces this one
    policies_.clear();
    return rows;
  };
  const auto want = run(nullptr);
  ASSERT_FALSE(want.empty());
  for (const sieve::KvLayout& layout : sieve::kKvLayouts) {
    SCOPED_TRACE(sieve::kv_layout_name(layout));
    EXPECT_EQ(run(&layout), want);
  }
}

TEST_F(Quest, DenseWhileEverySequenceFitsTheBudget) {
  make_store(geometry_);
  ids_.assign(2, -1);
  for (auto& id : ids_) ASSERT_EQ(fake_->add_sequence(&id), SIEVE_OK);
  sieve_policy* p = create(geometry_, 64, false);  // 16 pages
  ASSERT_NE(p, nullptr);
  step(p, SIEVE_PHASE_PREFILL, 0, {40, 60});
  auto call = step(p, SIEVE_PHASE_DECODE, 0, {1, 1});  // 11 and 16 pages
  check_decode(p, *call, 16, false);
}

TEST_F(Quest, ADecodeOnlyChainIsCaughtUpWithAWarning) {
  make_store(geometry_);
  ids_.assign(2, -1);
  for (auto& id : ids_) ASSERT_EQ(fake_->add_sequence(&id), SIEVE_OK);
  sieve_policy* p = create(geometry_, 12, false);
  ASSERT_NE(p, nullptr);
  // The prompt goes into the store without the policy (it is not in the prefill chain).
  step(nullptr, SIEVE_PHASE_PREFILL, 0, {30, 22});
  EXPECT_CALL(host_, log(_, _, _)).Times(::testing::AnyNumber());
  EXPECT_CALL(host_, log(SIEVE_LOG_WARN, _, HasSubstr("prefill chain"))).Times(1);
  for (int s = 0; s < 3; ++s) {
    auto call = step(p, SIEVE_PHASE_DECODE, 0, {1, 1});
    check_decode(p, *call, 3, false);
  }
}

TEST_F(Quest, RefusesBadInputWithAStatusAndAMessage) {
  make_store(geometry_);
  std::string error;
  EXPECT_EQ(create(geometry_, 3, false, &error), nullptr);
  EXPECT_THAT(error, HasSubstr("token_budget = 3 is below one page"));
  // No store: create answers a status (conformance calls it so).
  sieve_param_value v[2] = {{SIEVE_PARAM_INT, 64, 0, nullptr, nullptr, 0}, {SIEVE_PARAM_BOOL, 0, 0, nullptr, nullptr, 0}};
  sieve_policy* none = nullptr;
  ReasonLog err;
  EXPECT_NE(api_->create(host_.table(), &geometry_, v, 2, nullptr, nullptr, &none, err.sink()), SIEVE_OK);
  EXPECT_THAT(err.all(), HasSubstr("KV store"));
  ids_.assign(1, -1);
  ASSERT_EQ(fake_->add_sequence(&ids_[0]), SIEVE_OK);
  sieve_policy* p = create(geometry_, 8, false);
  ASSERT_NE(p, nullptr);
  step(p, SIEVE_PHASE_PREFILL, 0, {20});
  auto two = step(p, SIEVE_PHASE_DECODE, 0, {2});  // decode with two queries
  HostSelection sel(8, 64);
  uint32_t stats = 0;
  EXPECT_EQ(api_->select(p, two->get(), sel.get(), &stats), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("one query per sequence"));
  // A selection too small for the rows: CAPACITY, nothing written.
  auto one = step(p, SIEVE_PHASE_DECODE, 0, {1});
  HostSelection tiny(8, 3);
  EXPECT_EQ(api_->select(p, one->get(), tiny.get(), &stats), SIEVE_ERR_CAPACITY);
  EXPECT_EQ(tiny.indptr()[0], kSelectionPoison);
}

// The descriptor's conformance parameters, then one page per row besides the last (the smallest
// budget every conformance page size accepts), per query head and shared per GQA group. On the
// GPU machine the CUDA checks run too.
TEST(QuestConform, PassesInProcessDenseAndSparse) {
  const std::vector<sieve::runtime::ParamPairs> cases = {
      {}, {{"token_budget", "128"}}, {{"token_budget", "128"}, {"gqa_share", "true"}}};
  for (const auto& params : cases) {
    sieve::runtime::ConformOptions o;
    o.isolate = false;
    o.params = params;
    const auto rep = sieve::runtime::conform(std::string(SIEVE_PLUGIN_DIR) + "/libsieve_quest.so", o);
    for (const auto& c : rep.checks)
      EXPECT_FALSE(!c.passed && !c.skipped) << params.size() << " params: " << c.name << ": " << c.detail;
    EXPECT_TRUE(rep.passed());
    const auto* cpu = rep.find("numeric_cpu_decode");
    ASSERT_NE(cpu, nullptr);
    EXPECT_TRUE(cpu->passed) << cpu->detail;
    if (sieve::runtime::cuda_devices() > 0) {
      const auto* gpu = rep.find("numeric_cuda_decode");
      ASSERT_NE(gpu, nullptr) << "the CUDA decode check did not run";
      EXPECT_TRUE(gpu->passed) << gpu->detail;
      std::cout << "quest numeric_cuda_decode (" << params.size() << " params): " << gpu->detail << "\n";
    }
  }
}

}  // namespace
