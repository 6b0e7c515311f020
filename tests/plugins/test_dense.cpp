// The dense plugin, loaded from its .so with dlopen: negotiation, descriptor, validate/create,
// and that select resets whatever selection the chain had to "attend everything".
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "mocks/mock_host_services.hpp"
#include "support/host_selection.hpp"
#include "support/layer_call.hpp"
#include "support/plugin_library.hpp"

namespace {

using sieve::testing::HostSelection;
using sieve::testing::kSelectionPoison;
using sieve::testing::MockHostServices;
using sieve::testing::PluginLibrary;
using sieve::testing::ReasonLog;
using ::testing::_;
using ::testing::HasSubstr;
using ::testing::NiceMock;

class Dense : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(lib_.loaded()) << lib_.path() << ": " << lib_.error();
    plugin_ = lib_.negotiate();
    ASSERT_NE(plugin_, nullptr);
    api_ = plugin_->policy;
    ASSERT_NE(api_, nullptr);
  }
  PluginLibrary lib_{"dense"};
  const sieve_plugin* plugin_ = nullptr;
  const sieve_policy_api* api_ = nullptr;
};

TEST_F(Dense, NegotiatesMajorOneAndRefusesMajorZero) {
  sieve_plugin_entry_fn entry = lib_.entry();
  ASSERT_NE(entry, nullptr);
  uint32_t major = 0;
  const sieve_plugin* table = nullptr;
  EXPECT_EQ(entry(2, &major, &table), SIEVE_OK);
  EXPECT_EQ(major, 1u);
  EXPECT_EQ(table, plugin_);
  EXPECT_EQ(entry(0, &major, &table), SIEVE_ERR_VERSION);
  EXPECT_EQ(major, 1u);
  EXPECT_EQ(table, nullptr);
  // Only the entry point is exported (the version script hides the rest).
  EXPECT_EQ(lib_.symbol("_ZN5sieve6plugin15negotiate_entryEjPjPPK12sieve_pluginS4_"), nullptr);
}

TEST_F(Dense, DescriptorDeclaresEverythingAndOnlySelect) {
  EXPECT_EQ(plugin_->abi_major, 1u);
  EXPECT_STREQ(plugin_->name, "dense");
  EXPECT_EQ(plugin_->kv_store, nullptr);
  const sieve_policy_descriptor& d = *api_->descriptor;
  EXPECT_STREQ(d.name, "dense");
  EXPECT_STREQ(d.vendor, "sieve");
  EXPECT_EQ(d.phases, uint32_t(SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE));
  EXPECT_EQ(d.devices, uint32_t(SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA));
  EXPECT_EQ(d.dtypes, uint32_t(SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16));
  EXPECT_EQ(d.n_head_dims, 0u);
  EXPECT_EQ(d.n_page_sizes, 0u);
  EXPECT_EQ(d.needs, 0u);
  EXPECT_EQ(d.evicts_kv, 0u);
  EXPECT_EQ(d.cuda_graph, uint32_t(SIEVE_CUDA_GRAPH_FULL));
  EXPECT_EQ(api_->n_params, 0u);
  EXPECT_NE(api_->select, nullptr);
  EXPECT_EQ(api_->on_append, nullptr);
  EXPECT_EQ(api_->attend, nullptr);
  EXPECT_EQ(api_->observe, nullptr);
  EXPECT_EQ(api_->correct, nullptr);
  EXPECT_EQ(api_->end_step, nullptr);
}

TEST_F(Dense, ValidatesEveryDtypeDeviceHeadDimAndPageSize) {
  for (DLDataType dt : {sieve::kF32, sieve::kF16, sieve::kBF16})
    for (DLDevice dev : {sieve::kCpu, DLDevice{kDLCUDA, 0}})
      for (int32_t page : {1, 16, 64})
        for (int32_t head_dim : {8, 96, 128}) {
          sieve_geometry g = sieve::testing::test_geometry(page);
          g.kv_dtype = dt;
          g.device = dev;
          g.head_dim = head_dim;
          ReasonLog log;
          EXPECT_EQ(api_->validate(&g, nullptr, 0, log.sink()), SIEVE_OK) << log.all();
        }
}

TEST_F(Dense, RefusesParametersItDoesNotHave) {
  sieve_geometry g = sieve::testing::test_geometry(16);
  sieve_param_value v{SIEVE_PARAM_INT, 4, 0, nullptr, nullptr, 0};
  ReasonLog log;
  EXPECT_EQ(api_->validate(&g, &v, 1, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(log.all(), HasSubstr("expected 0 parameter value(s), got 1"));

  NiceMock<MockHostServices> host;
  sieve_policy* p = nullptr;
  ReasonLog err;
  EXPECT_EQ(api_->create(host.table(), &g, &v, 1, nullptr, nullptr, &p, err.sink()),
            SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(err.lines.size(), 1u);
  EXPECT_THAT(err.lines[0], HasSubstr("expected 0 parameter value(s), got 1"));

  g.kv_dtype = sieve::kI32;
  log.lines.clear();
  EXPECT_EQ(api_->validate(&g, nullptr, 0, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(log.all(), HasSubstr("KV dtype int32 is not a storage dtype"));
}

TEST_F(Dense, SelectResetsAPriorSelectionWithoutTouchingItsStorage) {
  NiceMock<MockHostServices> host;
  sieve_geometry g = sieve::testing::test_geometry(4);
  sieve_policy* p = nullptr;
  ReasonLog err;
  ASSERT_EQ(api_->create(host.table(), &g, nullptr, 0, nullptr, nullptr, &p, err.sink()), SIEVE_OK)
      << err.all();

  HostSelection selection(3, 8);
  // What an earlier policy of the chain left: a block-sparse, per-q-head selection.
  sieve_selection& s = *selection.get();
  s.kind = SIEVE_SEL_BLOCKS;
  s.heads = SIEVE_SEL_PER_Q_HEAD;
  s.q_block = 4;
  s.k_block_pages = 2;
  s.n_rows = 2;
  selection.indptr() = {0, 1, 3, kSelectionPoison};
  selection.indices() = {0, 0, 2, kSelectionPoison, kSelectionPoison, kSelectionPoison,
                         kSelectionPoison, kSelectionPoison};
  const std::vector<int32_t> indptr_before = selection.indptr(), indices_before = selection.indices();

  sieve_layer_call call{};
  call.hdr = SIEVE_HEADER_INIT(sieve_layer_call);
  call.phase = SIEVE_PHASE_DECODE;
  uint32_t stats = SIEVE_STATS_NONE;
  EXPECT_CALL(host, alloc).Times(0);
  EXPECT_CALL(host, free).Times(0);
  EXPECT_CALL(host, cuda_stream).Times(0);  // no device work at all
  ASSERT_EQ(api_->select(p, &call, selection.get(), &stats), SIEVE_OK) << api_->last_error(p);
  EXPECT_EQ(s.kind, uint32_t(SIEVE_SEL_ALL));
  EXPECT_EQ(s.n_rows, 0);
  EXPECT_EQ(stats, uint32_t(SIEVE_STATS_NONE)) << "dense asks for no statistics";
  EXPECT_EQ(selection.indptr(), indptr_before);
  EXPECT_EQ(selection.indices(), indices_before);

  EXPECT_EQ(api_->select(p, &call, nullptr, &stats), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("selection is NULL"));
  api_->destroy(p);
  EXPECT_EQ(host.live_allocations(), 0u);
}

}  // namespace
