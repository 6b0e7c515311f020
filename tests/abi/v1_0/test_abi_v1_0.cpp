// ABI stability against the frozen v1.0 headers (tests/abi/v1_0/sieve, a copy that never changes):
//  - the live headers keep every v1.0 field at its offset and size, every struct at least as large,
//    every constant unchanged (minor versions only append);
//  - a plugin built against the frozen headers loads, passes conformance and runs in chains;
//  - its tables end at a guard page, so none of that read a byte past a table's struct_size: a
//    field a later minor appends is never read from an older plugin (a death test shows the guard
//    does fire on such a read).
// A plugin of another major is refused naming both numbers: the wrong_major fixture, tested in
// tests/runtime (test_loader, test_conformance, test_cli).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "layout_entry.h"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/conformance.hpp"
#include "sieve/runtime/loader.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/workload/synthetic.hpp"

namespace {

using namespace sieve::runtime;
using ::testing::HasSubstr;

const std::string kGuarded = std::string(SIEVE_FIXTURE_DIR) + "/v1_0/libsieve_v1_0_guarded.so";

TEST(AbiV1_0, LiveHeadersOnlyAppend) {
  ASSERT_EQ(sieve_layout_frozen_count, sieve_layout_live_count);
  ASSERT_GT(sieve_layout_frozen_count, 200u);
  for (size_t i = 0; i < sieve_layout_frozen_count; ++i) {
    const sieve_layout_entry& f = sieve_layout_frozen[i];
    const sieve_layout_entry& l = sieve_layout_live[i];
    const std::string what = f.what;
    ASSERT_EQ(what, l.what);
    if (what.rfind("sizeof(", 0) == 0)
      EXPECT_GE(l.a, f.a) << what << " shrank from v1.0";
    else if (what.find('.') != std::string::npos)
      EXPECT_TRUE(l.a == f.a && l.b == f.b)
          << what << ": v1.0 offset " << f.a << " size " << f.b << ", live offset " << l.a << " size " << l.b;
    else
      EXPECT_EQ(l.a, f.a) << what << " changed value since v1.0";
  }
}

// Structs that cannot grow within major 1 keep their exact v1.0 size: sieve_param_value has no
// header and travels in arrays walked by sizeof; sieve_geometry is embedded by value in
// sieve_kv_config (abi.h: sieve_geometry_v1_0). Growing either would move what follows them.
TEST(AbiV1_0, HeaderlessAndEmbeddedStructsNeverGrow) {
  int checked = 0;
  for (size_t i = 0; i < sieve_layout_frozen_count; ++i) {
    const std::string what = sieve_layout_frozen[i].what;
    if (what == "sizeof(sieve_param_value)" || what == "sizeof(sieve_geometry)") {
      EXPECT_EQ(sieve_layout_live[i].a, sieve_layout_frozen[i].a) << what << " changed size";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 2);
}

// What the frozen plugin's tables say about themselves: v1.0 sizes and minor 0.
TEST(AbiV1_0, FrozenPluginLoadsWithV1_0Tables) {
  LoadedPlugin p;
  std::string err;
  ASSERT_TRUE(load_plugin(kGuarded, &p, &err)) << err;
  EXPECT_EQ(p.plugin_major, 1u);
  EXPECT_EQ(p.table->hdr.version, 0u);
  size_t frozen_policy_api = 0;
  for (size_t i = 0; i < sieve_layout_frozen_count; ++i)
    if (std::string(sieve_layout_frozen[i].what) == "sizeof(sieve_policy_api)") frozen_policy_api = sieve_layout_frozen[i].a;
  EXPECT_EQ(p.policy()->hdr.struct_size, frozen_policy_api);
  EXPECT_EQ(std::string(p.name()), "v1_0_guarded");
}

TEST(AbiV1_0, FrozenPluginPassesConformance) {
  ConformReport r = conform(kGuarded);
  std::string failed;
  for (const auto& c : r.checks)
    if (!c.passed && !c.skipped) failed += c.name + ": " + c.detail + "\n";
  EXPECT_TRUE(r.passed()) << failed;
  for (const char* name : {"numeric_cpu_decode", "numeric_cpu_prefill", "hooks_reject_null_arguments"}) {
    const ConformCheck* c = r.find(name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_TRUE(c->passed) << name << ": " << c->detail;
  }
}

// The decode and prefill chains, each on a ragged synthetic batch; the exit code says what failed.
int run_chains() {
  Registry registry;
  if (!registry.add_file(kGuarded)) return 2;
  for (const char* spec : {"decode:0=v1_0_guarded(budget=8,mode=c)", "prefill:0=v1_0_guarded"}) {
    ChainSpec chain;
    std::string err;
    if (!parse_chain_spec(spec, &chain, &err)) return 3;
    SyntheticSpec s;
    s.phase = std::string(spec).rfind("prefill", 0) == 0 ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
    s.n_q_heads = 8, s.n_kv_heads = 2, s.head_dim = 64, s.page_size = 16;
    s.context = {75, 20};
    s.new_tokens = 19;
    s.timing_reps = 1;
    SyntheticReport rep;
    if (!run_synthetic(s, chain, registry, &rep, &err)) {
      std::fprintf(stderr, "%s\n", err.c_str());
      return 4;
    }
    if (!(rep.rel_err < 1e-4) || rep.non_finite) return 5;
  }
  return 0;
}

// In a forked child: a read past a guarded table kills it, and the test reports that instead of
// dying itself.
TEST(AbiV1_0, FrozenPluginRunsInChains) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the runtime may have started threads
  EXPECT_EXIT(std::_Exit(run_chains()), ::testing::ExitedWithCode(0), "");
}

// Reads the byte right after a table of `struct_size` bytes.
void read_past(const void* table, uint32_t struct_size) {
  volatile const char* past = static_cast<const char*>(table) + struct_size;
  std::fprintf(stderr, "read %d\n", int(*past));
}

// The guard is real: reading the first byte after a table's struct_size (where a field appended
// by a later minor would be) faults.
TEST(AbiV1_0DeathTest, GuardTrapsAReadPastATable) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  LoadedPlugin p;
  std::string err;
  ASSERT_TRUE(load_plugin(kGuarded, &p, &err)) << err;
  const sieve_policy_api* api = p.policy();
  // A future minor's field right after the v1.0 ones: absent per SIEVE_HAS_FIELD's rule.
  struct FutureApi {
    sieve_policy_api v1_0;
    void* appended_hook;
  };
  EXPECT_LT(api->hdr.struct_size, offsetof(FutureApi, appended_hook) + sizeof(void*));
  EXPECT_DEATH(read_past(api, api->hdr.struct_size), "");
  EXPECT_DEATH(read_past(p.table, p.table->hdr.struct_size), "");
  EXPECT_DEATH(read_past(api->descriptor, api->descriptor->hdr.struct_size), "");
  // The schema array: past its last element.
  EXPECT_DEATH(read_past(api->params, api->n_params * api->params->hdr.struct_size), "");
}

}  // namespace
