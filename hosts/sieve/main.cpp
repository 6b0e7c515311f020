// sieve — the command-line host: discovers plugins, checks them, runs chains.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "commands.hpp"

namespace {
struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* summary;
};
const Command kCommands[] = {
    {"plugins", sieve::cli::cmd_plugins, "list the plugins found, their capabilities and parameters"},
    {"conform", sieve::cli::cmd_conform, "run the ABI conformance suite on a plugin binary"},
    {"attn", sieve::cli::cmd_attn, "run a synthetic attention workload through a chain; fidelity vs dense"},
};

void usage(std::FILE* f) {
  std::fprintf(f, "usage: sieve <command> [options]   (sieve <command> --help for its options)\n\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-9s %s\n", c.name, c.summary);
}
}  // namespace

int main(int argc, char** argv) {
  spdlog::set_pattern("%^%l%$: %v");
  if (argc < 2) {
    // The README's main job until the model host lands: a built-in attention workload.
    char prog[] = "attn";
    char* args[] = {prog, nullptr};
    return sieve::cli::cmd_attn(1, args);
  }
  std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  for (const auto& c : kCommands)
    if (cmd == c.name) return c.run(argc - 1, argv + 1);
  std::fprintf(stderr, "sieve: unknown command '%s'\n", cmd.c_str());
  usage(stderr);
  return 2;
}
