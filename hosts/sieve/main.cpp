// sieve — the command-line host: discovers plugins, checks them, runs chains.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "commands.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/util/printable.hpp"

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
    {"run", sieve::cli::cmd_run, "generate text with a model (default: the embedded stories260K), attention through chains"},
    {"eval", sieve::cli::cmd_eval, "a chain against dense attention on a model: recall, output error, KL, agreement"},
    {"bench", sieve::cli::cmd_bench, "time the attention kernels against the measured ceilings and PyTorch SDPA"},
    {"distill-gate", sieve::cli::cmd_distill_gate, "self-distil a SeerAttention-R gate for a model (the seer plugin's weights)"},
    {"delta-diag", sieve::cli::cmd_delta_diag, "Δ-correction diagnostic: output cosine and attention-row Spearman vs dense, per layer"},
    {"calibrate", sieve::cli::cmd_calibrate, "per-method calibration studies on a model (delta: which layers to make Δ-layers)"},
    {"tool", sieve::cli::cmd_tool, "run a tool a plugin ships (sieve tool <plugin> lists them)"},
};

void usage(std::FILE* f) {
  std::fprintf(f, "usage: sieve <command> [options]   (sieve <command> --help for its options;\n"
                 "       sieve alone runs `sieve run`: the embedded model's greedy story on the CPU)\n\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-9s %s\n", c.name, c.summary);
}
}  // namespace

int main(int argc, char** argv) {
  // Logs go to stderr: stdout carries results (`--json`, generated text) that tools parse.
  spdlog::set_default_logger(spdlog::stderr_color_mt("sieve"));
  spdlog::set_pattern("%^%l%$: %v");
  if (argc < 2) {
    // The README's main job: the embedded model generates its story on the CPU.
    char prog[] = "run";
    char* args[] = {prog, nullptr};
    return sieve::cli::run_guarded("sieve run", sieve::cli::cmd_run, 1, args);
  }
  std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    usage(stdout);
    return 0;
  }
  for (const auto& c : kCommands)
    if (cmd == c.name) return sieve::cli::run_guarded("sieve " + cmd, c.run, argc - 1, argv + 1);
  return sieve::cli::report_error(
      "sieve", "unknown command '" + sieve::printable(cmd) + "' (sieve --help lists the commands)", 2);
}
