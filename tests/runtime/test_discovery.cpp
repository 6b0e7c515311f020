// Discovery and the registry: search order, SIEVE_PLUGIN_PATH, duplicate names and scores,
// broken files listed next to the good ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <sieve/runtime/discovery.hpp>
#include <sieve/runtime/registry.hpp>

#include "runtime_test_util.hpp"

using namespace sieve::runtime;
using sieve::test::EnvGuard;
using sieve::test::fixture;
using sieve::test::fixture_variant;
using sieve::test::ScratchDir;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

namespace {

std::vector<std::string> sources(const std::vector<SearchDir>& dirs) {
  std::vector<std::string> out;
  for (auto& d : dirs) out.push_back(d.source + " " + d.path);
  return out;
}

TEST(Discovery, SearchOrder) {
  EnvGuard env("SIEVE_PLUGIN_PATH", "/env/a::/env/b");
  DiscoveryOptions o;
  o.plugin_dirs = {"/cli/x", "/cli/y"};
  auto dirs = plugin_search_path(o);
  ASSERT_EQ(dirs.size(), 6u);
  EXPECT_THAT(sources(dirs),
              ::testing::ElementsAre("--plugin-dir /cli/x", "--plugin-dir /cli/y",
                                     "SIEVE_PLUGIN_PATH /env/a", "SIEVE_PLUGIN_PATH /env/b",
                                     "executable " + exe_relative_plugin_dir(),
                                     "install " + install_plugin_dir()));
}

TEST(Discovery, ExecutableRelativeDirectory) {
  // Test binaries sit in <build>/bin, so <exe>/../lib/sieve/plugins is the build's plugin dir.
  EXPECT_EQ(fs::weakly_canonical(exe_relative_plugin_dir()), fs::weakly_canonical(SIEVE_PLUGIN_DIR));
  EXPECT_THAT(install_plugin_dir(), ::testing::EndsWith("/sieve/plugins"));
}

TEST(Discovery, SourcesCanBeTurnedOffAndDuplicatesCollapse) {
  EnvGuard env("SIEVE_PLUGIN_PATH", "/env/a");
  DiscoveryOptions o;
  o.plugin_dirs = {"/cli/x", "/cli/x/", "/cli/y/../x"};
  o.use_env = false;
  o.use_exe_dir = false;
  o.use_install_dir = false;
  EXPECT_THAT(sources(plugin_search_path(o)), ::testing::ElementsAre("--plugin-dir /cli/x"));
}

TEST(Discovery, NoEnvironmentVariable) {
  EnvGuard env("SIEVE_PLUGIN_PATH", std::nullopt);
  DiscoveryOptions o;
  o.use_exe_dir = o.use_install_dir = false;
  EXPECT_TRUE(plugin_search_path(o).empty());
  EXPECT_FALSE(running_secure());  // the tests do not run setuid
}

TEST(Discovery, PluginFilesInADirectory) {
  ScratchDir dir;
  dir.add(fixture("minimal"), "libsieve_b.so");
  dir.add(fixture("minimal"), "libsieve_a.so");
  dir.add(fixture("minimal"), "libsieve_.so");        // no name
  dir.add(fixture("minimal"), "libsieve_c.so.1");     // versioned name: not a plugin file
  dir.add(fixture("minimal"), "libother.so");
  fs::create_directory(dir.str() + "/libsieve_dir.so");
  auto files = plugin_files_in(dir.str());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(fs::path(files[0]).filename(), "libsieve_a.so");
  EXPECT_EQ(fs::path(files[1]).filename(), "libsieve_b.so");
  EXPECT_TRUE(plugin_files_in(dir.str() + "/missing").empty());
}

TEST(Registry, FixtureDirectoryListsGoodAndBroken) {
  Registry r;
  ASSERT_TRUE(r.add_directory(SIEVE_FIXTURE_DIR));
  EXPECT_THAT(r.names(), ::testing::UnorderedElementsAre("bad_page_id", "crash_validate",
                                                         "minimal", "returns_error", "writes_nan"));
  std::map<std::string, std::string> failed;
  for (const auto& f : r.failures()) failed[fs::path(f.path).filename().string()] = f.reason;
  ASSERT_EQ(failed.size(), 6u);
  EXPECT_THAT(failed["libsieve_wrong_major.so"], HasSubstr("ABI major 2 (plugin) vs 1 (host)"));
  EXPECT_THAT(failed["libsieve_no_entry.so"], HasSubstr("no symbol 'sieve_plugin_entry'"));
  EXPECT_THAT(failed["libsieve_not_elf.so"], HasSubstr("not an ELF shared library"));
  EXPECT_THAT(failed["libsieve_truncated.so"], HasSubstr("truncated ELF file"));
  EXPECT_THAT(failed["libsieve_bad_descriptor.so"], HasSubstr("descriptor struct_size 8"));
  EXPECT_THAT(failed["libsieve_bad_schema.so"], HasSubstr("default top_k=99 is out of range"));
  ASSERT_NE(r.find("minimal"), nullptr);
  EXPECT_EQ(r.find("quest"), nullptr);
  EXPECT_FALSE(r.add_directory("/nonexistent/dir"));
}

Registry discover_only(std::vector<std::string> dirs) {
  DiscoveryOptions o;
  o.plugin_dirs = std::move(dirs);
  o.use_exe_dir = o.use_install_dir = false;
  return Registry::discover(o);
}

TEST(Registry, FirstInSearchOrderWinsAtEqualScore) {
  EnvGuard env("SIEVE_PLUGIN_PATH", std::nullopt);
  ScratchDir a, b;
  std::string first = a.add(fixture("minimal"), "libsieve_minimal.so");
  std::string second = b.add(fixture("minimal"), "libsieve_minimal.so");
  Registry r = discover_only({a.str(), b.str()});
  ASSERT_EQ(r.plugins().size(), 1u);
  EXPECT_EQ(r.find("minimal")->path, first);
  ASSERT_EQ(r.shadowed().size(), 1u);
  EXPECT_EQ(r.shadowed()[0].path, second);
  EXPECT_EQ(r.shadowed()[0].used, first);
  EXPECT_EQ(r.shadowed()[0].why, "earlier in the search path");
}

TEST(Registry, HigherScoreWinsOverEarlier) {
  EnvGuard env("SIEVE_PLUGIN_PATH", std::nullopt);
  ScratchDir a, b;
  std::string cpu = a.add(fixture("minimal"), "libsieve_minimal.so");
  std::string cuda = b.add(fixture_variant("minimal_cuda"), "libsieve_minimal_cuda.so");
  {
    Registry r = discover_only({a.str(), b.str()});
    ASSERT_EQ(r.plugins().size(), 1u);
    EXPECT_EQ(r.find("minimal")->path, cuda);
    EXPECT_EQ(r.find("minimal")->score, 10);
    ASSERT_EQ(r.shadowed().size(), 1u);
    EXPECT_EQ(r.shadowed()[0].path, cpu);
    EXPECT_EQ(r.shadowed()[0].why, "higher score (10 > 0)");
  }
  {  // The other order: the earlier one already has the higher score.
    Registry r = discover_only({b.str(), a.str()});
    EXPECT_EQ(r.find("minimal")->path, cuda);
    EXPECT_EQ(r.shadowed()[0].why, "earlier in the search path");
  }
}

TEST(Registry, EnvironmentPathComesAfterExplicitDirs) {
  ScratchDir a, b;
  std::string explicit_copy = a.add(fixture("minimal"), "libsieve_minimal.so");
  b.add(fixture("minimal"), "libsieve_minimal.so");
  b.add(fixture("returns_error"), "libsieve_returns_error.so");
  EnvGuard env("SIEVE_PLUGIN_PATH", b.str());
  Registry r = discover_only({a.str()});
  EXPECT_THAT(r.names(), ::testing::ElementsAre("minimal", "returns_error"));
  EXPECT_EQ(r.find("minimal")->path, explicit_copy);
  ASSERT_EQ(r.search_path().size(), 2u);
  EXPECT_EQ(r.search_path()[1].source, "SIEVE_PLUGIN_PATH");
}

TEST(Registry, NegativeScoreIsUnusable) {
  Registry r;
  EXPECT_FALSE(r.add_file(fixture_variant("unusable")));
  EXPECT_EQ(r.find("unusable"), nullptr);
  ASSERT_EQ(r.failures().size(), 1u);
  EXPECT_EQ(r.failures()[0].reason,
            "libsieve_unusable.so: plugin 'unusable' reports score -1: unusable on this machine");
}

TEST(Registry, MissingExplicitDirectoryIsReported) {
  EnvGuard env("SIEVE_PLUGIN_PATH", "/nonexistent/env");
  Registry r = discover_only({"/nonexistent/cli"});
  EXPECT_TRUE(r.plugins().empty());
  // Only explicit directories count as missing; a stale SIEVE_PLUGIN_PATH entry is not an error.
  EXPECT_THAT(r.missing_dirs(), ::testing::ElementsAre("/nonexistent/cli"));
}

}  // namespace
