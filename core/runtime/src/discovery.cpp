// Plugin search path and directory listing.
#include "sieve/runtime/discovery.hpp"

#include <sys/auxv.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#ifndef SIEVE_INSTALL_PLUGIN_DIR
#define SIEVE_INSTALL_PLUGIN_DIR "/usr/local/lib/sieve/plugins"
#endif

namespace sieve::runtime {

namespace fs = std::filesystem;

bool running_secure() { return getauxval(AT_SECURE) != 0; }

std::string exe_relative_plugin_dir() {
  std::error_code ec;
  fs::path exe = boost::dll::program_location(ec);
  if (ec || exe.empty()) return {};
  return (exe.parent_path() / ".." / "lib" / "sieve" / "plugins").lexically_normal().string();
}

std::string library_relative_plugin_dir() {
  std::error_code ec;
  fs::path lib = boost::dll::this_line_location(ec);  // libsieve_runtime.so itself
  if (ec || lib.empty()) return {};
  return (lib.parent_path() / "sieve" / "plugins").lexically_normal().string();
}

std::string install_plugin_dir() { return SIEVE_INSTALL_PLUGIN_DIR; }

std::vector<SearchDir> plugin_search_path(const DiscoveryOptions& options) {
  std::vector<SearchDir> dirs;
  for (const auto& d : options.plugin_dirs) dirs.push_back({d, "--plugin-dir"});
  if (options.use_env && running_secure() && std::getenv("SIEVE_PLUGIN_PATH"))
    spdlog::warn("SIEVE_PLUGIN_PATH ignored: the process runs setuid/setgid");
  if (options.use_env && !running_secure()) {
    if (const char* env = std::getenv("SIEVE_PLUGIN_PATH")) {
      std::string s = env;
      size_t start = 0;
      for (;;) {
        size_t colon = s.find(':', start);
        std::string d = s.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
        if (!d.empty()) dirs.push_back({d, "SIEVE_PLUGIN_PATH"});  // "a::b" has no empty entry
        if (colon == std::string::npos) break;
        start = colon + 1;
      }
    }
  }
  if (options.use_exe_dir) {
    std::string d = exe_relative_plugin_dir();
    if (!d.empty()) dirs.push_back({d, "executable"});
  }
  if (options.use_exe_dir) {  // in a build tree or an install, the same directory as above
    std::string d = library_relative_plugin_dir();
    if (!d.empty()) dirs.push_back({d, "library"});
  }
  if (options.use_install_dir) dirs.push_back({install_plugin_dir(), "install"});

  // Same directory reached twice (e.g. the executable lives in the install prefix): keep the first.
  std::vector<SearchDir> unique;
  std::vector<fs::path> seen;
  for (auto& d : dirs) {
    std::error_code ec;
    fs::path key = fs::weakly_canonical(fs::path(d.path), ec);
    if (ec) key = fs::path(d.path);
    key = key.lexically_normal();
    if (!key.has_filename() && key.has_parent_path()) key = key.parent_path();  // "a/b/" == "a/b"
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) continue;
    seen.push_back(key);
    unique.push_back(std::move(d));
  }
  return unique;
}

std::vector<std::string> plugin_files_in(const std::string& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 12 && name.rfind("libsieve_", 0) == 0 &&
        name.compare(name.size() - 3, 3, ".so") == 0) {
      std::error_code fec;
      if (!it->is_directory(fec)) files.push_back(it->path().string());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace sieve::runtime
