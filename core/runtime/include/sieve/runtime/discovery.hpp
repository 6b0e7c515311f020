// Where plugins are looked for, in order (first match wins, see registry.hpp for duplicates):
//   1. every explicit --plugin-dir, in the order given;
//   2. SIEVE_PLUGIN_PATH, colon-separated (ignored in a setuid/setgid process: AT_SECURE);
//   3. <directory of the executable>/../lib/sieve/plugins (a build tree or an install prefix);
//   4. <directory of libsieve_runtime.so>/sieve/plugins (a host embedding an installed runtime
//      from anywhere: the C host API);
//   5. the install libdir, <CMAKE_INSTALL_FULL_LIBDIR>/sieve/plugins.
// A directory listed twice is searched once, at its first place. Plugin files are named
// libsieve_<anything>.so; other files are ignored. Nothing here needs a GPU.
#pragma once

#include <string>
#include <vector>

namespace sieve::runtime {

struct DiscoveryOptions {
  std::vector<std::string> plugin_dirs;  // explicit directories (--plugin-dir)
  bool use_env = true;                   // SIEVE_PLUGIN_PATH
  bool use_exe_dir = true;               // <exe dir>/../lib/sieve/plugins and
                                         // <runtime library dir>/sieve/plugins (3. and 4.)
  bool use_install_dir = true;           // the install libdir
  // Load each file in a forked probe process first (probe.hpp). Off for hosts where a forked
  // child may not call dlopen: a multithreaded process (Python with torch, CUDA initialised) may
  // fork only to exec, so there the files are loaded directly, trusted.
  bool probe = true;
};

struct SearchDir {
  std::string path;
  std::string source;  // "--plugin-dir", "SIEVE_PLUGIN_PATH", "executable", "library", "install"
};

// The ordered search path. Directories that do not exist are kept (listing says so); duplicates
// (same canonical path) are dropped after their first occurrence.
std::vector<SearchDir> plugin_search_path(const DiscoveryOptions& options);

// The plugin files of one directory, sorted by name ([] if it does not exist or is unreadable).
std::vector<std::string> plugin_files_in(const std::string& dir);

// True when the process runs setuid/setgid (or with other AT_SECURE conditions), where the
// environment must not choose which code is loaded.
bool running_secure();

// The directory discovery derives from the executable: <exe dir>/../lib/sieve/plugins.
std::string exe_relative_plugin_dir();

// The directory discovery derives from the runtime library: <its dir>/sieve/plugins.
std::string library_relative_plugin_dir();

// The compiled-in install directory.
std::string install_plugin_dir();

}  // namespace sieve::runtime
