// The plugin-support library's run-time side: exception-safe hook trampolines (a throw becomes a
// status and last_error; bad arguments are refused before the hook runs), typed parameter access,
// the selection helpers, Reasons and logging. Uses ProbePolicy (probe_policy.hpp); the tables,
// entry negotiation, validate and create are tested in test_plugin_support.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sieve/plugin/policy_api.hpp>

#include "mocks/mock_host_services.hpp"
#include "probe_policy.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"

namespace {

using namespace plugin_support_test;  // ProbePolicy, its values and geometry; sp = sieve::plugin
using sieve::testing::HostSelection;
using sieve::testing::MockHostServices;
using sieve::testing::ReasonLog;
using ::testing::HasSubstr;
using ::testing::NiceMock;

class ProbeHooks : public ::testing::Test {
 protected:
  void SetUp() override {
    sieve_geometry g = probe_geometry();
    ProbeValues pv;
    ReasonLog err;
    ASSERT_EQ(probe_api().create(host_.table(), &g, pv.v, pv.n, nullptr, nullptr, &p_, err.sink()),
              SIEVE_OK)
        << err.all();
    call_.hdr = SIEVE_HEADER_INIT(sieve_layer_call);
  }
  void TearDown() override {
    ProbePolicy::select_throws = Throw::none;
    probe_api().destroy(p_);
    EXPECT_EQ(host_.live_allocations(), 0u);
  }
  sieve_status select() {
    uint32_t stats = SIEVE_STATS_NONE;
    return probe_api().select(p_, &call_, selection_.get(), &stats);
  }
  NiceMock<MockHostServices> host_;
  sieve_policy* p_ = nullptr;
  sieve_layer_call call_{};
  HostSelection selection_{4, 16};
};

TEST_F(ProbeHooks, ASuccessfulHookReturnsOk) {
  uint32_t stats = SIEVE_STATS_NONE;
  ASSERT_EQ(probe_api().select(p_, &call_, selection_.get(), &stats), SIEVE_OK);
  EXPECT_EQ(selection_.sel().kind, uint32_t(SIEVE_SEL_BLOCKS));
  EXPECT_EQ(stats, uint32_t(SIEVE_STATS_PAGE_MASS_PER_KV_HEAD));
}

TEST_F(ProbeHooks, ExceptionsBecomeStatusesAndLastError) {
  ProbePolicy::select_throws = Throw::error;
  EXPECT_EQ(select(), SIEVE_ERR_CAPACITY);
  EXPECT_STREQ(probe_api().last_error(p_), "select: row 3 needs 9 pages");

  ProbePolicy::select_throws = Throw::std_exception;
  EXPECT_EQ(select(), SIEVE_ERR_INTERNAL);
  EXPECT_STREQ(probe_api().last_error(p_), "select: internal error: broken invariant");

  ProbePolicy::select_throws = Throw::bad_alloc;
  EXPECT_EQ(select(), SIEVE_ERR_OUT_OF_MEMORY);
  EXPECT_STREQ(probe_api().last_error(p_), "select: out of host memory");

  ProbePolicy::select_throws = Throw::other;
  EXPECT_EQ(select(), SIEVE_ERR_INTERNAL);
  EXPECT_STREQ(probe_api().last_error(p_), "select: internal error: unknown exception");

  ProbePolicy::select_throws = Throw::none;
  EXPECT_EQ(select(), SIEVE_OK);
  EXPECT_STREQ(probe_api().last_error(p_), "select: internal error: unknown exception")
      << "last_error keeps the last failure";
}

TEST_F(ProbeHooks, NullOrTooSmallArgumentsAreRefusedBeforeTheHookRuns) {
  uint32_t stats = 0;
  EXPECT_EQ(probe_api().select(p_, &call_, nullptr, &stats), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(probe_api().last_error(p_), "select: selection is NULL");
  EXPECT_EQ(probe_api().select(p_, &call_, selection_.get(), nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(probe_api().last_error(p_), "select: stats is NULL");
  EXPECT_EQ(probe_api().select(nullptr, &call_, selection_.get(), &stats), SIEVE_ERR_INVALID_ARGUMENT);
  call_.hdr.struct_size = 8;
  EXPECT_EQ(probe_api().select(p_, &call_, selection_.get(), &stats), SIEVE_ERR_VERSION);
  EXPECT_THAT(probe_api().last_error(p_), HasSubstr("select: layer call is 8 bytes"));
  EXPECT_EQ(selection_.sel().kind, uint32_t(SIEVE_SEL_ALL)) << "the hook body never ran";
  EXPECT_EQ(probe_api().end_step(p_, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(probe_api().last_error(p_), "end_step: step end is NULL");
  EXPECT_NE(probe_api().last_error(nullptr), nullptr);
}

TEST(PluginSupport, ParamsGiveTypedValuesByName) {
  ProbeValues pv;
  pv.v[4].s = "w.bin";
  const sp::Params p(ProbePolicy::kParams, 6, pv.v, pv.n);
  EXPECT_EQ(p.integer("budget"), 8);
  EXPECT_DOUBLE_EQ(p.real("tau"), 0.5);
  EXPECT_TRUE(p.boolean("pin"));
  EXPECT_EQ(p.choice("metric"), 1u);
  EXPECT_EQ(p.text("metric"), "l2");
  EXPECT_EQ(p.text("weights"), "w.bin");
  ASSERT_EQ(p.int_list("layers").size(), 2u);
  EXPECT_EQ(p.int_list("layers")[1], 1);

  auto status_of = [](auto&& f) {
    try {
      f();
    } catch (const sp::Error& e) {
      return e.status();
    }
    return SIEVE_OK;
  };
  EXPECT_EQ(status_of([&] { (void)p.real("budget"); }), SIEVE_ERR_INTERNAL);  // plugin bug
  EXPECT_EQ(status_of([&] { (void)p.integer("nope"); }), SIEVE_ERR_INTERNAL);
  pv.v[0].i = 0;
  EXPECT_EQ(status_of([&] { sp::Params(ProbePolicy::kParams, 6, pv.v, pv.n); }),
            SIEVE_ERR_INVALID_ARGUMENT);
}

TEST(PluginSupport, SelectionHelpersCountRowsAndCheckStorage) {
  std::vector<int32_t> qo = {0, 5, 5, 21};  // 5, 0 and 16 queries
  sieve_layer_call call{};
  call.batch = 3;
  call.qo_indptr_host = qo.data();
  EXPECT_EQ(sp::selection_rows(call, 4, 1), 2 + 0 + 4);
  EXPECT_EQ(sp::selection_rows(call, 4, 8), (2 + 0 + 4) * 8);
  EXPECT_EQ(sp::selection_rows(call, 1, 1), 21);
  qo[2] = 3;  // decreasing
  EXPECT_THROW(sp::selection_rows(call, 4, 1), sp::Error);

  HostSelection s(6, 10);
  auto status_of = [&](int64_t rows, int64_t nnz, DLDevice dev) {
    try {
      sp::check_selection_storage(s.sel(), rows, nnz, dev);
    } catch (const sp::Error& e) {
      return e.status();
    }
    return SIEVE_OK;
  };
  EXPECT_EQ(status_of(6, 10, sieve::kCpu), SIEVE_OK);
  EXPECT_EQ(status_of(6, 11, sieve::kCpu), SIEVE_ERR_CAPACITY);
  EXPECT_EQ(status_of(7, 1, sieve::kCpu), SIEVE_ERR_INVALID_ARGUMENT);  // indptr too short
  EXPECT_EQ(status_of(1, 1, DLDevice{kDLCUDA, 0}), SIEVE_ERR_INVALID_ARGUMENT);
  s.get()->indices.dtype = sieve::kF32;
  EXPECT_EQ(status_of(1, 1, sieve::kCpu), SIEVE_ERR_INVALID_ARGUMENT);
}

TEST(PluginSupport, ReasonsStatusPrefersInvalid) {
  sp::Reasons r;
  EXPECT_EQ(r.status(), SIEVE_OK);
  r.unsupported("a");
  EXPECT_EQ(r.status(), SIEVE_ERR_UNSUPPORTED);
  r.invalid("b");
  r.unsupported("c");
  EXPECT_EQ(r.status(), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(r.joined(), "a; b; c");
  EXPECT_EQ(sp::status_name(SIEVE_ERR_CAPACITY), "SIEVE_ERR_CAPACITY");
  EXPECT_EQ(sp::status_name(42), "status 42");
}

TEST(PluginSupport, LoggingWithoutAHostCallbackIsDropped) {
  NiceMock<MockHostServices> host;
  host.mutable_table()->log = nullptr;
  sieve_geometry g = probe_geometry();
  ProbeValues pv;
  sieve_policy* p = nullptr;
  ReasonLog err;
  EXPECT_CALL(host, log).Times(0);
  ASSERT_EQ(probe_api().create(host.table(), &g, pv.v, pv.n, nullptr, nullptr, &p, err.sink()),
            SIEVE_OK);
  probe_api().destroy(p);
}

}  // namespace
