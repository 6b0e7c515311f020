// A plugin's command-line tools (ABI 1.1, sieve_tool in api/sieve/plugin.h): declared next to the
// policy's descriptor and parameters, in the policy class,
//
//   int calibrate_main(int argc, const char* const* argv);   // tools/calibrate.cpp
//   class Recent final : public sp::PolicyBase {
//     ...
//     static constexpr sieve_tool kTools[] = {
//         sp::tool<calibrate_main>("calibrate", "per-head budgets from a model's prefill")};
//   };
//
// and SIEVE_DEFINE_PLUGIN puts them in the plugin table (`sieve tool recent calibrate ...`). The
// main parses its own arguments (argv[0] names the command: "sieve tool recent calibrate"),
// prints to stdout/stderr and returns the exit status; whatever it throws becomes one line on
// stderr and status 1, since nothing may unwind across the C boundary.
#pragma once
#include <sieve/plugin.h>

#include <cstdio>
#include <exception>

namespace sieve::plugin {

using ToolMain = int (*)(int argc, const char* const* argv);

namespace detail {
template <ToolMain Main>
int32_t guarded_tool(int32_t argc, const char* const* argv) noexcept {
  const char* who = argc > 0 && argv && argv[0] ? argv[0] : "tool";
  try {
    return Main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", who, e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: unexpected non-standard exception\n", who);
  }
  return 1;
}
}  // namespace detail

// One sieve_tool entry: `name` is [a-z0-9_-]+ and unique within the plugin (the loader refuses
// the plugin otherwise), `summary` one line for `sieve plugins` / `sieve tool <plugin>`.
template <ToolMain Main>
constexpr sieve_tool tool(const char* name, const char* summary) {
  return sieve_tool{SIEVE_HEADER_INIT(sieve_tool), name, summary, &detail::guarded_tool<Main>};
}

}  // namespace sieve::plugin
