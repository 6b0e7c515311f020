// The plugin-support library itself: generated tables, entry negotiation, generic checks in
// validate and create. Policies here are compiled into the test (ProbePolicy in probe_policy.hpp,
// shared with test_plugin_support_hooks.cpp: hooks at run time, parameter access, helpers).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sieve/plugin/policy_api.hpp>

#include <stdexcept>

#include "mocks/mock_host_services.hpp"
#include "probe_policy.hpp"
#include "support/layer_call.hpp"

namespace {

using namespace plugin_support_test;  // ProbePolicy, its values and geometry; sp = sieve::plugin
using sieve::testing::MockHostServices;
using sieve::testing::ReasonLog;
using ::testing::_;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::NiceMock;
using ::testing::Return;
using ::testing::StrictMock;

// No parameters, no validate, one hook declared by an intermediate class.
class AppendBase : public sp::PolicyBase {
 public:
  using PolicyBase::PolicyBase;
  void on_append(const sieve_layer_call&, const sieve_kv_append&) override {}
};
class MinimalPolicy final : public AppendBase {
 public:
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "minimal",
      .vendor = "test",
      .version_major = 0,
      .version_minor = 0,
      .version_patch = 1,
      .summary = "no parameters, one inherited hook",
      .phases = SIEVE_PHASE_PREFILL,
      .devices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA,
      .dtypes = SIEVE_DTYPE_F32,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_SEQUENCE,
      .needs = 0,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_FULL,
      .conform_params = nullptr,
      .selection_basis = SIEVE_SELECTION_BASIS_UNDECLARED,
      .kv_layouts = 0,  // compact HND only
  };
  using AppendBase::AppendBase;
};

// Two hooks in the table; each instance uses the ones its mode names (use_hooks, ABI 1.1), and
// mode=bogus names one the class does not override.
class ModalPolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_param_spec kParams[] = {
      sp::enum_param("mode", "select", "select|attend|bogus", "which hooks the instance uses")};
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "modal",
      .vendor = "test",
      .version_major = 0,
      .version_minor = 0,
      .version_patch = 1,
      .summary = "hooks per instance",
      .phases = SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE,
      .devices = SIEVE_DEVICE_CPU,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_SEQUENCE,
      .needs = 0,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_NONE,
      .conform_params = nullptr,
      .selection_basis = SIEVE_SELECTION_BASIS_NONE,
      .kv_layouts = 0,  // compact HND only
  };
  explicit ModalPolicy(const sp::CreateContext& ctx) : PolicyBase(ctx), scratch_(allocate(sieve::kCpu, 64)) {
    const uint32_t mode = ctx.params.choice("mode");
    use_hooks(mode == 0   ? SIEVE_HOOK_SELECT
              : mode == 1 ? SIEVE_HOOK_SELECT | SIEVE_HOOK_ATTEND
                          : SIEVE_HOOK_SELECT | SIEVE_HOOK_CORRECT);
  }
  void select(const sieve_layer_call&, sieve_selection&, uint32_t&) override {}
  void attend(const sieve_layer_call&, const sieve_selection&, DLTensor&) override {}

 private:
  sp::HostBuffer scratch_;
};

// Tools: one returns the number of arguments it saw past argv[0], one throws.
int count_args_main(int argc, const char* const* argv) { return argc > 1 && argv[1] ? argc - 1 : 0; }
int throwing_main(int, const char* const*) { throw std::runtime_error("no model named 'x'"); }
class ToolPolicy final : public AppendBase {
 public:
  static constexpr sieve_policy_descriptor kDescriptor = MinimalPolicy::kDescriptor;
  static constexpr sieve_tool kTools[] = {sp::tool<count_args_main>("count-args", "counts its arguments"),
                                          sp::tool<throwing_main>("throws", "fails")};
  using AppendBase::AppendBase;
};

}  // namespace

SIEVE_DEFINE_PLUGIN(plugin_support_test::ProbePolicy);

namespace {

TEST(PluginSupport, HooksArePresentExactlyWhereOverridden) {
  const sieve_policy_api& probe = probe_api();
  EXPECT_EQ(probe.hdr.struct_size, sizeof(sieve_policy_api));
  EXPECT_EQ(probe.descriptor, &ProbePolicy::kDescriptor);
  EXPECT_EQ(probe.n_params, 6u);
  EXPECT_STREQ(probe.params[0].name, "budget");
  EXPECT_NE(probe.select, nullptr);
  EXPECT_NE(probe.end_step, nullptr);
  EXPECT_EQ(probe.on_append, nullptr);
  EXPECT_EQ(probe.attend, nullptr);
  EXPECT_EQ(probe.observe, nullptr);
  EXPECT_EQ(probe.correct, nullptr);

  const sieve_policy_api& minimal = sp::policy_api_v<MinimalPolicy>;
  EXPECT_EQ(minimal.params, nullptr);
  EXPECT_EQ(minimal.n_params, 0u);
  EXPECT_NE(minimal.on_append, nullptr);  // declared by the intermediate class
  EXPECT_EQ(minimal.select, nullptr);
  EXPECT_EQ(minimal.end_step, nullptr);
  EXPECT_NE(minimal.validate, nullptr);
  EXPECT_NE(minimal.create, nullptr);
}

TEST(PluginSupport, AnInstanceDeclaresTheHooksItUses) {
  NiceMock<MockHostServices> host;
  sieve_geometry g = probe_geometry();
  ReasonLog err;
  // Without use_hooks: every hook the class overrides.
  ProbeValues pv;
  sieve_policy* p = nullptr;
  ASSERT_NE(probe_api().instance_hooks, nullptr);
  ASSERT_EQ(probe_api().create(host.table(), &g, pv.v, pv.n, nullptr, nullptr, &p, err.sink()), SIEVE_OK)
      << err.all();
  EXPECT_EQ(probe_api().instance_hooks(p), uint32_t(SIEVE_HOOK_SELECT | SIEVE_HOOK_END_STEP));
  probe_api().destroy(p);

  const sieve_policy_api& modal = sp::policy_api_v<ModalPolicy>;
  sieve_param_value mode{SIEVE_PARAM_ENUM, 0, 0, "select", nullptr, 0};
  ASSERT_EQ(modal.create(host.table(), &g, &mode, 1, nullptr, nullptr, &p, err.sink()), SIEVE_OK) << err.all();
  EXPECT_EQ(modal.instance_hooks(p), uint32_t(SIEVE_HOOK_SELECT));
  modal.destroy(p);
  mode = {SIEVE_PARAM_ENUM, 1, 0, "attend", nullptr, 0};
  ASSERT_EQ(modal.create(host.table(), &g, &mode, 1, nullptr, nullptr, &p, err.sink()), SIEVE_OK) << err.all();
  EXPECT_EQ(modal.instance_hooks(p), uint32_t(SIEVE_HOOK_SELECT | SIEVE_HOOK_ATTEND));
  modal.destroy(p);

  // A hook the class does not override: create fails, naming it, and frees what it allocated.
  mode = {SIEVE_PARAM_ENUM, 2, 0, "bogus", nullptr, 0};
  EXPECT_EQ(modal.create(host.table(), &g, &mode, 1, nullptr, nullptr, &p, err.sink()), SIEVE_ERR_INTERNAL);
  EXPECT_EQ(p, nullptr);
  ASSERT_FALSE(err.lines.empty());
  EXPECT_EQ(err.lines.back(), "create: use_hooks() names correct, which the policy class does not override "
                              "(it overrides select, attend)");
  EXPECT_EQ(host.live_allocations(), 0u);
}

TEST(PluginSupport, ToolsDeclaredInTheClassReachThePluginTable) {
  const sieve_plugin& with = sp::plugin_table_v<ToolPolicy>;
  EXPECT_EQ(with.hdr.struct_size, sizeof(sieve_plugin));
  ASSERT_EQ(with.n_tools, 2u);
  EXPECT_EQ(with.tools, ToolPolicy::kTools);
  EXPECT_STREQ(with.tools[0].name, "count-args");
  EXPECT_EQ(with.tools[1].hdr.struct_size, sizeof(sieve_tool));
  const sieve_plugin& without = sp::plugin_table_v<MinimalPolicy>;
  EXPECT_EQ(without.tools, nullptr);
  EXPECT_EQ(without.n_tools, 0u);
}

TEST(PluginSupport, AToolRunsItsMainAndAThrowIsOneLineAndStatus1) {
  const sieve_tool* tools = sp::plugin_table_v<ToolPolicy>.tools;
  const char* argv[] = {"sieve tool minimal count-args", "a", "b", nullptr};
  EXPECT_EQ(tools[0].run(3, argv), 2);
  ::testing::internal::CaptureStderr();
  const char* argv2[] = {"sieve tool minimal throws", nullptr};
  EXPECT_EQ(tools[1].run(1, argv2), 1);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "sieve tool minimal throws: no model named 'x'\n");
}

TEST(PluginSupport, EntryPointNegotiatesTheMajor) {
  uint32_t major = 99;
  const sieve_plugin* table = nullptr;
  ASSERT_EQ(sieve_plugin_entry(1, &major, &table), SIEVE_OK);
  EXPECT_EQ(major, 1u);
  ASSERT_EQ(table, &sp::plugin_table_v<ProbePolicy>);
  EXPECT_EQ(table->abi_major, 1u);
  EXPECT_STREQ(table->name, "probe");
  EXPECT_EQ(table->policy, &probe_api());
  EXPECT_EQ(table->kv_store, nullptr);

  major = 99;
  EXPECT_EQ(sieve_plugin_entry(3, &major, &table), SIEVE_OK);  // a newer host still speaks 1
  EXPECT_EQ(major, 1u);
  EXPECT_NE(table, nullptr);

  major = 99;
  EXPECT_EQ(sieve_plugin_entry(0, &major, &table), SIEVE_ERR_VERSION);
  EXPECT_EQ(major, 1u);  // always written, so the host can name both numbers
  EXPECT_EQ(table, nullptr);

  EXPECT_EQ(sieve_plugin_entry(1, nullptr, &table), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(table, nullptr);
  EXPECT_EQ(sieve_plugin_entry(1, &major, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
}

TEST(PluginSupport, ValidateReportsEveryReason) {
  sieve_geometry g = probe_geometry();
  g.n_q_heads = 6;  // not a multiple of n_kv_heads = 4
  g.n_kv_heads = 4;
  g.head_dim = 16;  // not listed
  g.kv_dtype = sieve::kF16;
  g.device = {kDLCUDA, 0};
  ProbeValues pv;
  pv.v[0].i = 65;  // budget out of [1, 64]
  ReasonLog log;
  const int calls = ProbePolicy::validate_calls;
  EXPECT_EQ(probe_api().validate(&g, pv.v, pv.n, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(log.lines.size(), 5u) << log.all();
  const std::string all = log.all();
  EXPECT_THAT(all, HasSubstr("n_q_heads = 6 is not a multiple of n_kv_heads = 4"));
  EXPECT_THAT(all, HasSubstr("head_dim 16 is not supported by probe"));
  EXPECT_THAT(all, HasSubstr("KV dtype f16 is not supported"));
  EXPECT_THAT(all, HasSubstr("device cuda:0 is not supported"));
  EXPECT_THAT(all, HasSubstr("parameter 'budget' = 65 is outside [1, 64]"));
  EXPECT_EQ(ProbePolicy::validate_calls, calls) << "the policy's own validate runs after the generic checks pass";
}

TEST(PluginSupport, ValidateStatusIsUnsupportedWhenNothingIsInvalid) {
  sieve_geometry g = probe_geometry();
  g.kv_dtype = sieve::kF16;
  ProbeValues pv;
  ReasonLog log;
  EXPECT_EQ(probe_api().validate(&g, pv.v, pv.n, log.sink()), SIEVE_ERR_UNSUPPORTED);
  EXPECT_EQ(log.lines.size(), 1u) << log.all();
}

TEST(PluginSupport, ValidateRunsThePolicysOwnChecksAndAcceptsGoodInput) {
  sieve_geometry g = probe_geometry();
  ProbeValues pv;
  ReasonLog log;
  EXPECT_EQ(probe_api().validate(&g, pv.v, pv.n, log.sink()), SIEVE_OK) << log.all();
  EXPECT_TRUE(log.lines.empty());

  g.max_seq_len = 100;  // budget 8 x page 16 = 128 > 100
  const int calls = ProbePolicy::validate_calls;
  EXPECT_EQ(probe_api().validate(&g, pv.v, pv.n, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(ProbePolicy::validate_calls, calls + 1);
  ASSERT_EQ(log.lines.size(), 1u);
  EXPECT_THAT(log.lines[0], HasSubstr("budget x page_size = 128 exceeds max_seq_len"));
}

TEST(PluginSupport, ValidateRefusesBadValuesAndStructs) {
  sieve_geometry g = probe_geometry();
  ProbeValues pv;
  {
    ReasonLog log;
    EXPECT_EQ(probe_api().validate(&g, pv.v, 2, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
    ASSERT_EQ(log.lines.size(), 1u);
    EXPECT_THAT(log.lines[0], HasSubstr("expected 6 parameter value(s) (budget, tau, pin, metric, "
                                        "weights, layers), got 2"));
  }
  {
    ReasonLog log;
    EXPECT_EQ(probe_api().validate(nullptr, pv.v, pv.n, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(log.all(), HasSubstr("geometry is NULL"));
  }
  {
    ReasonLog log;
    sieve_geometry small = g;
    small.hdr.struct_size = 12;
    EXPECT_EQ(probe_api().validate(&small, pv.v, pv.n, log.sink()), SIEVE_ERR_VERSION);
    EXPECT_THAT(log.all(), HasSubstr("geometry is 12 bytes"));
  }
  {
    ReasonLog log;
    ProbeValues bad;
    bad.v[1].type = SIEVE_PARAM_INT;    // tau sent as an int
    bad.v[2].i = 2;                     // not a bool
    bad.v[3].i = 2;                     // enum index past "cosine|l2"
    bad.v[4].s = nullptr;               // NULL string
    bad.layers[1] = 40;                 // list entry out of [0, 31]
    EXPECT_EQ(probe_api().validate(&g, bad.v, bad.n, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(log.lines.size(), 5u) << log.all();
    EXPECT_THAT(log.all(), HasSubstr("parameter 'tau' is a float, got a value of type int"));
    EXPECT_THAT(log.all(), HasSubstr("parameter 'layers' entry 1 = 40 is outside [0, 31]"));
  }
  {
    ReasonLog log;
    ProbeValues bad;
    bad.v[1].f = 1.25;  // tau out of [0, 1]: numbers are printed as a user writes them
    EXPECT_EQ(probe_api().validate(&g, bad.v, bad.n, log.sink()), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_EQ(log.all(), "parameter 'tau' = 1.25 is outside [0, 1]\n");
  }
  // A sink without a callback is simply not told.
  EXPECT_EQ(probe_api().validate(&g, pv.v, 1, sieve_reason_sink{nullptr, nullptr}),
            SIEVE_ERR_INVALID_ARGUMENT);
}

TEST(PluginSupport, CreateAllocatesThroughTheHostAndDestroyFrees) {
  NiceMock<MockHostServices> host;
  sieve_geometry g = probe_geometry();
  ProbeValues pv;
  EXPECT_CALL(host, alloc(_, 1024, 64)).Times(1);
  EXPECT_CALL(host, log(SIEVE_LOG_INFO, "probe", "created with budget 8")).Times(1);
  sieve_policy* p = nullptr;
  ReasonLog err;
  ASSERT_EQ(probe_api().create(host.table(), &g, pv.v, pv.n, nullptr, nullptr, &p, err.sink()),
            SIEVE_OK)
      << err.all();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(host.live_allocations(), 1u);
  EXPECT_STREQ(probe_api().last_error(p), "");
  EXPECT_CALL(host, free(_, _)).Times(1);
  probe_api().destroy(p);
  EXPECT_EQ(host.live_allocations(), 0u);
}

TEST(PluginSupport, CreateRefusesWhatValidateRefusesWithOneLine) {
  StrictMock<MockHostServices> host;  // nothing may be allocated or logged
  sieve_geometry g = probe_geometry();
  g.page_size = 0;
  ProbeValues pv;
  pv.v[0].i = 0;
  sieve_policy* p = reinterpret_cast<sieve_policy*>(&host);  // must be reset to NULL
  ReasonLog err;
  EXPECT_EQ(probe_api().create(host.table(), &g, pv.v, pv.n, nullptr, nullptr, &p, err.sink()),
            SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(err.lines.size(), 1u);
  EXPECT_THAT(err.lines[0], AllOf(HasSubstr("create: "), HasSubstr("page_size = 0 must be > 0"),
                                  HasSubstr("; parameter 'budget' = 0 is outside [1, 64]")));
}

TEST(PluginSupport, CreateTurnsAThrowingConstructorIntoAStatusWithoutLeaking) {
  NiceMock<MockHostServices> host;
  sieve_geometry g = probe_geometry();
  ProbeValues pv;
  pv.v[4].s = "missing.bin";
  sieve_policy* p = nullptr;
  ReasonLog err;
  EXPECT_EQ(probe_api().create(host.table(), &g, pv.v, pv.n, nullptr, nullptr, &p, err.sink()),
            SIEVE_ERR_NOT_FOUND);
  EXPECT_EQ(p, nullptr);
  ASSERT_EQ(err.lines.size(), 1u);
  EXPECT_EQ(err.lines[0], "create: weights file 'missing.bin' not found");
  EXPECT_EQ(host.live_allocations(), 0u) << "the scratch allocated before the throw was freed";
}

TEST(PluginSupport, CreateReportsAHostOutOfMemoryAndBadServices) {
  NiceMock<MockHostServices> host;
  sieve_geometry g = probe_geometry();
  ProbeValues pv;
  sieve_policy* p = nullptr;
  ReasonLog err;
  EXPECT_CALL(host, alloc(_, _, _)).WillOnce(Return(nullptr));
  EXPECT_EQ(probe_api().create(host.table(), &g, pv.v, pv.n, nullptr, nullptr, &p, err.sink()),
            SIEVE_ERR_OUT_OF_MEMORY);
  EXPECT_THAT(err.all(), HasSubstr("could not allocate 1024 bytes on cpu"));

  err.lines.clear();
  EXPECT_EQ(probe_api().create(nullptr, &g, pv.v, pv.n, nullptr, nullptr, &p, err.sink()),
            SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(err.all(), HasSubstr("host services is NULL"));

  sieve_host_services old = *host.table();
  old.hdr.struct_size = 16;
  err.lines.clear();
  EXPECT_EQ(probe_api().create(&old, &g, pv.v, pv.n, nullptr, nullptr, &p, err.sink()),
            SIEVE_ERR_VERSION);
  EXPECT_EQ(probe_api().create(host.table(), &g, pv.v, pv.n, nullptr, nullptr, nullptr, err.sink()),
            SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
}

}  // namespace
