// Running the tools plugins ship (ABI 1.1 sieve_tool): `sieve tool <plugin> <name> ARGS...` and
// the CLI's own names for the bundled ones (`sieve calibrate dpxa` is `sieve tool dpxa
// calibrate`). A tool runs in this process, from the plugin discovery found; the CLI links no
// method code of its own.
#pragma once
#include <string>
#include <vector>

#include "sieve/runtime/registry.hpp"

namespace sieve::cli {

// The plugins (in search order) that ship a tool called `tool`; every plugin with a tool when
// `tool` is empty.
std::vector<std::string> plugins_with_tool(const runtime::Registry& registry, const std::string& tool = "");

// "a, b, c", or "none".
std::string joined(const std::vector<std::string>& names);

// Runs `tool` of `plugin` with argv[0] = `command` (so its messages name the command the user
// typed) and args[1..argc). Unknown plugin or tool: one line on stderr naming what exists, 2.
int run_plugin_tool(const runtime::Registry& registry, const std::string& command, const std::string& plugin,
                    const std::string& tool, int argc, char** argv);

}  // namespace sieve::cli
