// The plugins a host can use: every file found by discovery, loaded and checked, by name.
//
// Duplicates: when two files carry the same plugin name, the first in search order wins unless a
// later one reports a higher sieve_plugin_score() (how a CUDA build displaces a CPU build of the
// same plugin); the loser is logged at info and listed in shadowed(). A plugin whose score is
// negative is unusable on this machine: it is listed in failures() and never chosen.
//
// Ownership: the registry owns the loaded libraries' handles and drops them in its destructor; the
// code itself stays mapped until the process exits (loader.hpp: plugins are pinned).
// A host destroys its policy instances and synchronises its devices before destroying the
// registry; resolved chains hold their own LoadedPlugin copies, which keep a library mapped.
#pragma once

#include <string>
#include <vector>

#include "sieve/runtime/discovery.hpp"
#include "sieve/runtime/loader.hpp"

namespace sieve::runtime {

struct LoadFailure {
  std::string path;
  std::string reason;  // one line, starting with the file name
};

struct ShadowedPlugin {
  std::string name;
  std::string path;     // the file not used
  std::string used;     // the file that won
  std::string why;      // "earlier in the search path" / "higher score (10 > 0)"
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;
  Registry(Registry&&) = default;
  Registry& operator=(Registry&&) = default;

  // Search every directory of the search path (discovery.hpp) and load what is found there.
  // Missing directories are skipped (missing_dirs() lists the explicit ones).
  static Registry discover(const DiscoveryOptions& options);

  // Load every plugin file of one directory (in name order) / one file. Return false when the
  // directory does not exist / the file failed to load (recorded in failures(), and a warning).
  // A file is loaded into this process only after it loaded cleanly in a probe process
  // (probe.hpp): a file that crashes or hangs the loader is a failure, not the host's end.
  bool add_directory(const std::string& dir);
  bool add_file(const std::string& path);

  // The plugin called `name`, or nullptr.
  const LoadedPlugin* find(const std::string& name) const;
  // Every usable plugin, in search order of the file that provided it.
  const std::vector<LoadedPlugin>& plugins() const { return plugins_; }
  std::vector<std::string> names() const;
  const std::vector<LoadFailure>& failures() const { return failures_; }
  const std::vector<ShadowedPlugin>& shadowed() const { return shadowed_; }
  const std::vector<SearchDir>& search_path() const { return search_path_; }
  // Explicit --plugin-dir entries that do not exist.
  const std::vector<std::string>& missing_dirs() const { return missing_dirs_; }

 private:
  bool add_probed(const std::string& path, std::string probe_error);
  void add_loaded(LoadedPlugin plugin);
  std::vector<LoadedPlugin> plugins_;
  std::vector<LoadFailure> failures_;
  std::vector<ShadowedPlugin> shadowed_;
  std::vector<SearchDir> search_path_;
  std::vector<std::string> missing_dirs_;
};

}  // namespace sieve::runtime
