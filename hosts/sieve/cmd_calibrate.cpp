// sieve calibrate <method> [options]: dispatch to a method's calibration study. Adding a method:
// declare its function in calibrate.hpp, define it in calibrate_<method>.cpp, add one row below.
#include <cstdio>
#include <cstring>
#include <string>

#include "calibrate.hpp"
#include "commands.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/util/printable.hpp"

namespace sieve::cli {

namespace {
struct Method {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};
const Method kMethods[] = {
    {"delta", calibrate_delta,
     "DELTA: per-layer shift of the attention between decode steps; suggests Δ-layers"},
    {"dpxa", calibrate_dpxa, "dpxa: per-head tau so kept tiles cover a target share of the true mass"},
};

std::string method_names() {
  std::string names;
  for (const auto& m : kMethods) names += (names.empty() ? "" : ", ") + std::string(m.name);
  return names;
}

void usage(std::FILE* f) {
  std::fprintf(f, "usage: sieve calibrate <method> [options]   (sieve calibrate <method> --help)\n\n");
  for (const auto& m : kMethods) std::fprintf(f, "  %-8s %s\n", m.name, m.summary);
}
}  // namespace

int cmd_calibrate(int argc, char** argv) {
  if (argc < 2) return report_error("sieve calibrate", "name a method: " + method_names(), 2);
  const char* method = argv[1];
  if (!std::strcmp(method, "--help") || !std::strcmp(method, "-h")) {
    usage(stdout);
    return 0;
  }
  for (const auto& m : kMethods)
    if (!std::strcmp(method, m.name)) return m.run(argc - 1, argv + 1);
  return report_error("sieve calibrate",
                      std::string("unknown method '") + printable(method) + "' (" + method_names() + ")", 2);
}

}  // namespace sieve::cli
