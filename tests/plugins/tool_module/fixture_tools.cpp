// A tool module for test_tool_module.cpp: one tool prints its arguments, one throws.
#include <cstdio>
#include <stdexcept>

#include "sieve/plugin/tool.hpp"

namespace {
int echo_main(int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) std::printf("[%s]", argv[i]);
  std::printf("\n");
  return argc - 1;
}
int throwing_main(int, const char* const*) { throw std::runtime_error("no model named 'x'"); }
}  // namespace

SIEVE_EXPORT_TOOL(fixture_echo, echo_main)
SIEVE_EXPORT_TOOL(fixture_throws, throwing_main)
