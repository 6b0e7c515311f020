// Registry: load what discovery finds, resolve duplicate names, keep the failures.
#include "sieve/runtime/registry.hpp"
#include "sieve/runtime/probe.hpp"

#include <spdlog/spdlog.h>

#include <filesystem>
#include <system_error>

namespace sieve::runtime {

namespace fs = std::filesystem;

Registry Registry::discover(const DiscoveryOptions& options) {
  Registry r;
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
  const auto probed = probe_plugin_files(files);  // one probe process for the directory
  for (size_t i = 0; i < files.size(); ++i) add_probed(files[i], probed[i]);
  return true;
}

bool Registry::add_file(const std::string& path) { return add_probed(path, probe_plugin_file(path)); }

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
    } else {
      spdlog::info("plugin '{}': {} is shadowed by {} (earlier in the search path)", p.name(),
                   p.path, existing.path);
      shadowed_.push_back({p.name(), p.path, existing.path, "earlier in the search path"});
    }
    return;
  }
  plugins_.push_back(std::move(p));
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
