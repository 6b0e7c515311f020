// sp::module_tool (sieve/plugin/tool.hpp): a plugin's tool entry that loads its tool module,
// relative to the file holding the plugin code (here the test executable), and runs the module's
// function; a module or function that cannot be found, or a tool that throws, is one line on
// stderr and status 1. SIEVE_TEST_TOOL_MODULE is fixture_tools.cpp's module relative to bin/.
#include <gtest/gtest.h>

#include <algorithm>
#include <sieve/plugin/tool.hpp>
#include <string>

namespace sp = sieve::plugin;

namespace {

constexpr sieve_tool kEcho = sp::module_tool<SIEVE_TEST_TOOL_MODULE, "fixture_echo">("echo", "prints");
constexpr sieve_tool kThrows = sp::module_tool<SIEVE_TEST_TOOL_MODULE, "fixture_throws">("throws", "fails");
constexpr sieve_tool kNoSymbol = sp::module_tool<SIEVE_TEST_TOOL_MODULE, "fixture_nosuch">("nosuch", "-");
constexpr sieve_tool kNoModule = sp::module_tool<"no/such/tools.so", "fixture_echo">("echo", "-");

size_t lines(const std::string& s) { return size_t(std::count(s.begin(), s.end(), '\n')); }

TEST(ToolModule, TheEntryRunsTheModulesFunctionWithItsArguments) {
  EXPECT_EQ(kEcho.hdr.struct_size, sizeof(sieve_tool));
  const char* argv[] = {"sieve tool x echo", "a", "b c", nullptr};
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(kEcho.run(3, argv), 2);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "[a][b c]\n");
}

TEST(ToolModule, AThrowInTheModuleIsOneLineAndStatus1) {
  const char* argv[] = {"sieve tool x throws", nullptr};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(kThrows.run(1, argv), 1);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "sieve tool x throws: no model named 'x'\n");
}

TEST(ToolModule, AMissingModuleOrFunctionIsOneLineNamingItAndStatus1) {
  const char* argv[] = {"sieve tool x echo", nullptr};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(kNoModule.run(1, argv), 1);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.rfind("sieve tool x echo: tool module ", 0), 0u) << err;
  EXPECT_NE(err.find("no/such/tools.so"), std::string::npos) << err;
  EXPECT_EQ(lines(err), 1u) << err;

  const char* argv2[] = {"sieve tool x nosuch", nullptr};
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(kNoSymbol.run(1, argv2), 1);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.rfind("sieve tool x nosuch: tool module ", 0), 0u) << err;
  EXPECT_NE(err.find("fixture_tools.so"), std::string::npos) << err;
  EXPECT_EQ(lines(err), 1u) << err;
}

}  // namespace
