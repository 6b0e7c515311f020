// Static conformance: the minimal fixture passes every check; each broken fixture fails the check
// that names its fault (and a crashing plugin fails a check instead of killing the run).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sieve/runtime/conformance.hpp>

#include "runtime_test_util.hpp"

using namespace sieve::runtime;
using sieve::test::fixture;
using ::testing::HasSubstr;

namespace {

const char* const kStaticChecks[] = {
    "file", "entry_symbol", "score", "negotiate_host_major", "negotiate_newer_host",
    "negotiate_major_0", "plugin_table", "policy_table", "descriptor", "schema",
    "kv_store_table", "validate_accepts_declared", "validate_rejects_head_dim_0",
    "validate_rejects_gqa_mismatch", "validate_rejects_page_size_0",
    "validate_rejects_unlisted_head_dim", "validate_rejects_unlisted_page_size",
    "validate_rejects_unsupported_dtype", "validate_rejects_unsupported_device",
    "create_rejects_missing_values", "create_rejects_head_dim_0"};

std::string dump(const ConformReport& r) {
  std::string out;
  for (const auto& c : r.checks)
    out += std::string(c.skipped ? "SKIP " : c.passed ? "PASS " : "FAIL ") + c.name + ": " +
           c.detail + "\n";
  return out;
}

// Every static check appears exactly once, whatever happened.
void expect_complete(const ConformReport& r) {
  for (const char* name : kStaticChecks) {
    int n = 0;
    for (const auto& c : r.checks) n += c.name == name;
    EXPECT_EQ(n, 1) << name << "\n" << dump(r);
  }
}

const ConformCheck& check(const ConformReport& r, const std::string& name) {
  const ConformCheck* c = r.find(name);
  if (!c) {
    ADD_FAILURE() << "no check " << name << "\n" << dump(r);
    static ConformCheck none;
    return none;
  }
  return *c;
}

void expect_fail(const ConformReport& r, const std::string& name, const std::string& detail) {
  const auto& c = check(r, name);
  EXPECT_FALSE(c.passed) << name << "\n" << dump(r);
  EXPECT_FALSE(c.skipped) << name << "\n" << dump(r);
  EXPECT_THAT(c.detail, HasSubstr(detail)) << dump(r);
}

TEST(ConformStatic, MinimalPassesEveryCheck) {
  for (bool isolate : {true, false}) {
    ConformOptions o;
    o.isolate = isolate;
    ConformReport r = conform_static(fixture("minimal"), o);
    expect_complete(r);
    EXPECT_TRUE(r.passed()) << dump(r);
    EXPECT_TRUE(static_gate_passed(r));
    EXPECT_EQ(r.plugin_path, fixture("minimal"));
    // Checks that apply to minimal ran (not skipped) — it declares lists and a single device.
    for (const char* name : {"negotiate_newer_host", "negotiate_major_0", "schema",
                             "validate_rejects_unlisted_head_dim", "validate_rejects_unsupported_dtype",
                             "validate_rejects_unsupported_device", "create_rejects_missing_values"})
      EXPECT_TRUE(check(r, name).passed) << name << "\n" << dump(r);
    EXPECT_TRUE(check(r, "score").skipped);
    EXPECT_TRUE(check(r, "kv_store_table").skipped);
    EXPECT_THAT(check(r, "validate_rejects_unsupported_dtype").detail, HasSubstr("bf16"));
    EXPECT_THAT(check(r, "create_rejects_missing_values").detail,
                HasSubstr("minimal: expected 6 parameter values, got 0"));
  }
}

TEST(ConformStatic, ScoreIsCalled) {
  ConformReport r = conform_static(sieve::test::fixture_variant("minimal_cuda"));
  EXPECT_TRUE(r.passed()) << dump(r);
  EXPECT_EQ(check(r, "score").detail, "score 10");
}

TEST(ConformStatic, WrongMajor) {
  ConformReport r = conform_static(fixture("wrong_major"));
  expect_complete(r);
  EXPECT_FALSE(r.passed());
  expect_fail(r, "negotiate_host_major", "ABI major 2 (plugin) vs 1 (host)");
  // Offered 2 it serves; offered 0 it refuses: its negotiation itself follows the rules.
  EXPECT_TRUE(check(r, "negotiate_newer_host").passed) << dump(r);
  EXPECT_TRUE(check(r, "negotiate_major_0").passed) << dump(r);
  EXPECT_TRUE(check(r, "plugin_table").skipped);
  EXPECT_FALSE(static_gate_passed(r));
}

TEST(ConformStatic, NoEntrySymbol) {
  ConformReport r = conform_static(fixture("no_entry"));
  expect_complete(r);
  EXPECT_TRUE(check(r, "file").passed);
  expect_fail(r, "entry_symbol", "no symbol 'sieve_plugin_entry'");
  EXPECT_TRUE(check(r, "negotiate_host_major").skipped);
}

TEST(ConformStatic, NotElfAndTruncated) {
  ConformReport r = conform_static(fixture("not_elf"));
  expect_complete(r);
  expect_fail(r, "file", "not an ELF shared library");
  EXPECT_TRUE(check(r, "entry_symbol").skipped);
  r = conform_static(fixture("truncated"));
  expect_fail(r, "file", "truncated ELF file");
  r = conform_static("/nonexistent/libsieve_x.so");
  expect_fail(r, "file", "no such file");
  EXPECT_FALSE(r.passed());
}

TEST(ConformStatic, BadDescriptor) {
  ConformReport r = conform_static(fixture("bad_descriptor"));
  expect_complete(r);
  EXPECT_TRUE(check(r, "negotiate_host_major").passed);
  EXPECT_TRUE(check(r, "policy_table").passed) << dump(r);
  expect_fail(r, "descriptor", "struct_size 8 is smaller than the v1.0 size");
  EXPECT_TRUE(check(r, "validate_accepts_declared").skipped);
  EXPECT_FALSE(static_gate_passed(r));
}

TEST(ConformStatic, BadSchema) {
  ConformReport r = conform_static(fixture("bad_schema"));
  expect_complete(r);
  EXPECT_TRUE(check(r, "descriptor").passed) << dump(r);
  expect_fail(r, "schema", "parameter 'top_k': default top_k=99 is out of range [1, 10]");
  EXPECT_FALSE(static_gate_passed(r));
}

TEST(ConformStatic, CrashIsAFailedCheckNotACrash) {
  ConformReport r = conform_static(fixture("crash_validate"));
  expect_complete(r);
  EXPECT_TRUE(check(r, "validate_accepts_declared").passed) << dump(r);
  expect_fail(r, "validate_rejects_head_dim_0", "plugin crashed (Segmentation fault, signal 11)");
  EXPECT_FALSE(r.passed());
  // The run stopped at the crash: the checks after it are listed as not run, never as passing.
  const auto& after = check(r, "create_rejects_head_dim_0");
  EXPECT_TRUE(after.skipped);
  EXPECT_EQ(after.detail, "not run: the plugin crashed in validate_rejects_head_dim_0");
}

TEST(ConformStatic, RuntimeFaultsAreInvisibleToTheStaticPart) {
  // These fixtures are well-formed; their faults (error status, NaN, bad page id) show only
  // when hooks run, which is the numeric part's job.
  for (const char* f : {"returns_error", "writes_nan", "bad_page_id"}) {
    ConformReport r = conform_static(fixture(f));
    expect_complete(r);
    EXPECT_TRUE(r.passed()) << f << "\n" << dump(r);
  }
}

TEST(Conform, NumericIsSkippedWhenTheStaticGateFails) {
  ConformReport r = conform(fixture("bad_schema"));
  const ConformCheck& n = check(r, "numeric");
  EXPECT_TRUE(n.skipped);
  EXPECT_THAT(n.detail, HasSubstr("static checks it relies on failed"));
  EXPECT_FALSE(r.passed());
}

TEST(ConformReportTest, PassedNeedsAtLeastOneCheckAndNoFailure) {
  ConformReport r;
  EXPECT_FALSE(r.passed());
  r.skip("a", "n/a");
  r.pass("b");
  EXPECT_TRUE(r.passed());
  r.fail("c", "bad");
  EXPECT_FALSE(r.passed());
  EXPECT_EQ(r.find("c")->detail, "bad");
}

}  // namespace
