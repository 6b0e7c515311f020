// `sieve-conform` as a third party's CI gate uses it: exit codes, the --json schema
// (sieve.conform/1), every check name documented in docs/conformance.md, --param and --geometry.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>

#include "../plugins/support/run_command.hpp"

namespace {

using ::testing::HasSubstr;

using CliResult = sieve::testing::CommandResult;

CliResult conform(const std::string& args, bool merge_stderr = true) {
  return sieve::testing::run_command(std::string(SIEVE_BIN_DIR) + "/sieve-conform " + args +
                                     (merge_stderr ? " 2>&1" : " 2>/dev/null"));
}

std::string fixture(const std::string& name) { return std::string(SIEVE_FIXTURE_DIR) + "/libsieve_" + name + ".so"; }

nlohmann::json parse(const CliResult& r) {
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON (" << e.what() << "):\n" << r.out;
    return {};
  }
}

const nlohmann::json* check(const nlohmann::json& j, const std::string& name) {
  for (const auto& c : j["checks"])
    if (c["name"] == name) return &c;
  return nullptr;
}

// The names in docs/conformance.md's check table: lines "| `name` | ...".
std::set<std::string> documented_checks() {
  std::ifstream f(std::string(SIEVE_SOURCE_DIR) + "/docs/conformance.md");
  std::set<std::string> names;
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("| `", 0) == 0) names.insert(line.substr(3, line.find('`', 3) - 3));
  return names;
}

TEST(ConformCli, JsonSchemaAndDocumentedNames) {
  CliResult r = conform(fixture("minimal") + " --json");
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = parse(r);
  EXPECT_EQ(j["schema"], "sieve.conform/1");
  EXPECT_EQ(j["plugin"], fixture("minimal"));
  EXPECT_EQ(j["passed"], true);
  size_t pass = 0, fail = 0, skip = 0;
  const std::set<std::string> documented = documented_checks();
  ASSERT_GT(documented.size(), 20u) << "docs/conformance.md has no check table";
  for (const auto& c : j["checks"]) {
    ASSERT_TRUE(c["name"].is_string() && c["result"].is_string() && c["detail"].is_string()) << c;
    const std::string res = c["result"];
    (res == "pass" ? pass : res == "fail" ? fail : skip)++;
    EXPECT_TRUE(res == "pass" || res == "fail" || res == "skip") << res;
    EXPECT_TRUE(documented.count(c["name"])) << c["name"] << " is not documented in docs/conformance.md";
  }
  EXPECT_EQ(j["counts"]["pass"], pass);
  EXPECT_EQ(j["counts"]["fail"], fail);
  EXPECT_EQ(j["counts"]["skip"], skip);
  EXPECT_EQ(fail, 0u);
  ASSERT_NE(check(j, "numeric_cpu_decode"), nullptr);
  EXPECT_EQ((*check(j, "numeric_cpu_decode"))["result"], "pass");
}

// The KV-store suite's names too (a store-only plugin: the static part's policy checks skip), and
// every store check says which store it ran on.
TEST(ConformCli, StoreChecksAreDocumented) {
  CliResult r = conform(std::string(SIEVE_FIXTURE_DIR) + "/stores/libsieve_store_ok.so --json", false);
  ASSERT_EQ(r.status, 0) << r.out;
  nlohmann::json j = parse(r);
  const std::set<std::string> documented = documented_checks();
  size_t store_checks = 0;
  for (const auto& c : j["checks"]) {
    EXPECT_TRUE(documented.count(c["name"])) << c["name"] << " is not documented in docs/conformance.md";
    if (!c.contains("store")) continue;
    ++store_checks;
    EXPECT_EQ(c["store"], "store_ok");
  }
  EXPECT_EQ(store_checks, 18u) << "store_table, store_validate and 8 checks on each of 2 devices";
}

// A plugin that logs while it is checked (streaming warns when its window covers the whole
// sequence) must not break the JSON on stdout.
TEST(ConformCli, JsonStdoutStaysCleanWhenThePluginLogs) {
  const std::string streaming = std::string(SIEVE_PLUGIN_DIR) + "/libsieve_streaming.so";
  CliResult both = conform(streaming + " --json --param window=100000");
  EXPECT_THAT(both.out, HasSubstr("warn")) << "the plugin should have logged a warning";
  CliResult r = conform(streaming + " --json --param window=100000", false);
  // A window that covers every context never reaches the sparse path: the report says so (exit 1),
  // and stdout is still the report alone.
  EXPECT_EQ(r.status, 1) << r.out;
  nlohmann::json j = parse(r);
  EXPECT_EQ(j["passed"], false);
  ASSERT_NE(check(j, "sparse_path_cpu"), nullptr);
  EXPECT_EQ((*check(j, "sparse_path_cpu"))["result"], "fail");
}

TEST(ConformCli, FailingPluginExitsOne) {
  CliResult r = conform(fixture("writes_nan") + " --json");
  EXPECT_EQ(r.status, 1) << r.out;
  nlohmann::json j = parse(r);
  EXPECT_EQ(j["passed"], false);
  EXPECT_GT(j["counts"]["fail"].get<int>(), 0);
}

TEST(ConformCli, UsageErrorsExitTwo) {
  for (const char* args : {"--store", "x.so --store paged-cpu", "--store no_such_store", "--bogus x.so", "a.so b.so", "x.so --param nameonly", "x.so --geometry hq=3,hkv=2",
                           "x.so --geometry heads=8", "x.so --geometry d=0", "x.so --geometry layers=-1", "x.so --timeout 0"}) {
    CliResult r = conform(args);
    EXPECT_EQ(r.status, 2) << args << "\n" << r.out;
    EXPECT_THAT(r.out, HasSubstr("sieve conform: ")) << args;
  }
}

TEST(ConformCli, ParamsReachEveryCheck) {
  // In range: passes, and the values are echoed in the report.
  CliResult ok = conform(fixture("minimal") + " --json --param budget=128 --param=mode=last");
  ASSERT_EQ(ok.status, 0) << ok.out;
  nlohmann::json j = parse(ok);
  EXPECT_EQ(j["options"]["params"]["budget"], "128");
  EXPECT_EQ(j["options"]["params"]["mode"], "last");
  // Out of range / unknown: the static and numeric parts both refuse, naming the parameter.
  CliResult bad = conform(fixture("minimal") + " --json --param budget=5000");
  EXPECT_EQ(bad.status, 1) << bad.out;
  j = parse(bad);
  ASSERT_NE(check(j, "validate_accepts_declared"), nullptr);
  EXPECT_EQ((*check(j, "validate_accepts_declared"))["result"], "fail");
  EXPECT_THAT((*check(j, "validate_accepts_declared"))["detail"].get<std::string>(), HasSubstr("budget"));
  ASSERT_NE(check(j, "numeric_cpu_decode"), nullptr);
  EXPECT_EQ((*check(j, "numeric_cpu_decode"))["result"], "fail");
}

TEST(ConformCli, GeometryOverride) {
  // The minimal fixture declares head dims 64 and 128, page 16: an override inside that passes and
  // runs exactly that geometry; one outside it is refused by the plugin's own validate.
  CliResult ok = conform(fixture("minimal") + " --json --geometry hq=4,hkv=4,d=64,page=16,dtype=f16");
  ASSERT_EQ(ok.status, 0) << ok.out;
  nlohmann::json j = parse(ok);
  EXPECT_EQ(j["options"]["geometry"], "hq=4,hkv=4,d=64,page=16,dtype=f16");
  const auto* dec = check(j, "numeric_cpu_decode");
  ASSERT_NE(dec, nullptr);
  EXPECT_THAT((*dec)["detail"].get<std::string>(), HasSubstr("1 geometries"));
  EXPECT_THAT((*dec)["detail"].get<std::string>(), HasSubstr("hq 4/hkv 4, d 64, page 16, f16"));
  CliResult bad = conform(fixture("minimal") + " --json --geometry d=8");
  EXPECT_EQ(bad.status, 1) << bad.out;
  j = parse(bad);
  EXPECT_EQ((*check(j, "validate_accepts_declared"))["result"], "fail");
}

}  // namespace
