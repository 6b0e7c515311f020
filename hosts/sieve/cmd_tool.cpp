// sieve tool [--plugin-dir D]... <plugin> [<tool> [ARGS...]]: run a tool a plugin ships (ABI 1.1),
// or list the plugin's tools. The options before the plugin name are the CLI's; everything after
// the tool name is the tool's own (`sieve tool dpxa calibrate --help`). Also the CLI's older names
// for two bundled tools: sieve distill-gate and sieve delta-diag (sieve calibrate: cmd_calibrate.cpp).
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "commands.hpp"
#include "plugin_tools.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/util/printable.hpp"

namespace sieve::cli {

namespace {
void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: sieve tool [--plugin-dir D]... <plugin> [<tool> [args...]]\n\n"
               "Run a tool a plugin ships (calibration, gate distillation, diagnostics) in this process;\n"
               "with no tool, list the plugin's tools. `sieve plugins` lists every plugin's tools;\n"
               "`sieve tool <plugin> <tool> --help` prints the tool's own options.\n");
}
}  // namespace

int cmd_tool(int argc, char** argv) {
  const char* cmd = "sieve tool";
  runtime::DiscoveryOptions options;
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      return 0;
    }
    if (a == "--plugin-dir") {
      if (i + 1 == argc) return report_error(cmd, "--plugin-dir needs a directory", 2);
      options.plugin_dirs.push_back(argv[++i]);
      continue;
    }
    if (a.rfind("--plugin-dir=", 0) == 0) {
      options.plugin_dirs.push_back(a.substr(std::strlen("--plugin-dir=")));
      continue;
    }
    if (a.rfind("-", 0) == 0) return report_error(cmd, "unknown option '" + printable(a) + "' before the plugin name", 2);
    break;
  }
  runtime::Registry registry = runtime::Registry::discover(options);
  if (!registry.missing_dirs().empty())
    return report_error(cmd, "--plugin-dir " + printable(registry.missing_dirs().front()) + " does not exist", 2);
  if (i == argc) return report_error(cmd, "name a plugin (plugins with tools: " + joined(plugins_with_tool(registry)) + ")", 2);
  const std::string plugin = argv[i];
  if (i + 1 == argc) {  // list the plugin's tools
    const runtime::LoadedPlugin* p = registry.find(plugin);
    if (!p) return run_plugin_tool(registry, cmd, plugin, "", 0, nullptr);  // the same "no plugin" line
    if (p->tools().empty()) std::printf("%s ships no tools\n", p->name());
    for (const sieve_tool* t : p->tools()) std::printf("  %-14s %s\n", t->name, t->summary);
    return 0;
  }
  const std::string tool = argv[i + 1];
  return run_plugin_tool(registry, "sieve tool " + plugin + " " + tool, plugin, tool, argc - (i + 1), argv + i + 1);
}

int cmd_distill_gate(int argc, char** argv) {
  return run_plugin_tool(runtime::Registry::discover({}), "sieve distill-gate", "seer", "distill-gate", argc, argv);
}

int cmd_delta_diag(int argc, char** argv) {
  return run_plugin_tool(runtime::Registry::discover({}), "sieve delta-diag", "delta_correction", "diag", argc, argv);
}

}  // namespace sieve::cli
