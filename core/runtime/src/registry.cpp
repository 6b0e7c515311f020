// Registry: load what discovery finds, resolve duplicate names, keep the failures.
#include "sieve/runtime/registry.hpp"
#include "sieve/runtime/probe.hpp"

#include "sieve/kv/engine_pool.hpp"
#include "sieve/kv/paged_store.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <system_error>

namespace sieve::runtime {

namespace fs = std::filesystem;

ParamSchema StoreEntry::params() const {
  if (!api || !SIEVE_HAS_FIELD(api, sieve_kv_store_api, n_params)) return {};
  return ParamSchema(api->params, api->n_params);
}

StoreEntry describe_store(const sieve_kv_store_api* api, const std::string& fallback_name, std::string source) {
  StoreEntry e;
  e.api = api;
  e.source = std::move(source);
  const sieve_kv_store_descriptor* d =
      SIEVE_HAS_FIELD(api, sieve_kv_store_api, descriptor) ? api->descriptor : nullptr;
  if (d && SIEVE_HAS_FIELD(d, sieve_kv_store_descriptor, features) && d->name) {
    e.descriptor = *d;
    e.declared = true;
    e.name = d->name;
    return e;
  }
  // A 1.0 store: what its table shows.
  e.name = fallback_name;
  e.descriptor.hdr = SIEVE_HEADER_INIT(sieve_kv_store_descriptor);
  e.descriptor.name = api->name;
  e.descriptor.layouts = SIEVE_KV_LAYOUT_HND;
  if (api->register_sidecar && api->sidecar) e.descriptor.features |= SIEVE_KV_FEATURE_SIDECARS;
  if (api->evict) e.descriptor.features |= SIEVE_KV_FEATURE_EVICTION;
  return e;
}

Registry::Registry() {
  // The core's stores, registered like any plugin's kv_store table.
  add_builtin_store(kv::paged_store_api());
  add_builtin_store(kv::engine_pool_store_api());
}

bool Registry::add_builtin_store(const sieve_kv_store_api* api) {
  std::vector<std::string> problems = api ? check_kv_store_api(api) : std::vector<std::string>{"no table"};
  StoreEntry e;
  if (problems.empty()) {
    e = describe_store(api, api->name ? api->name : "", "built-in");
    if (std::string p = identifier_problem(e.name.c_str()); !p.empty()) problems.push_back("name " + p);
    if (find_store(e.name)) problems.push_back("the name '" + e.name + "' is taken");
  }
  if (!problems.empty()) {
    failures_.push_back({"built-in", "built-in KV store: " + problems.front()});
    return false;
  }
  builtin_stores_.push_back(std::move(e));
  collect_stores();
  return true;
}

void Registry::collect_stores() {
  stores_ = builtin_stores_;
  for (const auto& p : plugins_) {
    if (!p.kv_store()) continue;
    StoreEntry e = describe_store(p.kv_store(), p.name(), p.path);
    e.plugin = p;
    if (const StoreEntry* taken = find_store(e.name)) {
      // Logged once, when the plugin is added (add_loaded), not on every rebuild.
      (void)taken;
      continue;
    }
    stores_.push_back(std::move(e));
  }
}

const StoreEntry* Registry::find_store(const std::string& name) const {
  for (const auto& s : stores_)
    if (s.name == name) return &s;
  return nullptr;
}

Registry Registry::discover(const DiscoveryOptions& options) {
  Registry r;
  r.probe_ = options.probe;
  r.search_path_ = plugin_search_path(options);
  for (const auto& dir : r.search_path_) {
    std::error_code ec;
    if (!fs::is_directory(dir.path, ec)) {
      if (dir.source == "--plugin-dir") r.missing_dirs_.push_back(dir.path);
      spdlog::debug("plugin directory {} ({}) does not exist", dir.path, dir.source);
      continue;
    }
    r.add_directory(dir.path);
  }
  return r;
}

bool Registry::add_directory(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return false;
  const auto files = plugin_files_in(dir);
  const auto probed = probe(files);  // one probe process for the directory
  for (size_t i = 0; i < files.size(); ++i) add_probed(files[i], probed[i]);
  return true;
}

bool Registry::add_file(const std::string& path) { return add_probed(path, probe({path}).front()); }

std::vector<std::string> Registry::probe(const std::vector<std::string>& files) const {
  return probe_ ? probe_plugin_files(files) : std::vector<std::string>(files.size());
}

bool Registry::add_probed(const std::string& path, std::string error) {
  LoadedPlugin p;
  // Only a file that loaded cleanly in a probe process is loaded into this one (probe.hpp).
  if (!error.empty() || !load_plugin(path, &p, &error)) {
    spdlog::warn("plugin file {} not loaded: {}", path, error);
    failures_.push_back({path, error});
    return false;
  }
  if (p.has_score && p.score < 0) {
    failures_.push_back({path, fs::path(path).filename().string() + ": plugin '" + p.name() +
                                   "' reports score " + std::to_string(p.score) +
                                   ": unusable on this machine"});
    return false;
  }
  add_loaded(std::move(p));
  return true;
}

void Registry::add_loaded(LoadedPlugin p) {
  for (auto& existing : plugins_) {
    if (std::string(existing.name()) != p.name()) continue;
    if (p.score > existing.score) {
      std::string why = "higher score (" + std::to_string(p.score) + " > " +
                        std::to_string(existing.score) + ")";
      spdlog::info("plugin '{}': {} shadows {}: {}", p.name(), p.path, existing.path, why);
      shadowed_.push_back({p.name(), existing.path, p.path, why});
      existing = std::move(p);  // keeps the earlier one's place in the listing order
      collect_stores();
    } else {
      spdlog::info("plugin '{}': {} is shadowed by {} (earlier in the search path)", p.name(),
                   p.path, existing.path);
      shadowed_.push_back({p.name(), p.path, existing.path, "earlier in the search path"});
    }
    return;
  }
  if (p.kv_store()) {
    const StoreEntry e = describe_store(p.kv_store(), p.name(), p.path);
    if (const StoreEntry* taken = find_store(e.name)) {
      spdlog::info("KV store '{}' of {} is shadowed by {}", e.name, p.path, taken->source);
      shadowed_.push_back({e.name, p.path, taken->source, "KV store name taken"});
    }
  }
  plugins_.push_back(std::move(p));
  collect_stores();
}

const LoadedPlugin* Registry::find(const std::string& name) const {
  for (const auto& p : plugins_)
    if (name == p.name()) return &p;
  return nullptr;
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto& p : plugins_) out.push_back(p.name());
  return out;
}

}  // namespace sieve::runtime
