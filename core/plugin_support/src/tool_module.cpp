// run_tool_module (tool.hpp): a plugin's tool entry that runs a function of its tool module.
#include <dlfcn.h>

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <string>
#include <system_error>

#include "sieve/plugin/tool.hpp"

namespace sieve::plugin {

namespace {
using ToolFn = int32_t(int32_t, const char* const*);
}

int32_t run_tool_module(const char* module, const char* symbol, int32_t argc, const char* const* argv) noexcept {
  const char* who = argc > 0 && argv && argv[0] ? argv[0] : "tool";
  std::string path = module ? module : "";
  try {
    // The plugin file this code was linked into (dladdr of a function of ours).
    std::error_code ec;
    const std::filesystem::path self = boost::dll::symbol_location_ptr(&run_tool_module, ec);
    if (ec || self.empty()) {
      std::fprintf(stderr, "%s: cannot tell which file the plugin was loaded from (%s)\n", who,
                   ec.message().c_str());
      return 1;
    }
    path = (self.parent_path() / module).lexically_normal().string();
    // RTLD_NODELETE: the module's static objects (its libraries' registries, CUDA registrations)
    // outlive this call, as the plugins' do (the loader pins them too).
    const auto mode = static_cast<boost::dll::load_mode::type>(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    boost::dll::shared_library lib(path, mode);
    ToolFn& run = lib.get<ToolFn>(symbol);
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: tool module %s: %s\n", who, path.c_str(), e.what());
  } catch (...) {
    std::fprintf(stderr, "%s: tool module %s: unexpected non-standard exception\n", who, path.c_str());
  }
  return 1;
}

}  // namespace sieve::plugin
