// sieve-conform PLUGIN.so [options]: `sieve conform` as its own executable, for CI images and
// third parties that want the gate without the rest of the CLI (it needs no Boost.program_options,
// so it is built on GPU images too). Same options, output and exit codes: docs/conformance.md.
#include <spdlog/spdlog.h>

#include "../sieve/commands.hpp"
#include "sieve/cli/error_line.hpp"

int main(int argc, char** argv) {
  spdlog::set_pattern("%^%l%$: %v");
  return sieve::cli::run_guarded("sieve-conform", sieve::cli::cmd_conform, argc, argv);
}
