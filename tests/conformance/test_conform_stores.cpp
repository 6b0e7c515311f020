// The KV-store suite of `sieve conform` (docs/conformance.md, "KV stores") catches what a broken
// store does: each fixture of tests/fixtures/store.c fails the check that names its breakage,
// with the reason, and exits 1, while the same store written correctly passes every check. Also
// `--store NAME` and the no-argument run over every store.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "../plugins/support/run_command.hpp"

namespace {

using ::testing::HasSubstr;

const std::string kStores = std::string(SIEVE_FIXTURE_DIR) + "/stores";

struct ConformRun {
  int status = -1;
  nlohmann::json j;
};

ConformRun conform(const std::string& args) {
  const auto r = sieve::testing::run_command(std::string(SIEVE_BIN_DIR) + "/sieve-conform " + args + " --json 2>/dev/null");
  ConformRun out;
  out.status = r.status;
  try {
    out.j = nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << args << ": not JSON (" << e.what() << "):\n" << r.out;
  }
  return out;
}
ConformRun fixture(const std::string& name) { return conform(kStores + "/libsieve_store_" + name + ".so"); }

// Result and detail of check `name` ("missing" when absent).
std::pair<std::string, std::string> check(const nlohmann::json& j, const std::string& name) {
  for (const auto& c : j["checks"])
    if (c["name"] == name) return {c["result"], c["detail"]};
  return {"missing", ""};
}

TEST(ConformStores, ACorrectStorePassesEveryCheck) {
  const ConformRun r = fixture("ok");
  EXPECT_EQ(r.status, 0) << r.j.dump(1);
  for (const auto& c : r.j["checks"]) EXPECT_NE(c["result"], "fail") << c["name"] << ": " << c["detail"];
  for (const char* name : {"store_table", "store_create_cpu", "store_page_table_cpu", "store_round_trip_cpu",
                           "store_sidecars_cpu", "store_eviction_cpu", "store_remove_cpu", "store_refusals_cpu",
                           "store_destroy_cpu"})
    EXPECT_EQ(check(r.j, name).first, "pass") << name << ": " << check(r.j, name).second;
  for (const auto& c : r.j["checks"]) {
    if (std::string(c["name"]).rfind("store_", 0) == 0) {
      EXPECT_EQ(c["store"], "store_ok") << c;
    }
  }
}

struct Broken {
  const char* fixture;
  const char* check;   // the check that must fail
  const char* reason;  // a piece of its detail
  friend void PrintTo(const Broken& b, std::ostream* os) { *os << b.fixture; }
};

class ConformBrokenStore : public ::testing::TestWithParam<Broken> {};

TEST_P(ConformBrokenStore, FailsTheCheckNamingItsReason) {
  const Broken b = GetParam();
  const ConformRun r = fixture(b.fixture);
  EXPECT_EQ(r.status, 1) << r.j.dump(1);
  EXPECT_EQ(r.j["passed"], false);
  const auto [result, detail] = check(r.j, b.check);
  EXPECT_EQ(result, "fail") << b.check << ": " << detail;
  EXPECT_THAT(detail, HasSubstr(b.reason));
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, ConformBrokenStore,
    ::testing::Values(
        Broken{"view_bad_id", "store_page_table_cpu", "is outside the pool [0, 32)"},
        Broken{"evict_noop", "store_eviction_cpu", "evicting 2 pages left bytes_in_use at"},
        Broken{"drop_token", "store_round_trip_cpu", "the reference"},
        Broken{"remove_leak", "store_remove_cpu", "removing a sequence of 8 pages left bytes_in_use at"},
        Broken{"append_crash", "store_page_table_cpu", "crashed (Segmentation fault"},
        // refused by the static part, before any store call: the loader's table check
        Broken{"unknown_feature", "kv_store_table", "KV store descriptor: features has unknown bits 0x80"},
        Broken{"validate_lax", "store_validate", "validate accepted head_dim 0"}),
    [](const auto& info) { return std::string(info.param.fixture); });

TEST(ConformStores, ACrashSkipsTheChecksItNeverReached) {
  const ConformRun r = fixture("append_crash");
  EXPECT_EQ(check(r.j, "store_create_cpu").first, "pass");
  EXPECT_EQ(check(r.j, "store_destroy_cpu").first, "skip");
  EXPECT_THAT(check(r.j, "store_destroy_cpu").second, HasSubstr("not run"));
}

TEST(ConformStores, OneStoreByName) {
  const ConformRun r = conform("--store store_ok --plugin-dir " + kStores);
  EXPECT_EQ(r.status, 0) << r.j.dump(1);
  ASSERT_FALSE(r.j["checks"].empty());
  for (const auto& c : r.j["checks"]) EXPECT_EQ(c["store"], "store_ok") << c;
  const auto none = sieve::testing::run_command(std::string(SIEVE_BIN_DIR) + "/sieve-conform --store no_such_store 2>&1");
  EXPECT_EQ(none.status, 2);
  EXPECT_THAT(none.out, HasSubstr("no KV store called 'no_such_store' (known: paged"));
}

// No arguments: the core's stores and every discovered plugin's, each named in its checks; a
// broken one among them fails the run.
TEST(ConformStores, NoArgumentsRunsEveryStore) {
  const ConformRun r = conform("--plugin-dir " + kStores);
  EXPECT_EQ(r.status, 1);  // the broken fixtures are among them
  std::set<std::string> stores;
  for (const auto& c : r.j["checks"])
    if (c.contains("store")) stores.insert(c["store"]);
  EXPECT_TRUE(stores.count("paged")) << r.j.dump(1);
  EXPECT_TRUE(stores.count("store_ok"));
  EXPECT_TRUE(stores.count("store_evict_noop"));
  const ConformRun core = conform("--store paged");
  EXPECT_EQ(core.status, 0) << core.j.dump(1);
}

}  // namespace
