#include "plugin_tools.hpp"

#include <string>
#include <vector>

#include "sieve/cli/error_line.hpp"
#include "sieve/util/printable.hpp"

namespace sieve::cli {

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& s : names) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "none" : out;
}

std::vector<std::string> plugins_with_tool(const runtime::Registry& registry, const std::string& tool) {
  std::vector<std::string> out;
  for (const auto& p : registry.plugins())
    if (tool.empty() ? !p.tools().empty() : p.tool(tool) != nullptr) out.push_back(p.name());
  return out;
}

int run_plugin_tool(const runtime::Registry& registry, const std::string& command, const std::string& plugin,
                    const std::string& tool, int argc, char** argv) {
  const runtime::LoadedPlugin* p = registry.find(plugin);
  if (!p)
    return report_error(command, "no plugin '" + printable(plugin) + "' was found (plugins with tools: " +
                                     joined(plugins_with_tool(registry)) + "; sieve plugins lists them all)", 2);
  const sieve_tool* t = p->tool(tool);
  if (!t) {
    std::vector<std::string> names;
    for (const sieve_tool* x : p->tools()) names.push_back(x->name);
    return report_error(command, "plugin '" + plugin + "' has no tool '" + printable(tool) + "' (its tools: " +
                                     joined(names) + ")", 2);
  }
  std::vector<const char*> args = {command.c_str()};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  return t->run(int32_t(args.size() - 1), args.data());
}

}  // namespace sieve::cli
