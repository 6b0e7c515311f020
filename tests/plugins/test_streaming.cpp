// The streaming (StreamingLLM) plugin, loaded from its .so with dlopen: its page lists for decode
// and prefill against a naive token-level reference at ragged lengths, the sink/window edges,
// capacity overflow, bad input, and that its hooks neither allocate nor touch the store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mocks/mock_host_services.hpp"
#include "mocks/mock_kv_store.hpp"
#include "streaming_scenario.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
using ::testing::_;
using ::testing::HasSubstr;
using ::testing::NiceMock;
using ::testing::StrictMock;

class Streaming : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = lib_.policy();
    ASSERT_NE(api_, nullptr);
  }
  void TearDown() override {
    for (sieve_policy* p : policies_) api_->destroy(p);
    EXPECT_EQ(host_.live_allocations(), 0u);
  }
  static void values(int64_t sink, int64_t window, sieve_param_value (&v)[2]) {
    v[0] = {SIEVE_PARAM_INT, sink, 0, nullptr, nullptr, 0};
    v[1] = {SIEVE_PARAM_INT, window, 0, nullptr, nullptr, 0};
  }
  sieve_policy* create(const sieve_geometry& g, int64_t sink, int64_t window) {
    sieve_param_value v[2];
    values(sink, window, v);
    sieve_policy* p = create_or_fail(api_, host_.table(), g, v, 2,
                                     "create(sink=" + std::to_string(sink) + ", window=" + std::to_string(window) + ")");
    if (p) policies_.push_back(p);
    return p;
  }
  sieve_status select(sieve_policy* p, StreamingScenario& sc, HostSelection& sel) {
    uint32_t stats = SIEVE_STATS_NONE;
    const sieve_status s = api_->select(p, sc.call->get(), sel.get(), &stats);
    EXPECT_EQ(stats, uint32_t(SIEVE_STATS_NONE)) << "streaming asks for no statistics";
    return s;
  }
  // Select with (sink, window) on the scenario and compare with the naive reference.
  void check(StreamingScenario& sc, int64_t sink, int64_t window) {
    SCOPED_TRACE(::testing::Message() << (sc.decode() ? "decode" : "prefill") << " page_size="
                                      << sc.geometry.page_size << " sink=" << sink
                                      << " window=" << window);
    sieve_policy* p = create(sc.geometry, sink, window);
    ASSERT_NE(p, nullptr);
    const auto expected = sc.reference(sink, window);
    HostSelection sel(sc.rows() + 3, total_entries(expected) + 5);
    ASSERT_EQ(select(p, sc, sel), SIEVE_OK) << api_->last_error(p);
    expect_selection_is(sel.sel(), sel.indptr(), sel.indices(), expected, sc.decode(),
                        sc.geometry.page_size);
  }

  PluginLibrary lib_{"streaming"};
  const sieve_policy_api* api_ = nullptr;
  NiceMock<MockHostServices> host_;
  std::vector<sieve_policy*> policies_;
};

TEST_F(Streaming, DescriptorAndSchema) {
  const sieve_policy_descriptor& d = *api_->descriptor;
  EXPECT_STREQ(d.name, "streaming");
  EXPECT_EQ(d.phases, uint32_t(SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE));
#if SIEVE_WITH_CUDA
  EXPECT_EQ(d.devices, uint32_t(SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA));
#else
  EXPECT_EQ(d.devices, uint32_t(SIEVE_DEVICE_CPU));
#endif
  EXPECT_EQ(d.selection_heads, uint32_t(SIEVE_SEL_PER_SEQUENCE));
  EXPECT_EQ(d.cuda_graph, uint32_t(SIEVE_CUDA_GRAPH_STATIC_SHAPES));
  EXPECT_EQ(d.evicts_kv, 0u);
  ASSERT_EQ(api_->n_params, 2u);
  EXPECT_STREQ(api_->params[0].name, "sink");
  EXPECT_EQ(api_->params[0].type, uint32_t(SIEVE_PARAM_INT));
  EXPECT_STREQ(api_->params[0].default_value, "4");
  EXPECT_EQ(api_->params[0].min, 0);
  EXPECT_STREQ(api_->params[1].name, "window");
  EXPECT_STREQ(api_->params[1].default_value, "1024");
  EXPECT_EQ(api_->params[1].min, 1);
  EXPECT_NE(api_->select, nullptr);
  EXPECT_EQ(api_->on_append, nullptr);
  EXPECT_EQ(api_->attend, nullptr);
  EXPECT_EQ(api_->observe, nullptr);
  EXPECT_EQ(api_->correct, nullptr);
  EXPECT_EQ(api_->end_step, nullptr);
}

// Lengths around page boundaries: 1, P-1, P, P+1, multiples, and longer sequences.
std::vector<StreamingCase> decode_cases(int32_t P) {
  return {{1, 1}, {P - 1 > 0 ? P - 1 : 2, 1}, {P, 1}, {P + 1, 1}, {3 * P, 1}, {5 * P + 2, 1},
          {37, 1}, {150, 1}};
}
// Whole prompts, chunked prefill (the new tokens start mid-page), a sequence with no queries.
std::vector<StreamingCase> prefill_cases(int32_t P) {
  return {{1, 1}, {P, P}, {P + 1, P + 1}, {23, 23}, {40, 13}, {64, 64}, {9, 0}, {50, 7}, {97, 31}};
}

TEST_F(Streaming, DecodeMatchesReferenceOverSinksWindowsAndPageSizes) {
  for (int32_t P : {1, 4, 16}) {
    StreamingScenario sc(P, decode_cases(P), SIEVE_PHASE_DECODE);
    for (int64_t sink : {0, 1, 4, 6})
      for (int64_t window : {1, 2, 5, 8, 33, 4096}) check(sc, sink, window);
  }
}

TEST_F(Streaming, PrefillMatchesReferenceOverSinksWindowsAndPageSizes) {
  for (int32_t P : {1, 4, 16}) {
    StreamingScenario sc(P, prefill_cases(P), SIEVE_PHASE_PREFILL);
    for (int64_t sink : {0, 1, 4, 6})
      for (int64_t window : {1, 2, 5, 8, 33, 4096}) check(sc, sink, window);
  }
}

// Hand-computed lists (independent of the reference) at the edges the brief names.
TEST_F(Streaming, DecodeEdgesByHand) {
  const int32_t P = 4;
  StreamingScenario sc(P, {{12, 1}, {13, 1}, {9, 1}, {37, 1}, {3, 1}}, SIEVE_PHASE_DECODE);
  struct Expect {
    int64_t sink, window;
    std::vector<std::vector<int32_t>> rows;
  };
  const std::vector<Expect> cases = {
      // sink page 0; window [L-4, L): L=12 -> page 2; L=13 -> tokens 9..12 -> pages 2, 3
      {4, 4, {{0, 2}, {0, 2, 3}, {0, 1, 2}, {0, 8, 9}, {0}}},
      // sink = 0, window = 1: only the page of the newest token
      {0, 1, {{2}, {3}, {2}, {9}, {0}}},
      // a window larger than L: every page (dense rows)
      {0, 1024, {{0, 1, 2}, {0, 1, 2, 3}, {0, 1, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {0}}},
      // sink = 5 spills into page 1; the window's pages merge with the sink's without duplicates
      {5, 2, {{0, 1, 2}, {0, 1, 2, 3}, {0, 1, 2}, {0, 1, 8, 9}, {0}}},
  };
  for (const Expect& e : cases) {
    SCOPED_TRACE(::testing::Message() << "sink=" << e.sink << " window=" << e.window);
    sieve_policy* p = create(sc.geometry, e.sink, e.window);
    ASSERT_NE(p, nullptr);
    HostSelection sel(8, 64);
    ASSERT_EQ(select(p, sc, sel), SIEVE_OK) << api_->last_error(p);
    const auto rows = sel.rows();
    EXPECT_EQ(rows, e.rows);
  }
}

TEST_F(Streaming, PrefillWindowIsRelativeToEachQueryBlock) {
  // 10 resident tokens before a chunk of 9 new ones (positions 10..18), P = 4: query blocks
  // [10..13], [14..17], [18]. window = 3, sink = 1:
  //   block 0: sink page 0, tokens 8..13 -> pages 2, 3   => {0, 2, 3}
  //   block 1: tokens 12..17 -> pages 3, 4               => {0, 3, 4}
  //   block 2: tokens 16..18 -> page 4                   => {0, 4}
  StreamingScenario sc(4, {{19, 9}}, SIEVE_PHASE_PREFILL);
  sieve_policy* p = create(sc.geometry, 1, 3);
  ASSERT_NE(p, nullptr);
  HostSelection sel(4, 16);
  ASSERT_EQ(select(p, sc, sel), SIEVE_OK) << api_->last_error(p);
  EXPECT_EQ(sel.sel().q_block, 4);
  EXPECT_EQ(sel.rows(), (std::vector<std::vector<int32_t>>{{0, 2, 3}, {0, 3, 4}, {0, 4}}));
}

TEST_F(Streaming, CapacityOverflowIsAStatusAndLeavesTheSelectionAlone) {
  StreamingScenario sc(4, prefill_cases(4), SIEVE_PHASE_PREFILL);
  sieve_policy* p = create(sc.geometry, 4, 8);
  ASSERT_NE(p, nullptr);
  const int64_t nnz = total_entries(sc.reference(4, 8));
  {
    HostSelection sel(sc.rows(), nnz - 1);
    ASSERT_EQ(select(p, sc, sel), SIEVE_ERR_CAPACITY);
    EXPECT_THAT(api_->last_error(p),
                HasSubstr("needs " + std::to_string(nnz) + " key-block entries for " +
                          std::to_string(sc.rows()) + " rows, its capacity is " +
                          std::to_string(nnz - 1)));
    EXPECT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_ALL));
    EXPECT_EQ(sel.sel().n_rows, 0);
    for (int32_t v : sel.indptr()) EXPECT_EQ(v, kSelectionPoison);
    for (int32_t v : sel.indices()) EXPECT_EQ(v, kSelectionPoison);
  }
  {
    HostSelection sel(sc.rows(), nnz);  // exactly enough
    ASSERT_EQ(select(p, sc, sel), SIEVE_OK) << api_->last_error(p);
    expect_selection_is(sel.sel(), sel.indptr(), sel.indices(), sc.reference(4, 8), false, 4);
  }
  {
    HostSelection sel(sc.rows() - 1, nnz);  // indptr one row short
    ASSERT_EQ(select(p, sc, sel), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(api_->last_error(p), HasSubstr("selection indptr holds"));
  }
}

TEST_F(Streaming, HooksDoNotAllocateOrTouchTheStore) {
  StrictMock<MockKvStore> kv;  // any store call fails the test
  StreamingScenario sc(4, decode_cases(4), SIEVE_PHASE_DECODE, 7, kv.handle(), kv.api());
  sieve_policy* p = create(sc.geometry, 4, 16);
  ASSERT_NE(p, nullptr);
  EXPECT_CALL(host_, alloc).Times(0);
  EXPECT_CALL(host_, free).Times(0);
  HostSelection sel(sc.rows(), 256);
  for (int step = 0; step < 3; ++step) ASSERT_EQ(select(p, sc, sel), SIEVE_OK);
}

TEST_F(Streaming, ValidateGivesReasons) {
  sieve_geometry g = test_geometry(16);
  sieve_param_value v[2];
  {
    values(-1, 0, v);
    g.page_size = 0;
    ReasonLog log;
    EXPECT_EQ(api_->validate(&g, v, 2, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(log.lines.size(), 3u) << log.all();
    EXPECT_THAT(log.all(), HasSubstr("page_size = 0 must be > 0"));
    EXPECT_THAT(log.all(), HasSubstr("parameter 'sink' = -1 is outside [0, 2147483647]"));
    EXPECT_THAT(log.all(), HasSubstr("parameter 'window' = 0 is outside [1, 2147483647]"));
  }
  {
    g = test_geometry(1, 4096, 1 << 20);  // 4096 x 2^20 prefill rows do not fit an int32
    values(4, 16, v);
    ReasonLog log;
    EXPECT_EQ(api_->validate(&g, v, 2, log.sink()), SIEVE_ERR_UNSUPPORTED);
    EXPECT_THAT(log.all(), HasSubstr("exceed the int32 row count"));
  }
  {
    g = test_geometry(16);
    g.device = {kDLCUDA, 0};
    ReasonLog log;
#if SIEVE_WITH_CUDA
    EXPECT_EQ(api_->validate(&g, v, 2, log.sink()), SIEVE_OK) << log.all();
#else
    EXPECT_EQ(api_->validate(&g, v, 2, log.sink()), SIEVE_ERR_UNSUPPORTED);
    EXPECT_THAT(log.all(), HasSubstr("this build has no CUDA code"));
#endif
  }
  {
    g = test_geometry(16);
    values(0, 1, v);
    ReasonLog log;
    EXPECT_EQ(api_->validate(&g, v, 2, log.sink()), SIEVE_OK) << log.all();
    EXPECT_EQ(api_->validate(&g, v, 1, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(log.all(), HasSubstr("expected 2 parameter value(s) (sink, window), got 1"));
  }
}

TEST_F(Streaming, BadParameterCountIsAStatusNotACrash) {
  sieve_geometry g = test_geometry(16);
  const sieve_param_value v[3] = {{SIEVE_PARAM_INT, 4, 0, nullptr, nullptr, 0},
                                  {SIEVE_PARAM_INT, 16, 0, nullptr, nullptr, 0},
                                  {SIEVE_PARAM_INT, 16, 0, nullptr, nullptr, 0}};
  for (uint32_t n : {0u, 1u, 3u}) {
    sieve_policy* p = nullptr;
    ReasonLog err;
    EXPECT_EQ(api_->create(host_.table(), &g, n ? v : nullptr, n, nullptr, nullptr, &p, err.sink()),
              SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(p, nullptr);
    ASSERT_EQ(err.lines.size(), 1u);
    EXPECT_THAT(err.lines[0], HasSubstr("got " + std::to_string(n)));
  }
}

TEST_F(Streaming, WarnsWhenSinkPlusWindowCoversEverything) {
  sieve_geometry g = test_geometry(16, 8, 512);
  EXPECT_CALL(host_, log(_, _, _)).Times(::testing::AnyNumber());  // debug lines
  EXPECT_CALL(host_, log(SIEVE_LOG_WARN, "streaming", HasSubstr("every row is dense"))).Times(1);
  ASSERT_NE(create(g, 4, 1024), nullptr);
  EXPECT_CALL(host_, log(SIEVE_LOG_WARN, _, _)).Times(0);
  ASSERT_NE(create(g, 4, 64), nullptr);
}

TEST_F(Streaming, InconsistentCallsAreRefusedWithAMessage) {
  StreamingScenario sc(4, {{12, 1}, {30, 1}}, SIEVE_PHASE_DECODE);
  sieve_policy* p = create(sc.geometry, 4, 8);
  ASSERT_NE(p, nullptr);
  HostSelection sel(4, 64);
  sieve_layer_call& call = *sc.call->get();

  sc.call->kv_len()[1] = 29;  // disagrees with the view
  EXPECT_EQ(select(p, sc, sel), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(api_->last_error(p), "select: kv_len_host[1] = 29 but the KV view holds 30 tokens");
  sc.call->kv_len()[1] = 30;

  sc.call->qo_indptr()[2] = 3;  // two queries in a decode call
  EXPECT_EQ(select(p, sc, sel), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("decode has one query per sequence, sequence 1 has 2"));
  sc.call->qo_indptr()[2] = 2;

  call.batch = 9;  // > max_batch = 8
  EXPECT_EQ(select(p, sc, sel), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("batch = 9 is outside [0, max_batch = 8]"));
  call.batch = 2;

  const sieve_paged_kv* view = call.kv_view;
  call.kv_view = nullptr;
  EXPECT_EQ(select(p, sc, sel), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(api_->last_error(p), "select: KV view is NULL");
  call.kv_view = view;

  sc.call->view().page_size = 8;
  EXPECT_EQ(select(p, sc, sel), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("the KV view has page_size 8"));
  sc.call->view().page_size = 4;

  sel.get()->indices.device = {kDLCUDA, 0};  // a selection on another device than the policy's
  EXPECT_EQ(select(p, sc, sel), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("selection indices is on cuda:0, the policy runs on cpu"));
  sel.get()->indices.device = sieve::kCpu;

  call.phase = 3;
  EXPECT_EQ(select(p, sc, sel), SIEVE_ERR_INVALID_ARGUMENT);
  call.phase = SIEVE_PHASE_DECODE;

  for (int32_t v : sel.indptr()) EXPECT_EQ(v, kSelectionPoison) << "a refused call wrote";
  ASSERT_EQ(select(p, sc, sel), SIEVE_OK) << api_->last_error(p);  // and it still works
  expect_selection_is(sel.sel(), sel.indptr(), sel.indices(), sc.reference(4, 8), true, 4);
}

TEST_F(Streaming, ChainStreamingThenDenseEndsDense) {
  PluginLibrary dense_lib("dense");
  ASSERT_TRUE(dense_lib.loaded()) << dense_lib.error();
  const sieve_plugin* dense = dense_lib.negotiate();
  ASSERT_NE(dense, nullptr);
  StreamingScenario sc(4, prefill_cases(4), SIEVE_PHASE_PREFILL);
  sieve_policy* streaming = create(sc.geometry, 4, 8);
  ASSERT_NE(streaming, nullptr);
  sieve_policy* d = nullptr;
  ReasonLog err;
  ASSERT_EQ(dense->policy->create(host_.table(), &sc.geometry, nullptr, 0, nullptr, nullptr, &d,
                                  err.sink()),
            SIEVE_OK)
      << err.all();
  HostSelection sel(sc.rows(), 512);
  uint32_t stats = SIEVE_STATS_NONE;
  ASSERT_EQ(api_->select(streaming, sc.call->get(), sel.get(), &stats), SIEVE_OK);
  ASSERT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_BLOCKS));
  ASSERT_EQ(dense->policy->select(d, sc.call->get(), sel.get(), &stats), SIEVE_OK);
  EXPECT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_ALL));
  dense->policy->destroy(d);
}

}  // namespace
