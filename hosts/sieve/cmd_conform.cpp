// sieve conform PLUGIN.so: the ABI conformance suite on one plugin binary (CI's gate).
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sieve/runtime/conformance.hpp>

#include "commands.hpp"

namespace po = boost::program_options;

namespace sieve::cli {

int cmd_conform(int argc, char** argv) {
  std::string path;
  bool json = false;
  bool in_process = false;
  po::options_description desc("sieve conform PLUGIN.so [options]\n\nRun the ABI conformance "
                               "checks on a plugin binary; exit 0 only if every check passes");
  desc.add_options()("help,h", "this help")("json", po::bool_switch(&json),
                                            "machine-readable output")(
      "in-process", po::bool_switch(&in_process),
      "call the plugin in this process (a crash then ends the run; for debuggers)");
  po::options_description hidden;
  hidden.add_options()("plugin", po::value<std::string>(&path));
  po::options_description all;
  all.add(desc).add(hidden);
  po::positional_options_description pos;
  pos.add("plugin", 1);
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sieve conform: %s\n", e.what());
    return 2;
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (path.empty()) {
    std::fprintf(stderr, "sieve conform: name a plugin file: sieve conform PLUGIN.so\n");
    return 2;
  }

  runtime::ConformOptions options;
  options.isolate = !in_process;
  runtime::ConformReport report = runtime::conform(path, options);

  size_t passed = 0, failed = 0, skipped = 0;
  for (const auto& c : report.checks) (c.skipped ? skipped : c.passed ? passed : failed)++;
  if (json) {
    nlohmann::json out = {{"plugin", report.plugin_path},
                          {"passed", report.passed()},
                          {"counts", {{"pass", passed}, {"fail", failed}, {"skip", skipped}}}};
    out["checks"] = nlohmann::json::array();
    for (const auto& c : report.checks)
      out["checks"].push_back({{"name", c.name},
                               {"result", c.skipped ? "skip" : c.passed ? "pass" : "fail"},
                               {"detail", c.detail}});
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("conformance of %s\n", report.plugin_path.c_str());
    for (const auto& c : report.checks)
      std::printf("  %s  %-38s %s\n", c.skipped ? "SKIP" : c.passed ? "PASS" : "FAIL",
                  c.name.c_str(), c.detail.c_str());
    std::printf("%s: %zu passed, %zu failed, %zu skipped\n", report.passed() ? "PASS" : "FAIL",
                passed, failed, skipped);
  }
  return report.passed() ? 0 : 1;
}

}  // namespace sieve::cli
