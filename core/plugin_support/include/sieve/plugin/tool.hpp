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
//
// A tool that needs more than a policy does (a model host, option parsing: the in-tree tools link
// libsieve_cli, which links libsieve_runtime) lives in a tool module of its own, so that loading
// the policy never drags those libraries into a host's process (inside a torch process they
// crashed sieve_session_create). The plugin lists the tool as usual; its entry only loads the
// module and calls it:
//
//   // plugin:      sp::module_tool<"../tools/libsieve_recent_tools.so", "sieve_recent_calibrate">(
//   //                  "calibrate", "per-head budgets from a model's prefill")
//   // tool module: SIEVE_EXPORT_TOOL(sieve_recent_calibrate, calibrate_main)
#pragma once
#include <sieve/plugin.h>

#include <cstddef>
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

// A string literal as a template argument (module_tool's module path and symbol).
template <size_t N>
struct Literal {
  char text[N];
  constexpr Literal(const char (&s)[N]) {  // NOLINT: implicit, so "..." converts
    for (size_t i = 0; i < N; ++i) text[i] = s[i];
  }
};

// Loads the tool module `module` (a path relative to the directory of the plugin file holding this
// code; it stays loaded for the life of the process) and returns what its C function `symbol`
// returns for argc/argv. A module or symbol that cannot be found is one line on stderr, naming
// the command, the file and the loader's reason, and status 1. (tool_module.cpp)
int32_t run_tool_module(const char* module, const char* symbol, int32_t argc, const char* const* argv) noexcept;

namespace detail {
template <Literal Module, Literal Symbol>
int32_t module_tool_entry(int32_t argc, const char* const* argv) noexcept {
  return run_tool_module(Module.text, Symbol.text, argc, argv);
}
}  // namespace detail

// One sieve_tool entry whose code is the C function `Symbol` of the tool module `Module`.
template <Literal Module, Literal Symbol>
constexpr sieve_tool module_tool(const char* name, const char* summary) {
  return sieve_tool{SIEVE_HEADER_INIT(sieve_tool), name, summary, &detail::module_tool_entry<Module, Symbol>};
}

}  // namespace sieve::plugin

// In a tool module: exports `main_fn` (a ToolMain) as the C function `symbol`, exceptions caught as
// by tool(). The module is built with hidden visibility; this is its only kind of export.
#define SIEVE_EXPORT_TOOL(symbol, main_fn)                                                     \
  extern "C" __attribute__((visibility("default"))) int32_t symbol(int32_t argc,               \
                                                                   const char* const* argv) noexcept { \
    return ::sieve::plugin::detail::guarded_tool<main_fn>(argc, argv);                         \
  }
