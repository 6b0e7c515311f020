// Discovery against hostile files on the plugin path: byte-flipped copies of a real plugin, a
// plugin that crashes inside dlopen, one whose finaliser crashes (inside dlclose, or at the host's
// exit), a table declaring a million parameters. The host process
// (this test, or the `sieve` CLI) must survive every one and name the file it refused.
#include <dlfcn.h>
#include <elf.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sieve/runtime/chain_spec.hpp>
#include <sieve/runtime/probe.hpp>
#include <sieve/runtime/registry.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "../plugins/support/run_command.hpp"
#include "runtime_test_util.hpp"

using namespace sieve::runtime;
using ::testing::HasSubstr;
using ::testing::StartsWith;

namespace {

namespace fs = std::filesystem;

std::string hostile(const std::string& name) {
  return std::string(SIEVE_FIXTURE_DIR) + "/hostile/libsieve_" + name + ".so";
}
std::string real_plugin(const std::string& name) {
  return std::string(SIEVE_PLUGIN_DIR) + "/libsieve_" + name + ".so";
}

// A copy of `image` with 4 bytes XOR-ed with random non-zero values, all in one region picked by
// the seed: the ELF and program headers, the dynamic section, or the section headers (what
// glibc's loader follows before any plugin code runs). Deterministic per seed.
// `flipped`, when given, receives the offsets changed (a copy that takes the host down is named by
// them).
std::vector<char> flip_bytes(std::vector<char> image, unsigned seed,
                             std::vector<uint64_t>* flipped = nullptr) {
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof eh);
  uint64_t begin = 0, end = eh.e_phoff + uint64_t(eh.e_phnum) * sizeof(Elf64_Phdr);
  if (seed % 3 == 1) {
    for (unsigned i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph;
      std::memcpy(&ph, image.data() + eh.e_phoff + i * sizeof ph, sizeof ph);
      if (ph.p_type == PT_DYNAMIC) begin = ph.p_offset, end = ph.p_offset + ph.p_filesz;
    }
  } else if (seed % 3 == 2) {
    begin = eh.e_shoff;
    end = eh.e_shoff + uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr);
  }
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint64_t> at(begin, end - 1);
  std::uniform_int_distribution<int> value(1, 255);
  for (int i = 0; i < 4; ++i) {
    // The value is drawn before the offset, as `image[at(rng)] ^= value(rng)` did (C++17
    // evaluates the right side of ^= first): each seed still makes the same copy.
    const char x = char(value(rng));
    const uint64_t where = at(rng);
    image[where] ^= x;
    if (flipped) flipped->push_back(where);
  }
  return image;
}

constexpr unsigned kSeeds = 30;

TEST(HostileDiscovery, MillionParametersAreRefusedOnTheCount) {
  LoadedPlugin p;
  std::string error;
  EXPECT_FALSE(load_plugin(hostile("many_params"), &p, &error));
  EXPECT_THAT(error, StartsWith("libsieve_many_params.so: "));
  EXPECT_THAT(error, HasSubstr("n_params 1000000 exceeds the limit 256"));
}

TEST(HostileDiscovery, CrashInsideDlopenOrDlcloseIsRefusedByTheProbe) {
  Registry r;
  EXPECT_TRUE(r.add_directory(std::string(SIEVE_FIXTURE_DIR) + "/hostile"));  // and we are alive
  EXPECT_TRUE(r.names().empty());
  ASSERT_EQ(r.failures().size(), 3u);
  for (const auto& f : r.failures()) {
    const std::string file = fs::path(f.path).filename().string();
    if (file == "libsieve_crash_on_load.so")
      EXPECT_THAT(f.reason, HasSubstr("libsieve_crash_on_load.so: loading it crashed a probe "
                                      "process (Segmentation fault, signal 11)"));
    else if (file == "libsieve_crash_on_unload.so")
      EXPECT_THAT(f.reason, HasSubstr("libsieve_crash_on_unload.so: unloading it (its finalisers) "
                                      "crashed a probe process (Segmentation fault, signal 11)"));
    else
      EXPECT_THAT(f.reason, HasSubstr("n_params 1000000 exceeds the limit 256"));
  }
  // Refused, so never mapped here: this process's exit runs no finaliser of it.
  EXPECT_EQ(::dlopen(hostile("crash_on_unload").c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr);
}

TEST(HostileDiscovery, ProbeAnswersAreCachedUntilTheFileChanges) {
  sieve::test::ScratchDir dir;
  const std::string path = dir.add(hostile("crash_on_load"), "libsieve_x.so");
  EXPECT_THAT(probe_plugin_file(path), HasSubstr("crashed a probe process"));
  EXPECT_THAT(probe_plugin_file(path), HasSubstr("crashed a probe process"));
  // Replaced by a good plugin (new inode, size, mtime): probed again, and fine.
  fs::remove(path);
  dir.add(sieve::test::fixture("minimal"), "libsieve_x.so");
  EXPECT_EQ(probe_plugin_file(path), "");
}

TEST(HostileDiscovery, ByteFlippedCopiesOfARealPluginNeverTakeTheHostDown) {
  const std::vector<char> image = sieve::test::read_bytes(real_plugin("dense"));
  ASSERT_GT(image.size(), sizeof(Elf64_Ehdr));
  unsigned refused = 0;
  for (unsigned seed = 0; seed < kSeeds; ++seed) {
    std::vector<uint64_t> flipped;
    const auto bad = flip_bytes(image, seed, &flipped);
    std::string copy = "seed " + std::to_string(seed) + ", bytes flipped at";
    for (uint64_t at : flipped) copy.append(" ").append(std::to_string(at));
    SCOPED_TRACE(copy);
    // Printed before loading too: a copy that crashes the host leaves no assertion message.
    std::printf("[ copy     ] %s\n", copy.c_str());
    std::fflush(stdout);
    sieve::test::ScratchDir dir;
    const std::string path = dir.str() + "/libsieve_flipped.so";
    sieve::test::write_bytes(path, bad);
    Registry r;
    ASSERT_TRUE(r.add_directory(dir.str()));
    if (r.failures().empty()) continue;  // the flips hit bytes the loader does not use
    ++refused;
    EXPECT_THAT(r.failures()[0].reason, StartsWith("libsieve_flipped.so: "));
  }
  EXPECT_GT(refused, kSeeds / 2) << "the flips should break most copies; the test flips nothing?";
}

// The CLI on a directory holding corrupted copies of dense and the hostile fixtures: `sieve
// plugins` lists the real ones (and exits cleanly: no finaliser of a refused file runs in it), a
// chain on dense runs, both warn with the bad files' names.
class HostileCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(std::string(SIEVE_BIN_DIR) + "/sieve"))
      GTEST_SKIP() << "the sieve executable was not built";
    const auto image = sieve::test::read_bytes(real_plugin("dense"));
    for (unsigned seed : {1u, 4u, 7u}) {  // the dynamic section
      const auto bad = flip_bytes(image, seed);
      sieve::test::write_bytes(dir_.str() + "/libsieve_flipped" + std::to_string(seed) + ".so", bad);
    }
    dir_.add(hostile("crash_on_load"), "libsieve_crash_on_load.so");
    dir_.add(hostile("crash_on_unload"), "libsieve_crash_on_unload.so");
    dir_.add(hostile("many_params"), "libsieve_many_params.so");
  }
  sieve::testing::CommandResult sieve(const std::string& args) {
    // The real plugins first: a flipped copy that still loads is shadowed, never used.
    return sieve::testing::run_command(std::string("'") + SIEVE_BIN_DIR + "/sieve' " + args +
                                       " --plugin-dir " SIEVE_PLUGIN_DIR " --plugin-dir " +
                                       dir_.str() + " 2>&1");
  }
  sieve::test::ScratchDir dir_;
  sieve::test::EnvGuard no_env_{"SIEVE_PLUGIN_PATH", std::nullopt};
};

TEST_F(HostileCli, PluginsListsTheGoodAndNamesTheBad) {
  auto r = sieve("plugins");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("dense 1.0.0 (sieve)"));  // the real one, listed
  EXPECT_THAT(r.out, HasSubstr("libsieve_crash_on_load.so: loading it crashed a probe process"));
  EXPECT_THAT(r.out, HasSubstr("libsieve_crash_on_unload.so: unloading it (its finalisers) crashed a "
                               "probe process"));
  EXPECT_THAT(r.out, HasSubstr("n_params 1000000 exceeds the limit 256"));
}

TEST_F(HostileCli, ADenseChainStillRunsAndWarns) {
  auto r = sieve("eval --chain '*=dense' --steps 4");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("warning: plugin file " + dir_.str() + "/libsieve_crash_on_load.so not loaded"));
}

TEST_F(HostileCli, AnUnknownPolicyListsTheFilesThatFailed) {
  auto r = sieve("eval --chain '*=crash_on_load' --steps 4");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("unknown policy 'crash_on_load'"));
  EXPECT_THAT(r.out, HasSubstr("plugin files not loaded: "));
  EXPECT_THAT(r.out, HasSubstr("[libsieve_crash_on_load.so: loading it crashed a probe process"));
}

}  // namespace
