// What conformance must not be fooled by (issue 17): a content-based selection that reads K with
// the wrong page layout, one that leaves holes between its rows, and one that never leaves the
// dense path each fail a named check with a reason naming the problem, while the same selection
// written correctly passes every check. Fixtures: tests/fixtures/topk_select.c.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "../plugins/support/run_command.hpp"

namespace {

using ::testing::HasSubstr;

nlohmann::json conform_json(const std::string& fixture, const std::string& options = "",
                            const std::string& dir = std::string(SIEVE_FIXTURE_DIR) + "/conform") {
  const std::string path = dir + "/libsieve_" + fixture + ".so";
  const auto r = sieve::testing::run_command(std::string(SIEVE_BIN_DIR) + "/sieve-conform " + path + " --json " +
                                             options + " 2>/dev/null");
  EXPECT_TRUE(r.status == 0 || r.status == 1) << fixture << ": exit " << r.status << "\n" << r.out;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << fixture << ": not JSON (" << e.what() << "):\n" << r.out;
    return {};
  }
}

// The result and detail of check `name` ("missing" when it did not run).
std::pair<std::string, std::string> check(const nlohmann::json& j, const std::string& name) {
  for (const auto& c : j["checks"])
    if (c["name"] == name) return {c["result"], c["detail"]};
  return {"missing", ""};
}

TEST(ConformCatches, TheCorrectSelectionPassesEveryCheck) {
  const nlohmann::json j = conform_json("topk_ok");
  for (const auto& c : j["checks"]) EXPECT_NE(c["result"], "fail") << c["name"] << ": " << c["detail"];
  EXPECT_EQ(j["passed"], true);
  EXPECT_EQ(check(j, "sparse_path_cpu").first, "pass");
  const auto [result, detail] = check(j, "planted_recall_cpu");
  EXPECT_EQ(result, "pass") << detail;
  EXPECT_THAT(detail, HasSubstr("decode 1.00e+00")) << "every planted key is found";
}

TEST(ConformCatches, WrongKLayoutFailsThePlantedProbe) {
  const nlohmann::json j = conform_json("topk_wrong_layout");
  EXPECT_EQ(j["passed"], false);
  // Numerically it is consistent with its own (wrong) selection: only the probe can tell.
  EXPECT_EQ(check(j, "numeric_cpu_decode").first, "pass") << check(j, "numeric_cpu_decode").second;
  const auto [result, detail] = check(j, "planted_recall_cpu");
  EXPECT_EQ(result, "fail");
  EXPECT_THAT(detail, HasSubstr("misses keys aligned with the queries"));
}

TEST(ConformCatches, RowsWithHolesFailTheNumericCheck) {
  const nlohmann::json j = conform_json("topk_row_holes");
  EXPECT_EQ(j["passed"], false);
  const auto [result, detail] = check(j, "numeric_cpu_decode");
  EXPECT_EQ(result, "fail");
  EXPECT_THAT(detail, HasSubstr("hook select: selection row"));
  EXPECT_THAT(detail, HasSubstr("was never written"));
  EXPECT_THAT(detail, HasSubstr("without holes"));
}

TEST(ConformCatches, ASelectionThatNeverLeavesTheDensePathFails) {
  const nlohmann::json j = conform_json("topk_pass_through");
  EXPECT_EQ(j["passed"], false);
  EXPECT_EQ(check(j, "numeric_cpu_decode").first, "pass");
  const auto [result, detail] = check(j, "sparse_path_cpu");
  EXPECT_EQ(result, "fail");
  EXPECT_THAT(detail, HasSubstr("the sparse path was never reached"));
}

// quest declares conform_params token_budget=64 (and passes); a --param replaces that value, and
// a budget beyond every conformance context is caught, not passed as dense.
TEST(ConformCatches, AParamReplacesTheDeclaredConformParams) {
  const nlohmann::json j = conform_json("quest", "--param token_budget=4096", SIEVE_PLUGIN_DIR);
  EXPECT_EQ(j["options"]["params"]["token_budget"], "4096");
  EXPECT_EQ(check(j, "conform_params").first, "pass") << "the declared text itself is fine";
  const auto [result, detail] = check(j, "sparse_path_cpu");
  EXPECT_EQ(result, "fail");
  EXPECT_THAT(detail, HasSubstr("the sparse path was never reached"));
}

}  // namespace
