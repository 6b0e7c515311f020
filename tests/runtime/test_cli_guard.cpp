// The CLI's last line of defence (core/cli: sieve/cli/error_line.hpp): whatever a command lets escape ends
// as one escaped stderr line and status 1, never std::terminate's abort; and the one-line form of
// a multi-line message.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <new>
#include <stdexcept>

#include "sieve/cli/error_line.hpp"

using ::testing::internal::CaptureStderr;
using ::testing::internal::GetCapturedStderr;

namespace {

int throws_bad_alloc(int, char**) { throw std::bad_alloc(); }
int throws_runtime_error(int, char**) { throw std::runtime_error("first\nsecond \x1b[31mred"); }
int throws_int(int, char**) { throw 42; }
int returns_three(int, char**) { return 3; }

int guarded(int (*run)(int, char**), std::string* err) {
  CaptureStderr();
  const int status = sieve::cli::run_guarded("sieve test", run, 0, nullptr);
  *err = GetCapturedStderr();
  return status;
}

TEST(CliGuard, EscapingExceptionsBecomeOneLineAndStatusOne) {
  std::string err;
  EXPECT_EQ(guarded(throws_bad_alloc, &err), 1);
  EXPECT_EQ(err, "sieve test: std::bad_alloc\n");
  EXPECT_EQ(guarded(throws_runtime_error, &err), 1);
  EXPECT_EQ(err, "sieve test: first; second \\x1B[31mred\n");
  EXPECT_EQ(guarded(throws_int, &err), 1);
  EXPECT_EQ(err, "sieve test: unexpected non-standard exception\n");
  EXPECT_EQ(guarded(returns_three, &err), 3);
  EXPECT_EQ(err, "");
}

TEST(CliGuard, OneLine) {
  EXPECT_EQ(sieve::cli::one_line("a\nb\n"), "a; b");
  EXPECT_EQ(sieve::cli::one_line("tab\there \xce\x94 \xff"), "tab\\there \xce\x94 \\xFF");
  EXPECT_EQ(sieve::cli::one_line(""), "");
}

}  // namespace
