// The dpxa plugin's command-line tools (ABI 1.1 sieve_tool; listed in DpxaPolicy::kTools), run by
// `sieve tool dpxa <name>` inside the CLI's process. Built where core/cli's sieve_cli exists.
#pragma once

namespace sieve::dpxa {

// calibrate.cpp: per-(layer, head) tau so the kept tiles cover a target share of the exact
// attention mass (`sieve calibrate dpxa`).
int calibrate_main(int argc, const char* const* argv);

}  // namespace sieve::dpxa
