// sieve conform PLUGIN.so: the ABI conformance suite on one plugin binary (CI's gate).
// Also the whole of the `sieve-conform` executable (hosts/conform), which is built without
// Boost.program_options (GPU images lack it): the options are parsed by hand here.
// Output and exit codes are a stable interface: docs/conformance.md.
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sieve/runtime/conformance.hpp>
#include <sieve/runtime/registry.hpp>
#include <string>

#include "commands.hpp"
#include "sieve/cli/error_line.hpp"

namespace sieve::cli {

namespace {

const char* kUsage =
    "usage: sieve conform PLUGIN.so [options]\n"
    "       sieve conform [--store NAME] [--plugin-dir DIR]... [options]\n"
    "\n"
    "Run the ABI conformance checks on a plugin binary (and the KV-store suite on the store it\n"
    "ships), or with no plugin file the KV-store suite on every store: the core's and every\n"
    "discovered plugin's (--store: that one only). Exit status: 0 every check passed or was\n"
    "skipped, 1 a check failed, 2 bad usage. docs/conformance.md describes checks and --json.\n"
    "\n"
    "  --store NAME             the KV-store suite on the store called NAME only\n"
    "  --plugin-dir DIR         also look for store plugins in DIR (repeatable)\n"
    "  --json                   machine-readable report on stdout (schema sieve.conform/1)\n"
    "  --param NAME=VALUE       a plugin parameter for every check that creates the plugin\n"
    "                           (repeatable; replaces the descriptor's conform_params value of\n"
    "                           that name, others keep theirs), e.g. --param weights=g.bin\n"
    "  --geometry K=V[,K=V...]  replace declared-geometry fields: hq, hkv, d, page, dtype\n"
    "                           (f32|f16|bf16), layers (the model's count; layers 0-1 run); the\n"
    "                           numeric part then runs that one geometry,\n"
    "                           e.g. --geometry hq=8,hkv=4,d=8,page=16\n"
    "  --timeout SECONDS        per part, before the child is killed (default 120)\n"
    "  --in-process             call the plugin in this process (a crash then ends the run;\n"
    "                           for debuggers)\n"
    "  -h, --help               this help\n";

int usage_error(const std::string& message) {
  return report_error("sieve conform", message + " (sieve conform --help lists the options)", 2);
}

}  // namespace

int cmd_conform(int argc, char** argv) {
  std::string path, geometry_text, store_name;
  runtime::DiscoveryOptions discovery;
  bool json = false;
  runtime::ConformOptions options;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](std::string* out) {
      const size_t eq = a.find('=');
      if (a.rfind("--", 0) == 0 && eq != std::string::npos) {  // --opt=value
        *out = a.substr(eq + 1);
        return true;
      }
      if (i + 1 >= argc) return false;
      *out = argv[++i];
      return true;
    };
    const std::string opt = a.substr(0, a.find('='));
    std::string v;
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a == "--json") {
      json = true;
    } else if (a == "--in-process") {
      options.isolate = false;
    } else if (opt == "--param") {
      if (!value(&v)) return usage_error("--param needs NAME=VALUE");
      const size_t eq = v.find('=');
      if (eq == std::string::npos || eq == 0) return usage_error("--param '" + v + "': expected NAME=VALUE");
      options.params.emplace_back(v.substr(0, eq), v.substr(eq + 1));
    } else if (opt == "--geometry") {
      if (!value(&v)) return usage_error("--geometry needs K=V[,K=V...]");
      std::string err;
      if (!runtime::parse_geometry_override(v, &options.geometry, &err)) return usage_error(err);
      geometry_text = v;
    } else if (opt == "--store") {
      if (!value(&store_name) || store_name.empty()) return usage_error("--store needs a store name");
    } else if (opt == "--plugin-dir") {
      if (!value(&v) || v.empty()) return usage_error("--plugin-dir needs a directory");
      discovery.plugin_dirs.push_back(v);
    } else if (opt == "--timeout") {
      if (!value(&v)) return usage_error("--timeout needs a number of seconds");
      char* end = nullptr;
      const long t = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || t < 1 || t > 86400) return usage_error("--timeout '" + v + "': seconds in [1, 86400]");
      options.timeout_s = int(t);
    } else if (a.size() > 1 && a[0] == '-') {
      return usage_error("unknown option '" + a + "'");
    } else if (path.empty()) {
      path = a;
    } else {
      return usage_error("one plugin file at a time ('" + path + "' and '" + a + "')");
    }
  }
  if (!path.empty() && (!store_name.empty() || !discovery.plugin_dirs.empty()))
    return usage_error("a plugin file and --store / --plugin-dir do not go together");
  if (json) {
    // stdout carries the report alone: log lines (the runtime's, and the plugin's through the
    // host's log callback, in the checking children too) go to stderr.
    spdlog::set_default_logger(spdlog::stderr_logger_mt("sieve-conform"));
    spdlog::set_pattern("%^%l%$: %v");
  }

  runtime::ConformReport report;
  runtime::Registry registry;  // keeps the plugins whose stores are checked loaded
  if (!path.empty()) {
    report = runtime::conform(path, options);
  } else {
    registry = runtime::Registry::discover(discovery);
    std::vector<runtime::StoreUnderTest> stores = runtime::known_stores(registry);
    if (!store_name.empty()) {
      std::string names;
      for (const auto& st : stores) names += (names.empty() ? "" : ", ") + st.name;
      std::erase_if(stores, [&](const runtime::StoreUnderTest& st) { return st.name != store_name; });
      if (stores.empty()) return usage_error("no KV store called '" + store_name + "' (known: " + names + ")");
    }
    for (const auto& st : stores) runtime::conform_store(st, options, &report);
  }

  size_t passed = 0, failed = 0, skipped = 0;
  for (const auto& c : report.checks) (c.skipped ? skipped : c.passed ? passed : failed)++;
  if (json) {
    nlohmann::json params = nlohmann::json::object();
    for (const auto& [k, val] : options.params) params[k] = val;
    nlohmann::json out = {{"schema", "sieve.conform/1"},
                          {"plugin", report.plugin_path},
                          {"passed", report.passed()},
                          {"counts", {{"pass", passed}, {"fail", failed}, {"skip", skipped}}},
                          {"options", {{"params", params}, {"geometry", geometry_text}}}};
    out["checks"] = nlohmann::json::array();
    for (const auto& c : report.checks) {
      nlohmann::json item = {{"name", c.name},
                             {"result", c.skipped ? "skip" : c.passed ? "pass" : "fail"},
                             {"detail", c.detail}};
      if (!c.store.empty()) item["store"] = c.store;
      out["checks"].push_back(item);
    }
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("conformance of %s\n", path.empty() ? "the KV stores" : report.plugin_path.c_str());
    std::string store;
    for (const auto& c : report.checks) {
      if (c.store != store && !c.store.empty()) std::printf(" KV store %s\n", c.store.c_str());
      store = c.store;
      std::printf("  %s  %-38s %s\n", c.skipped ? "SKIP" : c.passed ? "PASS" : "FAIL",
                  c.name.c_str(), c.detail.c_str());
    }
    std::printf("%s: %zu passed, %zu failed, %zu skipped\n", report.passed() ? "PASS" : "FAIL",
                passed, failed, skipped);
  }
  return report.passed() ? 0 : 1;
}

}  // namespace sieve::cli
