// sieve calibrate <method> [options]: the `calibrate` tool of the plugin called <method> (ABI 1.1;
// `sieve calibrate dpxa` is `sieve tool dpxa calibrate`). The bundled delta and dpxa ship one; a
// third party's plugin that ships a `calibrate` tool is reached the same way.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.hpp"
#include "plugin_tools.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/util/printable.hpp"

namespace sieve::cli {

int cmd_calibrate(int argc, char** argv) {
  const runtime::Registry registry = runtime::Registry::discover({});
  const std::vector<std::string> methods = plugins_with_tool(registry, "calibrate");
  if (argc < 2) return report_error("sieve calibrate", "name a method: " + joined(methods), 2);
  const std::string method = argv[1];
  if (method == "--help" || method == "-h") {
    std::printf("usage: sieve calibrate <method> [options]   (sieve calibrate <method> --help)\n\n");
    for (const auto& m : methods) std::printf("  %-8s %s\n", m.c_str(), registry.find(m)->tool("calibrate")->summary);
    return 0;
  }
  if (std::find(methods.begin(), methods.end(), method) == methods.end())
    return report_error("sieve calibrate", "unknown method '" + printable(method) + "' (" + joined(methods) + ")", 2);
  return run_plugin_tool(registry, "sieve calibrate " + method, method, "calibrate", argc - 1, argv + 1);
}

}  // namespace sieve::cli
