// sieve plugins: list every plugin discovery finds, its capabilities and its parameter schema,
// and every file that failed to load with the reason; `sieve plugins NAME`: one plugin (its policy
// descriptor, schema, tools and the store it ships) or one KV store. Needs no GPU.
#include <spdlog/spdlog.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sieve/runtime/conformance.hpp>
#include <sieve/runtime/descriptor_names.hpp>
#include <sieve/runtime/params.hpp>
#include <sieve/runtime/registry.hpp>
#include <sieve/util/printable.hpp>

#include "commands.hpp"
#include "sieve/cli/parse_options.hpp"

namespace po = boost::program_options;
using namespace sieve::runtime;

namespace {

std::string ints(const int32_t* v, uint32_t n) {
  if (n == 0) return "any";
  std::string out;
  for (uint32_t i = 0; i < n; ++i) {
    if (i) out += ",";
    out += std::to_string(v[i]);
  }
  return out;
}

nlohmann::json schema_json(const ParamSchema& schema) {
  auto arr = nlohmann::json::array();
  for (uint32_t i = 0; i < schema.size(); ++i) {
    const auto& s = schema[i];
    nlohmann::json p = {{"name", s.name ? s.name : ""},
                        {"type", param_type_name(s.type)},
                        {"default", s.default_value ? s.default_value : ""},
                        {"doc", s.doc ? s.doc : ""}};
    if (s.type == SIEVE_PARAM_INT || s.type == SIEVE_PARAM_FLOAT || s.type == SIEVE_PARAM_INT_LIST)
      p["range"] = {s.min, s.max};
    if (s.type == SIEVE_PARAM_ENUM) p["choices"] = s.choices ? s.choices : "";
    arr.push_back(std::move(p));
  }
  return arr;
}

nlohmann::json plugin_json(const LoadedPlugin& p) {
  nlohmann::json j = {{"name", p.name()}, {"path", p.path}, {"abi_major", p.plugin_major},
                      {"abi_minor", p.table->hdr.version}};
  if (p.has_score) j["score"] = p.score;
  if (const auto* d = p.descriptor()) {
    const auto* api = p.policy();
    j["kind"] = "policy";
    j["vendor"] = d->vendor;
    j["version"] = std::to_string(d->version_major) + "." + std::to_string(d->version_minor) +
                   "." + std::to_string(d->version_patch);
    j["summary"] = d->summary;
    j["phases"] = phase_names(d->phases);
    j["devices"] = device_names(d->devices);
    j["dtypes"] = dtype_names(d->dtypes);
    j["head_dims"] = ints(d->head_dims, d->n_head_dims);
    j["page_sizes"] = ints(d->page_sizes, d->n_page_sizes);
    j["selection_heads"] = selection_heads_name(d->selection_heads);
    j["needs"] = needs_names(d->needs);
    j["evicts_kv"] = d->evicts_kv != 0;
    j["cuda_graph"] = cuda_graph_name(d->cuda_graph);
    j["selection_basis"] = selection_basis_name(declared_selection_basis(*d));  // ABI 1.1
    j["conform_params"] = declared_conform_params(*d);
    auto hooks = nlohmann::json::array();
    if (api->on_append) hooks.push_back("on_append");
    if (api->select) hooks.push_back("select");
    if (api->attend) hooks.push_back("attend");
    if (api->observe) hooks.push_back("observe");
    if (api->correct) hooks.push_back("correct");
    if (api->end_step) hooks.push_back("end_step");
    j["hooks"] = hooks;
    j["params"] = schema_json(ParamSchema::of(*api));
  }
  if (const auto* kv = p.kv_store()) j["kv_store"] = kv->name;
  j["tools"] = nlohmann::json::array();
  for (const sieve_tool* t : p.tools()) j["tools"].push_back({{"name", t->name}, {"summary", t->summary}});
  return j;
}

void print_plugin(const LoadedPlugin& p) {
  if (const auto* d = p.descriptor()) {
    const auto* api = p.policy();
    std::string hooks;
    auto add = [&](const void* fn, const char* n) {
      if (!fn) return;
      if (!hooks.empty()) hooks += ",";
      hooks += n;
    };
    add(reinterpret_cast<const void*>(api->on_append), "on_append");
    add(reinterpret_cast<const void*>(api->select), "select");
    add(reinterpret_cast<const void*>(api->attend), "attend");
    add(reinterpret_cast<const void*>(api->observe), "observe");
    add(reinterpret_cast<const void*>(api->correct), "correct");
    add(reinterpret_cast<const void*>(api->end_step), "end_step");
    std::printf("%s %u.%u.%u (%s) — %s\n", p.name(), d->version_major, d->version_minor,
                d->version_patch, d->vendor, d->summary);
    std::printf("  path       %s\n", p.path.c_str());
    std::printf("  abi        %u.%u%s\n", p.plugin_major, p.table->hdr.version,
                p.has_score ? (", score " + std::to_string(p.score)).c_str() : "");
    std::printf("  phases     %s\n", phase_names(d->phases).c_str());
    std::printf("  devices    %s\n", device_names(d->devices).c_str());
    std::printf("  dtypes     %s\n", dtype_names(d->dtypes).c_str());
    std::printf("  head dims  %s   page sizes %s\n", ints(d->head_dims, d->n_head_dims).c_str(),
                ints(d->page_sizes, d->n_page_sizes).c_str());
    std::printf("  selection  %s   needs %s   evicts KV %s   CUDA graph %s\n",
                selection_heads_name(d->selection_heads).c_str(), needs_names(d->needs).c_str(),
                d->evicts_kv ? "yes" : "no", cuda_graph_name(d->cuda_graph).c_str());
    std::printf("  basis      %s   conform with %s\n", selection_basis_name(declared_selection_basis(*d)),
                *declared_conform_params(*d) ? declared_conform_params(*d) : "the defaults");
    std::printf("  hooks      %s\n", hooks.c_str());
    std::printf("  parameters\n%s", format_schema(ParamSchema::of(*api), "    ").c_str());
  }
  if (const auto* kv = p.kv_store()) {
    if (!p.descriptor()) std::printf("%s (KV store)\n  path       %s\n", p.name(), p.path.c_str());
    std::printf("  KV store   %s\n", kv->name);
  }
  for (const sieve_tool* t : p.tools())  // ABI 1.1: `sieve tool <plugin> <name>`
    std::printf("  tool       %-14s %s\n", t->name, t->summary);
}

// One KV store as both forms show it: the text lines are the JSON fields, in the same order.
nlohmann::json store_json(const StoreEntry& e) {
  const sieve_kv_store_descriptor& d = e.descriptor;
  nlohmann::json j = {{"name", e.name},
                      {"source", e.source},
                      {"declared", e.declared},
                      {"devices", d.devices ? device_names(d.devices) : "undeclared"},
                      {"dtypes", d.dtypes ? dtype_names(d.dtypes) : "undeclared"},
                      {"page_sizes", ints(d.page_sizes, d.page_sizes ? d.n_page_sizes : 0)},
                      {"layouts", kv_layout_names(d.layouts)},
                      {"features", kv_feature_names(d.features)},
                      {"params", schema_json(e.params())}};
  if (e.declared) {
    j["vendor"] = d.vendor ? d.vendor : "";
    j["version"] = std::to_string(d.version_major) + "." + std::to_string(d.version_minor) + "." +
                   std::to_string(d.version_patch);
    j["summary"] = d.summary ? d.summary : "";
  }
  return j;
}

void print_store(const StoreEntry& e) {
  const nlohmann::json j = store_json(e);
  if (e.declared)
    std::printf("%s %s (%s) — %s\n", e.name.c_str(), j["version"].get<std::string>().c_str(),
                j["vendor"].get<std::string>().c_str(), j["summary"].get<std::string>().c_str());
  else
    std::printf("%s (a 1.0 store: what its table shows)\n", e.name.c_str());
  std::printf("  source     %s\n", e.source.c_str());
  std::printf("  devices    %s\n", j["devices"].get<std::string>().c_str());
  std::printf("  dtypes     %s   page sizes %s\n", j["dtypes"].get<std::string>().c_str(),
              j["page_sizes"].get<std::string>().c_str());
  std::printf("  layouts    %s\n", j["layouts"].get<std::string>().c_str());
  std::printf("  features   %s\n", j["features"].get<std::string>().c_str());
  const ParamSchema params = e.params();
  if (params.empty())
    std::printf("  parameters none\n");
  else
    std::printf("  parameters\n%s", format_schema(params, "    ").c_str());
}

// `sieve plugins NAME`: the plugin of that name (its entry, then the stores it ships) or else the
// KV store of that name, in the listing's form; 2 and one line when neither exists.
int show_one(const Registry& registry, const std::string& name, bool json) {
  std::vector<const StoreEntry*> stores;
  const LoadedPlugin* plugin = registry.find(name);
  for (const auto& e : registry.stores())
    if (plugin ? (!e.builtin() && e.plugin.path == plugin->path) : e.name == name) stores.push_back(&e);
  if (!plugin && stores.empty()) {
    std::vector<std::string> names;
    for (const auto& p : registry.plugins()) names.push_back(p.name());
    for (const auto& e : registry.stores()) names.push_back(e.name);
    std::string line = "sieve plugins: no plugin or KV store named '" + sieve::printable(name) + "'";
    if (std::string near = closest_name(name, names); !near.empty()) line += " (did you mean '" + near + "'?)";
    std::string all;
    for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
    std::fprintf(stderr, "%s; found: %s\n", line.c_str(), all.empty() ? "none" : all.c_str());
    return 2;
  }
  if (json) {
    nlohmann::json out = {{"plugins", nlohmann::json::array()}, {"stores", nlohmann::json::array()}};
    if (plugin) out["plugins"].push_back(plugin_json(*plugin));
    for (const StoreEntry* e : stores) out["stores"].push_back(store_json(*e));
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  if (plugin) print_plugin(*plugin);
  for (const StoreEntry* e : stores) {
    if (plugin) std::printf("\nKV store it ships (--kv-store NAME(k=v,...), a chain's kv_store line):\n\n");
    print_store(*e);
  }
  return 0;
}

}  // namespace

namespace sieve::cli {

int cmd_plugins(int argc, char** argv) {
  DiscoveryOptions options;
  bool json = false;
  std::string name;
  po::options_description desc("sieve plugins [NAME] [options]\n\nList the plugins found (search order: "
                               "--plugin-dir, SIEVE_PLUGIN_PATH, <exe>/../lib/sieve/plugins, the "
                               "install libdir); with NAME, only that plugin or KV store");
  desc.add_options()("help,h", "this help")(
      "plugin-dir", po::value<std::vector<std::string>>(&options.plugin_dirs)->composing(),
      "search this directory first (repeatable)")("json", po::bool_switch(&json),
                                                  "machine-readable output")(
      "name", po::value(&name), "one plugin (descriptor, parameter schema, tools, its store) or KV store; "
                                "also the first word without an option");
  po::positional_options_description positional;
  positional.add("name", 1);
  po::variables_map vm;
  if (const auto done = parse_options("sieve plugins", desc, argc, argv, &vm, &positional)) return *done;

  Registry registry = Registry::discover(options);
  const bool missing = !registry.missing_dirs().empty();
  if (!name.empty() && !missing) return show_one(registry, name, json);

  if (json) {
    nlohmann::json out;
    out["search_path"] = nlohmann::json::array();
    for (const auto& d : registry.search_path())
      out["search_path"].push_back({{"path", d.path}, {"source", d.source}});
    out["plugins"] = nlohmann::json::array();
    for (const auto& p : registry.plugins()) out["plugins"].push_back(plugin_json(p));
    out["stores"] = nlohmann::json::array();
    for (const auto& e : registry.stores()) out["stores"].push_back(store_json(e));
    out["failures"] = nlohmann::json::array();
    for (const auto& f : registry.failures())
      out["failures"].push_back({{"path", f.path}, {"reason", f.reason}});
    out["shadowed"] = nlohmann::json::array();
    for (const auto& s : registry.shadowed())
      out["shadowed"].push_back({{"name", s.name}, {"path", s.path}, {"used", s.used}, {"why", s.why}});
    out["missing_dirs"] = registry.missing_dirs();
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("search path:\n");
    for (const auto& d : registry.search_path()) std::printf("  %-18s %s\n", d.source.c_str(), d.path.c_str());
    std::printf("\n");
    if (registry.plugins().empty()) std::printf("no plugins found\n\n");
    for (const auto& p : registry.plugins()) {
      print_plugin(p);
      std::printf("\n");
    }
    std::printf("KV stores (--kv-store NAME(k=v,...), a chain's kv_store line):\n\n");
    for (const auto& e : registry.stores()) {
      print_store(e);
      std::printf("\n");
    }
    if (!registry.shadowed().empty()) {
      std::printf("shadowed:\n");
      for (const auto& s : registry.shadowed())
        std::printf("  %s: %s not used (%s wins: %s)\n", s.name.c_str(), s.path.c_str(),
                    s.used.c_str(), s.why.c_str());
      std::printf("\n");
    }
    if (!registry.failures().empty()) {
      std::printf("not loaded:\n");
      for (const auto& f : registry.failures()) {
        // The reason starts with the file name; show the full path, there may be several dirs.
        std::string file = std::filesystem::path(f.path).filename().string() + ": ";
        std::string why = f.reason.rfind(file, 0) == 0 ? f.reason.substr(file.size()) : f.reason;
        std::printf("  %s: %s\n", f.path.c_str(), why.c_str());
      }
    }
  }
  for (const auto& d : registry.missing_dirs())
    std::fprintf(stderr, "sieve plugins: --plugin-dir %s does not exist\n", d.c_str());
  return missing ? 1 : 0;
}

}  // namespace sieve::cli
