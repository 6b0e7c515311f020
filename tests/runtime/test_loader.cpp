// Loader: the good fixture loads; every broken file is refused with one line naming the file and
// the symbol or version involved; the structural table checks catch each malformation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include <sieve/runtime/descriptor_names.hpp>
#include <sieve/runtime/loader.hpp>
#include <sieve/runtime/registry.hpp>
#include <sieve/util/abi_v1_0.hpp>
#include <sieve/util/status.hpp>

#include "sieve/kv/paged_store.hpp"

#include "runtime_test_util.hpp"

using namespace sieve::runtime;
using sieve::test::fixture;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace {

std::string load_error(const std::string& path, uint32_t host_major = SIEVE_ABI_MAJOR) {
  LoadedPlugin p;
  std::string err;
  EXPECT_FALSE(load_plugin(path, &p, &err, host_major)) << path << " loaded";
  EXPECT_EQ(p.table, nullptr);
  EXPECT_EQ(err.find('\n'), std::string::npos) << "one line: " << err;
  return err;
}

TEST(Loader, MinimalFixtureLoads) {
  LoadedPlugin p;
  std::string err;
  ASSERT_TRUE(load_plugin(fixture("minimal"), &p, &err)) << err;
  EXPECT_STREQ(p.name(), "minimal");
  EXPECT_EQ(p.plugin_major, SIEVE_ABI_MAJOR);
  EXPECT_FALSE(p.has_score);
  ASSERT_NE(p.policy(), nullptr);
  EXPECT_EQ(p.kv_store(), nullptr);
  ASSERT_NE(p.descriptor(), nullptr);
  EXPECT_STREQ(p.descriptor()->vendor, "sieve_test");
  EXPECT_EQ(p.policy()->n_params, 6u);
  EXPECT_TRUE(p.lib);
}

TEST(Loader, ScoreIsRead) {
  LoadedPlugin p;
  std::string err;
  ASSERT_TRUE(load_plugin(sieve::test::fixture_variant("minimal_cuda"), &p, &err)) << err;
  EXPECT_TRUE(p.has_score);
  EXPECT_EQ(p.score, 10);
  EXPECT_STREQ(p.name(), "minimal");
}

TEST(Loader, WrongMajorNamesBothNumbers) {
  std::string err = load_error(fixture("wrong_major"));
  EXPECT_THAT(err, StartsWith("libsieve_wrong_major.so: "));
  EXPECT_THAT(err, HasSubstr("ABI major 2 (plugin) vs 1 (host)"));
  EXPECT_THAT(err, HasSubstr("SIEVE_ERR_VERSION"));
}

TEST(Loader, HostOfferingAMajorThePluginLacks) {
  // A (hypothetical) major-2 host: the minimal plugin answers 1 and serves it, but this loader,
  // speaking only the major it offers, must refuse and name both numbers.
  std::string err = load_error(fixture("minimal"), SIEVE_ABI_MAJOR + 1);
  EXPECT_THAT(err, HasSubstr("ABI major 1 (plugin) vs 2 (host)"));
  // A host offering major 0 is refused by the plugin itself.
  err = load_error(fixture("minimal"), 0);
  EXPECT_THAT(err, HasSubstr("ABI major 1 (plugin) vs 0 (host)"));
}

TEST(Loader, MissingEntrySymbol) {
  std::string err = load_error(fixture("no_entry"));
  EXPECT_EQ(err, "libsieve_no_entry.so: no symbol 'sieve_plugin_entry' (not a Sieve plugin)");
}

TEST(Loader, NotAnElfFile) {
  std::string err = load_error(fixture("not_elf"));
  EXPECT_THAT(err, StartsWith("libsieve_not_elf.so: not an ELF shared library (file starts with 'This is a text f"));
}

TEST(Loader, TruncatedElfFile) {
  std::string err = load_error(fixture("truncated"));
  EXPECT_THAT(err, StartsWith("libsieve_truncated.so: truncated ELF file"));
}

TEST(Loader, MissingFileAndDirectory) {
  EXPECT_EQ(load_error("/nonexistent/libsieve_nothing.so"), "libsieve_nothing.so: no such file");
  EXPECT_EQ(load_error(SIEVE_FIXTURE_DIR), "fixtures: not a regular file");
}

TEST(Loader, EmptyFile) {
  sieve::test::ScratchDir dir;
  std::string path = dir.str() + "/libsieve_empty.so";
  { std::ofstream(path).flush(); }
  EXPECT_THAT(load_error(path), StartsWith("libsieve_empty.so: not an ELF shared library"));
}

TEST(Loader, BadDescriptorIsRefusedWithoutReadingPastItsSize) {
  std::string err = load_error(fixture("bad_descriptor"));
  EXPECT_THAT(err, StartsWith("libsieve_bad_descriptor.so: "));
  EXPECT_THAT(err, HasSubstr("descriptor struct_size 8 is smaller than the v1.0 size"));
}

TEST(Loader, BadSchemaIsRefused) {
  std::string err = load_error(fixture("bad_schema"));
  EXPECT_THAT(err, HasSubstr("schema: parameter 'top_k': default top_k=99 is out of range [1, 10]"));
}

TEST(Loader, OpenAndNegotiateSeparately) {
  PluginLibrary lib;
  std::string err;
  ASSERT_TRUE(open_plugin_library(fixture("minimal"), &lib, &err)) << err;
  EXPECT_NE(lib.entry, nullptr);
  EXPECT_EQ(lib.score, nullptr);
  LoadedPlugin p;
  ASSERT_TRUE(negotiate_plugin(lib, &p, &err)) << err;
  EXPECT_EQ(p.lib, lib.lib);  // shares the library
}

TEST(Loader, LoadedPluginOutlivesTheRegistry) {
  LoadedPlugin keep;
  {
    Registry r;
    ASSERT_TRUE(r.add_file(fixture("minimal")));
    keep = *r.find("minimal");
  }
  // The registry is gone; the copy still maps the code, so calling into it is fine.
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 1, g.n_q_heads = 4, g.n_kv_heads = 2, g.head_dim = 64, g.page_size = 16;
  g.kv_dtype = {kDLFloat, 32, 1};
  g.device = {kDLCPU, 0};
  std::vector<std::string> reasons;
  sieve_reason_sink sink{&reasons, [](void* c, const char* m) {
                           static_cast<std::vector<std::string>*>(c)->push_back(m);
                         }};
  // Wrong value count on purpose: the fixture must refuse with a reason, not crash.
  EXPECT_EQ(keep.policy()->validate(&g, nullptr, 0, sink), SIEVE_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(reasons[0], "minimal: expected 6 parameter values, got 0");
}

// ---- Structural checks on hand-made tables ------------------------------------------------------

struct Tables {
  sieve_policy_descriptor d{};
  sieve_policy_api api{};
  sieve_plugin plugin{};
  Tables() {
    d.hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor);
    d.name = "toy";
    d.vendor = "test";
    d.summary = "a toy";
    d.phases = SIEVE_PHASE_DECODE;
    d.devices = SIEVE_DEVICE_CPU;
    d.dtypes = SIEVE_DTYPE_F32;
    api.hdr = SIEVE_HEADER_INIT(sieve_policy_api);
    api.descriptor = &d;
    api.validate = [](const sieve_geometry*, const sieve_param_value*, uint32_t,
                      sieve_reason_sink) { return SIEVE_OK; };
    api.create = [](const sieve_host_services*, const sieve_geometry*, const sieve_param_value*,
                    uint32_t, sieve_kv_store*, const sieve_kv_store_api*, sieve_policy**,
                    sieve_reason_sink) { return SIEVE_ERR_UNSUPPORTED; };
    api.destroy = [](sieve_policy*) {};
    api.last_error = [](const sieve_policy*) { return ""; };
    api.select = [](sieve_policy*, const sieve_layer_call*, sieve_selection*, uint32_t*) {
      return SIEVE_OK;
    };
    plugin.hdr = SIEVE_HEADER_INIT(sieve_plugin);
    plugin.abi_major = SIEVE_ABI_MAJOR;
    plugin.name = "toy";
    plugin.policy = &api;
  }
  std::vector<std::string> check() { return check_plugin_table(&plugin, SIEVE_ABI_MAJOR); }
};

TEST(TableChecks, WellFormedTablePasses) {
  Tables t;
  EXPECT_THAT(t.check(), ::testing::IsEmpty());
}

TEST(TableChecks, EachMalformationIsNamed) {
  using ::testing::ElementsAre;
  EXPECT_THAT(check_plugin_table(nullptr, 1), ElementsAre("plugin table is NULL"));
  {
    Tables t;
    t.plugin.hdr.struct_size = 12;
    EXPECT_THAT(t.check(), ElementsAre(HasSubstr("plugin table struct_size 12 is smaller")));
  }
  {
    Tables t;
    t.plugin.abi_major = 3;
    EXPECT_THAT(t.check(), ElementsAre("plugin table says ABI major 3 but the entry point answered 1"));
  }
  {
    Tables t;
    t.plugin.name = "Toy";
    t.d.name = "Toy";
    EXPECT_THAT(t.check(), ::testing::Contains("plugin name 'Toy' does not match [a-z0-9_]+"));
  }
  {
    Tables t;
    t.plugin.policy = nullptr;
    EXPECT_THAT(t.check(), ElementsAre("plugin table has neither a policy nor a KV store"));
  }
  {
    Tables t;
    t.api.create = nullptr;
    EXPECT_THAT(t.check(), ElementsAre("policy table: 'create' is NULL (required)"));
  }
  {
    Tables t;
    t.api.select = nullptr;
    EXPECT_THAT(t.check(), ElementsAre(HasSubstr("policy table implements no hook")));
  }
  {
    Tables t;
    t.d.name = "other";
    EXPECT_THAT(t.check(),
                ElementsAre("descriptor: name 'other' differs from the plugin name 'toy'"));
  }
  {
    Tables t;
    t.d.phases = 0;
    t.d.devices = 1u << 5;
    EXPECT_THAT(t.check(), ElementsAre("descriptor: phases is 0 (declare at least one)",
                                       "descriptor: devices has unknown bits 0x20"));
  }
  {
    Tables t;
    t.d.n_head_dims = 2;  // head_dims stays NULL
    EXPECT_THAT(t.check(), ElementsAre("descriptor: head_dims: n is 2 but the array is NULL"));
  }
  {
    Tables t;
    static const int32_t sizes[] = {16, 0};
    t.d.page_sizes = sizes;
    t.d.n_page_sizes = 2;
    EXPECT_THAT(t.check(), ElementsAre("descriptor: page_sizes[1] = 0 (must be > 0)"));
  }
  {
    Tables t;
    t.d.evicts_kv = 1;
    t.d.cuda_graph = 7;
    t.d.selection_heads = 3;
    EXPECT_THAT(t.check(), ElementsAre("descriptor: selection_heads 3 is not a sieve_selection_heads",
                                       "descriptor: cuda_graph 7 is not a sieve_cuda_graph_level",
                                       "descriptor: evicts_kv is set but end_step is NULL"));
  }
  {
    Tables t;
    t.d.needs = SIEVE_NEEDS_PAGE_STATS;
    EXPECT_THAT(t.check(), ElementsAre("descriptor: needs page statistics but observe is NULL"));
  }
  {
    Tables t;
    t.api.n_params = 3;
    EXPECT_THAT(t.check(), ElementsAre("policy table: n_params is 3 but params is NULL"));
  }
  {
    Tables t;
    t.d.vendor = "";
    t.d.summary = nullptr;
    EXPECT_THAT(t.check(), ElementsAre("descriptor: empty vendor", "descriptor: empty summary"));
  }
}

TEST(TableChecks, KvStoreTable) {
  sieve_kv_store_api kv{};
  kv.hdr = SIEVE_HEADER_INIT(sieve_kv_store_api);
  kv.name = "paged";
  auto problems = check_kv_store_api(&kv);
  EXPECT_EQ(problems.size(), 9u);  // every required function is missing
  EXPECT_THAT(problems, ::testing::Contains("KV store table: 'append' is NULL (required)"));
  kv.hdr.struct_size = 4;
  EXPECT_THAT(check_kv_store_api(&kv),
              ::testing::ElementsAre(HasSubstr("KV store table struct_size 4 is smaller")));
}

// ABI 1.1 store tables: the descriptor and the parameter schema are checked like a policy's, and a
// declared feature must be reachable through the table.
TEST(TableChecks, KvStoreDescriptor) {
  struct Store {
    const int32_t pages[2] = {16, 32};
    sieve_param_spec spec[1] = {{SIEVE_HEADER_INIT(sieve_param_spec), "pool_mb", SIEVE_PARAM_INT, "64", 1, 4096, nullptr,
                                 "pool size"}};
    sieve_kv_store_descriptor d{SIEVE_HEADER_INIT(sieve_kv_store_descriptor), "paged", "sieve", 1, 1, 0, "a store",
                                SIEVE_DEVICE_CPU, SIEVE_DTYPE_F32, pages, 2, SIEVE_KV_LAYOUT_HND,
                                SIEVE_KV_FEATURE_SIDECARS | SIEVE_KV_FEATURE_EVICTION};
    sieve_kv_store_api api = *sieve::kv::paged_cpu_store_api();
    Store() {
      api.hdr = SIEVE_HEADER_INIT(sieve_kv_store_api);
      api.descriptor = &d;
      api.params = spec;
      api.n_params = 1;
    }
    std::vector<std::string> check() { return check_kv_store_api(&api); }
  };
  EXPECT_THAT(Store().check(), ::testing::IsEmpty());
  {
    Store s;
    s.d.name = "Paged-CPU";
    s.d.features |= 1u << 9;
    s.d.layouts = 0;
    EXPECT_THAT(s.check(), ::testing::ElementsAre(
                               "KV store descriptor: name 'Paged-CPU' does not match [a-z0-9_]+",
                               "KV store descriptor: layouts is 0 (declare at least one)",
                               "KV store descriptor: features has unknown bits 0x200"));
  }
  {
    Store s;
    s.d.devices = 1u << 5;
    s.d.dtypes = 0;
    const int32_t bad[1] = {0};
    s.d.page_sizes = bad;
    s.d.n_page_sizes = 1;
    EXPECT_THAT(s.check(), ::testing::ElementsAre("KV store descriptor: devices has unknown bits 0x20",
                                                  "KV store descriptor: dtypes is 0 (declare at least one)",
                                                  "KV store descriptor: page_sizes[0] = 0 (must be in [1, 65536])"));
  }
  {
    Store s;  // features the table cannot serve
    s.api.evict = nullptr;
    s.api.sidecar = nullptr;
    s.d.features |= SIEVE_KV_FEATURE_ENGINE_PAGES;
    EXPECT_THAT(s.check(), ::testing::ElementsAre("KV store descriptor: features has SIDECARS but 'sidecar' is NULL",
                                                  "KV store descriptor: features has EVICTION but 'evict' is NULL",
                                                  "KV store descriptor: features has ENGINE_PAGES but 'bind_pages' is NULL"));
  }
  {
    Store s;  // a schema a policy would be refused for, and the size of a 1.0 descriptor-less table
    s.spec[0].min = 10;
    s.spec[0].max = 1;
    EXPECT_THAT(s.check(), ::testing::ElementsAre(StartsWith("KV store schema: ")));
    s.api.n_params = 3;
    s.api.params = nullptr;
    EXPECT_THAT(s.check(), ::testing::ElementsAre("KV store table: n_params is 3 but params is NULL"));
    s.d.hdr.struct_size = 8;
    s.api.n_params = 0;
    EXPECT_THAT(s.check(), ::testing::ElementsAre(HasSubstr("KV store descriptor struct_size 8 is smaller")));
    s.api.hdr.struct_size = uint32_t(sieve::util::v1_0_size<sieve_kv_store_api>());  // a 1.0 table: not read
    EXPECT_THAT(s.check(), ::testing::IsEmpty());
  }
}

// ---- Tools (ABI 1.1) ------------------------------------------------------------------------------

int32_t tool_ok(int32_t, const char* const*) { return 0; }

struct ToolTables : Tables {
  sieve_tool tools[2]{};
  ToolTables() {
    tools[0] = {SIEVE_HEADER_INIT(sieve_tool), "calibrate", "per-head thresholds", &tool_ok};
    tools[1] = {SIEVE_HEADER_INIT(sieve_tool), "distill-gate", "a gate for a model", &tool_ok};
    plugin.tools = tools;
    plugin.n_tools = 2;
  }
  LoadedPlugin loaded() {
    LoadedPlugin p;
    p.table = &plugin;
    return p;
  }
};

TEST(ToolChecks, WellFormedToolsPassAndAreListedByName) {
  ToolTables t;
  EXPECT_THAT(t.check(), ::testing::IsEmpty());
  const LoadedPlugin p = t.loaded();
  ASSERT_EQ(p.tools().size(), 2u);
  EXPECT_STREQ(p.tools()[1]->name, "distill-gate");
  EXPECT_EQ(p.tool("calibrate"), &t.tools[0]);
  EXPECT_EQ(p.tool("distill"), nullptr);
}

TEST(ToolChecks, AV10TableIsNotReadPastItsSize) {
  ToolTables t;
  // A 1.0 producer fills only up to kv_store: whatever lies beyond is not its tools.
  t.plugin.hdr.struct_size = uint32_t(sieve::util::v1_0_size<sieve_plugin>());
  t.plugin.n_tools = 0xdeadbeef;
  t.plugin.tools = reinterpret_cast<const sieve_tool*>(uintptr_t(16));
  EXPECT_THAT(t.check(), ::testing::IsEmpty());
  EXPECT_TRUE(t.loaded().tools().empty());
  EXPECT_EQ(t.loaded().tool("calibrate"), nullptr);
}

TEST(ToolChecks, EachMalformationIsNamed) {
  using ::testing::ElementsAre;
  {
    ToolTables t;
    t.plugin.n_tools = kMaxTools + 1;
    EXPECT_THAT(t.check(), ElementsAre("tools: n_tools 65 exceeds the limit 64"));
  }
  {
    ToolTables t;
    t.plugin.tools = nullptr;
    EXPECT_THAT(t.check(), ElementsAre("tools: n_tools is 2 but tools is NULL"));
  }
  {
    ToolTables t;
    t.tools[0].hdr.struct_size = 8;
    EXPECT_THAT(t.check(), ElementsAre(HasSubstr("tool[0] struct_size 8 is smaller than the v1.1 size")));
  }
  {
    ToolTables t;
    t.tools[0].hdr.struct_size = kMaxStructSize + 8;
    EXPECT_THAT(t.check(), ElementsAre("tool[0] struct_size 65544 exceeds the limit 65536"));
  }
  {
    ToolTables t;
    t.tools[1].hdr.struct_size += 8;
    EXPECT_THAT(t.check(), ElementsAre(HasSubstr("tool[1] struct_size")));
  }
  {
    ToolTables t;
    t.tools[0].name = "Calibrate";
    t.tools[1].name = "calibrate";
    EXPECT_THAT(t.check(), ElementsAre("tool[0] name 'Calibrate' does not match [a-z0-9_-]+"));
  }
  {
    ToolTables t;
    t.tools[1].name = "calibrate";
    EXPECT_THAT(t.check(), ElementsAre("tool[1] name 'calibrate' is used twice"));
  }
  {
    ToolTables t;
    t.tools[0].summary = "";
    t.tools[1].run = nullptr;
    EXPECT_THAT(t.check(), ElementsAre("tool[0]: empty summary", "tool[1]: 'run' is NULL (required)"));
  }
  {
    ToolTables t;
    const std::string long_name(kMaxNameLength + 1, 'a');
    t.tools[1].name = long_name.c_str();
    EXPECT_THAT(t.check(), ElementsAre(HasSubstr("tool[1] name 'aaaa")));
    EXPECT_THAT(t.check(), ElementsAre(HasSubstr("is longer than 64 bytes")));
  }
}

TEST(Names, CapabilityBits) {
  EXPECT_EQ(phase_names(SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE), "prefill,decode");
  EXPECT_EQ(device_names(SIEVE_DEVICE_CUDA), "cuda");
  EXPECT_EQ(dtype_names(SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16), "f16,bf16");
  EXPECT_EQ(needs_names(0), "-");
  EXPECT_EQ(sieve::status_name(SIEVE_ERR_VERSION), "SIEVE_ERR_VERSION");
  EXPECT_EQ(sieve::status_name(42), "status 42");
  EXPECT_TRUE(is_identifier("quest_2"));
  EXPECT_FALSE(is_identifier("Quest"));
  EXPECT_FALSE(is_identifier(""));
  EXPECT_FALSE(is_identifier(nullptr));
  EXPECT_TRUE(is_tool_name("distill-gate"));
  EXPECT_FALSE(is_identifier("distill-gate"));
  EXPECT_FALSE(is_tool_name("distill gate"));
  EXPECT_FALSE(is_tool_name(""));
}

}  // namespace
