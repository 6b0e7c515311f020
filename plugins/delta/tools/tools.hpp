// The delta plugin's command-line tools (ABI 1.1 sieve_tool; listed in DeltaPolicy::kTools), run
// by `sieve tool delta <name>` inside the CLI's process. Built where core/cli's sieve_cli exists.
#pragma once

namespace sieve::delta {

// calibrate.cpp: per-layer attention shift between decode steps of a model; suggests the
// Δ-layers (`sieve calibrate delta`).
int calibrate_main(int argc, const char* const* argv);

}  // namespace sieve::delta
