// The sieve CLI's subcommands. Each parses its own options (Boost.program_options) and returns the
// process exit status: 0 success, 1 a failure it reports in one line, 2 bad usage.
#pragma once

namespace sieve::cli {
int cmd_plugins(int argc, char** argv);  // sieve plugins [--plugin-dir D] [--json]
int cmd_conform(int argc, char** argv);  // sieve conform PLUGIN.so [--json]
int cmd_attn(int argc, char** argv);     // sieve attn --chain SPEC ...
}  // namespace sieve::cli
