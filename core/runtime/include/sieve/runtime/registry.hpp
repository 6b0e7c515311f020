// The plugins a host can use: every file found by discovery, loaded and checked, by name.
//
// Duplicates: when two files carry the same plugin name, the first in search order wins unless a
// later one reports a higher sieve_plugin_score() (how a CUDA build displaces a CPU build of the
// same plugin); the loser is logged at info and listed in shadowed(). A plugin whose score is
// negative is unusable on this machine: it is listed in failures() and never chosen.
//
// KV stores are found the same way: the core's built-in stores (registered first, in every
// registry) and every plugin's kv_store table, by the name their descriptor gives (a 1.0 store
// without a descriptor: its plugin's name, with a descriptor derived from its table).
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
#include "sieve/runtime/params.hpp"

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

// One KV store a host can choose (`--kv-store NAME(...)`, a chain's kv_store line).
struct StoreEntry {
  std::string name;
  sieve_kv_store_descriptor descriptor{};  // the store's own, or derived (declared == false)
  bool declared = false;
  const sieve_kv_store_api* api = nullptr;
  std::string source;   // "built-in" or the plugin file
  LoadedPlugin plugin;  // the plugin that ships it (keeps its library loaded); empty: built-in
  bool builtin() const { return plugin.table == nullptr; }
  ParamSchema params() const;  // the store's parameter schema (empty for a 1.0 store)
};

// The entry of one store table: its 1.1 descriptor when it has one, else one derived from the
// table (features SIDECARS / EVICTION from non-NULL register_sidecar+sidecar / evict, HND, no
// pre-RoPE keys, devices and dtypes undeclared: 0). `fallback_name` names a 1.0 store.
StoreEntry describe_store(const sieve_kv_store_api* api, const std::string& fallback_name, std::string source);

class Registry {
 public:
  Registry();  // the built-in stores only
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
  // (probe.hpp): a file that crashes or hangs the loader is a failure, not the host's end;
  // unless discovery was told not to probe (DiscoveryOptions::probe).
  bool add_directory(const std::string& dir);
  bool add_file(const std::string& path);

  // The plugin called `name`, or nullptr.
  const LoadedPlugin* find(const std::string& name) const;
  // Every usable plugin, in search order of the file that provided it.
  const std::vector<LoadedPlugin>& plugins() const { return plugins_; }
  std::vector<std::string> names() const;
  const std::vector<LoadFailure>& failures() const { return failures_; }
  const std::vector<ShadowedPlugin>& shadowed() const { return shadowed_; }
  // Every usable KV store: the built-in ones, then the plugins' in plugin order. A store whose
  // name is taken is left out (listed in shadowed()).
  const std::vector<StoreEntry>& stores() const { return stores_; }
  // The store called `name`, or nullptr.
  const StoreEntry* find_store(const std::string& name) const;
  // Registers another store of the core (source "built-in"), ahead of every plugin's store.
  // False (and a failure line) when its table is not a usable store or its name is taken.
  bool add_builtin_store(const sieve_kv_store_api* api);
  const std::vector<SearchDir>& search_path() const { return search_path_; }
  // Explicit --plugin-dir entries that do not exist.
  const std::vector<std::string>& missing_dirs() const { return missing_dirs_; }

 private:
  bool add_probed(const std::string& path, std::string probe_error);
  void add_loaded(LoadedPlugin plugin);
  void collect_stores();  // stores_ = builtin_stores_ + the plugins' stores
  // What a file's probe says ("" = load it); every file loads unprobed when probing is off.
  std::vector<std::string> probe(const std::vector<std::string>& files) const;
  bool probe_ = true;  // DiscoveryOptions::probe
  std::vector<LoadedPlugin> plugins_;
  std::vector<StoreEntry> builtin_stores_, stores_;
  std::vector<LoadFailure> failures_;
  std::vector<ShadowedPlugin> shadowed_;
  std::vector<SearchDir> search_path_;
  std::vector<std::string> missing_dirs_;
};

}  // namespace sieve::runtime
