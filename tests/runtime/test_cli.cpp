// The `sieve plugins` and `sieve conform` commands, run as subprocesses: exit codes and the lines
// a user (or CI) reads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "../plugins/support/run_command.hpp"
#include "runtime_test_util.hpp"

using sieve::test::fixture;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

using CliRun = sieve::testing::CommandResult;

CliRun sieve_cli(const std::string& args, bool merge_stderr = true,
                 std::string bin = std::string(SIEVE_BIN_DIR) + "/sieve") {
  return sieve::testing::run_command("'" + bin + "' " + args + (merge_stderr ? " 2>&1" : " 2>/dev/null"));
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(SIEVE_BIN_DIR) + "/sieve"))
      GTEST_SKIP() << "the sieve executable was not built";
  }
  sieve::test::EnvGuard no_env_{"SIEVE_PLUGIN_PATH", std::nullopt};
};

TEST_F(Cli, PluginsListsFixturesAndFailures) {
  CliRun r = sieve_cli("plugins --plugin-dir " SIEVE_FIXTURE_DIR);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("minimal 1.0.0 (sieve_test)"));
  EXPECT_THAT(r.out, HasSubstr("  phases     prefill,decode\n"));
  EXPECT_THAT(r.out, HasSubstr("budget     int       = 64"));
  EXPECT_THAT(r.out, HasSubstr("not loaded:\n"));
  EXPECT_THAT(r.out, HasSubstr(fixture("wrong_major") + ": ABI major 2 (plugin) vs 1 (host)"));
  EXPECT_THAT(r.out, HasSubstr(fixture("not_elf") + ": not an ELF shared library"));
}

TEST_F(Cli, PluginsJson) {
  CliRun r = sieve_cli("plugins --json --plugin-dir " SIEVE_FIXTURE_DIR, false);
  ASSERT_EQ(r.status, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["search_path"][0]["source"], "--plugin-dir");
  nlohmann::json minimal;
  for (auto& p : j["plugins"])
    if (p["name"] == "minimal" && p["path"].get<std::string>().rfind(SIEVE_FIXTURE_DIR, 0) == 0)
      minimal = p;
  ASSERT_FALSE(minimal.is_null()) << r.out;
  EXPECT_EQ(minimal["phases"], "prefill,decode");
  EXPECT_EQ(minimal["head_dims"], "64,128");
  EXPECT_EQ(minimal["cuda_graph"], "full");
  ASSERT_EQ(minimal["params"].size(), 6u);
  EXPECT_EQ(minimal["params"][2]["choices"], "first|last|both");
  bool saw_truncated = false;
  for (auto& f : j["failures"])
    saw_truncated |= f["reason"].get<std::string>().find("truncated ELF file") != std::string::npos;
  EXPECT_TRUE(saw_truncated);
}

TEST_F(Cli, PluginsListsTheStoresTheSameWayInBothForms) {
  CliRun text = sieve_cli("plugins --plugin-dir " SIEVE_FIXTURE_DIR, false);
  CliRun json = sieve_cli("plugins --json --plugin-dir " SIEVE_FIXTURE_DIR, false);
  ASSERT_EQ(json.status, 0) << json.out;
  auto j = nlohmann::json::parse(json.out);
  ASSERT_FALSE(j["stores"].empty());
  const auto& paged = j["stores"][0];
  EXPECT_EQ(paged["name"], "paged");
  EXPECT_EQ(paged["source"], "built-in");
  EXPECT_EQ(paged["layouts"], "hnd");
  EXPECT_EQ(paged["features"], "sidecars,eviction,pre_rope_k");
  EXPECT_TRUE(paged["params"].empty());
  // Every field of the JSON entry is a line of the text form.
  EXPECT_THAT(text.out, HasSubstr("KV stores (--kv-store NAME(k=v,...), a chain's kv_store line):\n\npaged " +
                                  paged["version"].get<std::string>() + " (sieve) — " +
                                  paged["summary"].get<std::string>() + "\n  source     built-in\n  devices    " +
                                  paged["devices"].get<std::string>() + "\n  dtypes     " +
                                  paged["dtypes"].get<std::string>() + "   page sizes " +
                                  paged["page_sizes"].get<std::string>() +
                                  "\n  layouts    hnd\n  features   sidecars,eviction,pre_rope_k\n"
                                  "  parameters none\n"));
}

TEST_F(Cli, AnUnknownOrBadStoreIsOneLineAndAFailure) {
  CliRun r = sieve_cli("attn --chain 'streaming(window=64)' --context 256 --kv-store pagd");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "sieve attn: kv store, col 1: unknown KV store 'pagd' (did you mean 'paged'?); available: paged, engine_pool\n");
  r = sieve_cli("attn --chain 'streaming(window=64)' --context 256 --kv-store 'paged(pool=2)'");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("KV store 'paged': unknown parameter 'pool'"));
  EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << r.out;
  r = sieve_cli("attn --chain 'kv_store=paged; *=dense' --context 256 --kv-store paged");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("the KV store is named twice"));
  r = sieve_cli("attn --chain 'streaming(window=64)' --context 256 --kv-store paged --json", false);
  EXPECT_EQ(r.status, 0) << r.out;
}

// A plugin tool that runs the model takes --kv-store: on the store it would use anyway it
// computes exactly what it computes without the option (CliInput covers the refusals).
TEST_F(Cli, ToolsRunOnTheStoreNamedWithKvStore) {
  CliRun plain = sieve_cli("calibrate dpxa --json", false);
  CliRun named = sieve_cli("calibrate dpxa --json --kv-store paged", false);
  ASSERT_EQ(plain.status, 0) << plain.out;
  ASSERT_EQ(named.status, 0) << named.out;
  EXPECT_FALSE(nlohmann::json::parse(named.out).empty());
  EXPECT_EQ(named.out, plain.out);
}

// `sieve plugins NAME` (the plugins' READMEs send readers there for the schema): one plugin's
// block of the listing, or one store's; the JSON form with only that entry; a plugin that ships a
// store shows both; an unknown name is one line and status 2.
TEST_F(Cli, PluginsNameShowsOnePluginOrStore) {
  CliRun all = sieve_cli("plugins --plugin-dir " SIEVE_FIXTURE_DIR, false);
  CliRun one = sieve_cli("plugins minimal --plugin-dir " SIEVE_FIXTURE_DIR, false);
  ASSERT_EQ(one.status, 0) << one.out;
  EXPECT_EQ(one.out.rfind("minimal ", 0), 0u) << one.out;
  EXPECT_THAT(one.out, HasSubstr("\n  parameters\n"));
  EXPECT_THAT(all.out, HasSubstr(one.out)) << "the same lines as in the listing";
  EXPECT_THAT(one.out, Not(HasSubstr("KV stores")));

  CliRun json = sieve_cli("plugins --json minimal --plugin-dir " SIEVE_FIXTURE_DIR, false);
  ASSERT_EQ(json.status, 0) << json.out;
  auto j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["plugins"].size(), 1u);
  EXPECT_EQ(j["plugins"][0]["name"], "minimal");
  EXPECT_EQ(j["plugins"][0]["params"].size(), 6u);
  EXPECT_TRUE(j["stores"].empty());

  json = sieve_cli("plugins engine_pool --json --plugin-dir " SIEVE_FIXTURE_DIR, false);
  ASSERT_EQ(json.status, 0) << json.out;
  j = nlohmann::json::parse(json.out);
  EXPECT_TRUE(j["plugins"].empty());
  ASSERT_EQ(j["stores"].size(), 1u);
  EXPECT_EQ(j["stores"][0]["name"], "engine_pool");
  EXPECT_EQ(j["stores"][0]["params"][0]["name"], "layout");

  json = sieve_cli("plugins store_ok --json --plugin-dir " SIEVE_FIXTURE_DIR "/stores", false);
  ASSERT_EQ(json.status, 0) << json.out;
  j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["plugins"].size(), 1u);
  ASSERT_EQ(j["stores"].size(), 1u);
  EXPECT_EQ(j["plugins"][0]["kv_store"], j["stores"][0]["name"]);
  EXPECT_EQ(j["stores"][0]["source"], j["plugins"][0]["path"]);

  // stderr alone, without the loader's warnings about the broken fixtures in that directory.
  CliRun bad = sieve::testing::run_command("'" SIEVE_BIN_DIR "/sieve' plugins minmal --plugin-dir " SIEVE_FIXTURE_DIR
                                    " 2>&1 >/dev/null | grep -v '^warning: plugin file'");
  EXPECT_THAT(bad.out, HasSubstr("sieve plugins: no plugin or KV store named 'minmal' (did you mean 'minimal'?); found: "));
  EXPECT_EQ(std::count(bad.out.begin(), bad.out.end(), '\n'), 1) << bad.out;
  EXPECT_EQ(sieve_cli("plugins minmal --plugin-dir " SIEVE_FIXTURE_DIR).status, 2);
  CliRun two = sieve_cli("plugins quest raas");
  EXPECT_EQ(two.status, 2);
  EXPECT_EQ(two.out, "sieve plugins: unexpected argument 'raas' (every option takes one word: quote a value with spaces)\n");
}

TEST_F(Cli, PluginsMissingDirectory) {
  CliRun r = sieve_cli("plugins --plugin-dir /nonexistent/plugins");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("sieve plugins: --plugin-dir /nonexistent/plugins does not exist"));
}

TEST_F(Cli, PluginsBadOption) {
  CliRun r = sieve_cli("plugins --bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("sieve plugins: unrecognised option '--bogus'"));
}

TEST_F(Cli, EnvironmentPathIgnoredWhenSetgid) {
  // Needs root (to give a copy of the binary a foreign group) and a filesystem honouring setgid.
  sieve::test::ScratchDir dir;
  struct statvfs fs {};
  if (::geteuid() != 0 || ::statvfs(dir.str().c_str(), &fs) != 0 || (fs.f_flag & ST_NOSUID))
    GTEST_SKIP() << "needs root and a filesystem without nosuid";
  std::string plain = dir.add(std::string(SIEVE_BIN_DIR) + "/sieve", "sieve_plain");
  std::string setgid = dir.add(std::string(SIEVE_BIN_DIR) + "/sieve", "sieve_setgid");
  ASSERT_EQ(::chown(setgid.c_str(), uid_t(-1), gid_t(65534)), 0);
  ASSERT_EQ(::chmod(setgid.c_str(), 02755), 0);
  sieve::test::EnvGuard env("SIEVE_PLUGIN_PATH", "/env/plugins");
  CliRun r = sieve_cli("plugins", true, plain);
  EXPECT_THAT(r.out, HasSubstr("SIEVE_PLUGIN_PATH  /env/plugins"));  // the control
  r = sieve_cli("plugins", true, setgid);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("SIEVE_PLUGIN_PATH ignored: the process runs setuid/setgid"));
  EXPECT_THAT(r.out, Not(HasSubstr("/env/plugins")));
}

// ---- sieve tool: a plugin's ABI 1.1 tools (tests/fixtures/toolbox.c) ------------------------------

#define TOOLBOX "tool --plugin-dir " SIEVE_FIXTURE_DIR "/tools "

TEST_F(Cli, ToolRunsThePluginsToolWithItsArgumentsAndStatus) {
  CliRun r = sieve_cli(TOOLBOX "toolbox echo a 'b c' --flag", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.out, "sieve tool toolbox echo: [a] [b c] [--flag]\n");  // argv[0] names the command
  r = sieve_cli(TOOLBOX "toolbox fail");
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.out, "sieve tool toolbox fail: failing on purpose\n");
}

TEST_F(Cli, ToolListsAndNamesWhatExists) {
  CliRun r = sieve_cli(TOOLBOX "toolbox");
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("echo           prints its arguments\n"));
  EXPECT_THAT(r.out, HasSubstr("fail           exits with status 3\n"));
  r = sieve_cli(TOOLBOX "toolbox nosuch");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "sieve tool toolbox nosuch: plugin 'toolbox' has no tool 'nosuch' (its tools: echo, fail)\n");
  r = sieve_cli(TOOLBOX "nosuch echo");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("no plugin 'nosuch' was found (plugins with tools: "));
  EXPECT_THAT(r.out, HasSubstr("toolbox"));
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  r = sieve_cli(TOOLBOX);
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("sieve tool: name a plugin (plugins with tools: "));
  r = sieve_cli("tool --plugin-dir /nonexistent/plugins toolbox");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "sieve tool: --plugin-dir /nonexistent/plugins does not exist\n");
}

TEST_F(Cli, PluginsListsToolsAndRefusesBadOnes) {
  CliRun r = sieve_cli("plugins --plugin-dir " SIEVE_FIXTURE_DIR "/tools");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("  tool       echo           prints its arguments\n"));
  r = sieve_cli("plugins --json --plugin-dir " SIEVE_FIXTURE_DIR "/tools", false);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  nlohmann::json toolbox;
  for (auto& p : j["plugins"])
    if (p["name"] == "toolbox") toolbox = p;
  ASSERT_EQ(toolbox["tools"].size(), 2u) << r.out;
  EXPECT_EQ(toolbox["tools"][1]["name"], "fail");
  EXPECT_EQ(toolbox["tools"][1]["summary"], "exits with status 3");
  r = sieve_cli("plugins --plugin-dir " SIEVE_FIXTURE_DIR "/tools_bad");
  EXPECT_THAT(r.out, HasSubstr("libsieve_toolbox_bad.so: tool[1] name 'echo' is used twice"));
}

// ---- sieve bench: checks its options, then runs sieve_bench (beside it) under its own name ------

TEST_F(Cli, BenchRunsTheSuiteExecutableUnderItsOwnName) {
  if (!std::filesystem::exists(std::string(SIEVE_BIN_DIR) + "/sieve_bench"))
    GTEST_SKIP() << "built without the benchmarks";
  CliRun r = sieve_cli("bench --policy --help", false);
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, ::testing::StartsWith("usage: sieve bench --policy [options]\n"));
  r = sieve_cli("bench --gpu-only --cpu-only");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "sieve bench: --gpu-only and --cpu-only exclude each other\n");
  r = sieve_cli("bench --bogus");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "sieve bench: unknown argument '--bogus'\n");
  // The suite's own options pass through, and sieve_bench checks their values under this name.
  r = sieve_cli("bench --page-size=0");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "sieve bench: --page-size: '0' is not a page size (1 .. 4096)\n");
  r = sieve_cli("bench --hopper-ctas=-3");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "sieve bench: --hopper-ctas: '-3' is not a count (0 .. 2147483647)\n");
}

TEST_F(Cli, ConformPassesTheMinimalFixture) {
  CliRun r = sieve_cli("conform " + fixture("minimal"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("PASS  negotiate_host_major"));
  EXPECT_THAT(r.out, Not(HasSubstr("FAIL ")));
  EXPECT_THAT(r.out, HasSubstr("PASS: "));
}

TEST_F(Cli, ConformFailsBrokenFixtures) {
  CliRun r = sieve_cli("conform " + fixture("wrong_major"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("FAIL  negotiate_host_major"));
  EXPECT_THAT(r.out, HasSubstr("ABI major 2 (plugin) vs 1 (host)"));
  r = sieve_cli("conform " + fixture("crash_validate"));
  EXPECT_EQ(r.status, 1);  // a clean failure, not the crash's signal
  EXPECT_THAT(r.out, HasSubstr("plugin crashed (Segmentation fault"));
  r = sieve_cli("conform /nonexistent/libsieve_x.so --json", false);
  EXPECT_EQ(r.status, 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["passed"], false);
  EXPECT_EQ(j["checks"][0]["name"], "file");
  EXPECT_EQ(j["checks"][0]["result"], "fail");
  EXPECT_EQ(j["checks"][0]["detail"], "no such file");
}

TEST_F(Cli, ConformUsage) {
  CliRun r = sieve_cli("conform --store");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("--store needs a store name"));
  r = sieve_cli("conform x.so --store paged-cpu");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("do not go together"));
}

// No plugin file: the KV-store suite on every store, the core's among them.
TEST_F(Cli, ConformWithoutAPluginChecksTheStores) {
  CliRun r = sieve_cli("conform");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr(" KV store paged\n"));
  EXPECT_THAT(r.out, HasSubstr("PASS  store_round_trip_cpu"));
}

}  // namespace
