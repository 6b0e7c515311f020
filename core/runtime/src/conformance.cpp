// `conform()`: the static part, then the numeric part, each isolated in a child process; the
// report both fill.
#include "conformance_isolation.hpp"
#include "sieve/runtime/conformance.hpp"

namespace sieve::runtime {

bool ConformReport::passed() const {
  if (checks.empty()) return false;
  for (const auto& c : checks)
    if (!c.passed && !c.skipped) return false;
  return true;
}
const ConformCheck* ConformReport::find(const std::string& name) const {
  for (const auto& c : checks)
    if (c.name == name) return &c;
  return nullptr;
}
void ConformReport::pass(const std::string& name, const std::string& detail) {
  checks.push_back({name, true, false, detail, ""});
}
void ConformReport::fail(const std::string& name, const std::string& detail) {
  checks.push_back({name, false, false, detail, ""});
}
void ConformReport::skip(const std::string& name, const std::string& detail) {
  checks.push_back({name, false, true, detail, ""});
}

ConformReport conform(const std::string& path, const ConformOptions& options) {
  ConformReport report = conform_static(path, options);
  if (!static_gate_passed(report)) {
    report.skip("numeric", "not run: the static checks it relies on failed");
    return report;
  }
  run_isolated(
      [&](CheckSink& sink) {
        LoadedPlugin plugin;
        std::string err;
        if (!load_plugin(path, &plugin, &err)) {
          sink.fail("numeric", "loading for the numeric checks failed: " + err);
          return;
        }
        sink.begin("numeric");
        ConformReport part;
        part.plugin_path = path;
        conform_numeric(plugin, &part, options);
        for (const auto& c : part.checks) sink.done(c);
        sink.end();
      },
      "numeric", {}, options, &report);
  // The store it ships: its table was read in a child by the static part (kv_store_table), so
  // loading the file here is what discovery's probe-then-load does.
  LoadedPlugin plugin;
  std::string err;
  if (!load_plugin(path, &plugin, &err)) {
    report.fail("store_table", "loading the plugin for its KV store failed: " + err);
  } else if (plugin.kv_store()) {
    conform_store(store_under_test(describe_store(plugin.kv_store(), plugin.name(), path)), options, &report);
  }
  return report;
}

}  // namespace sieve::runtime

