// The seer plugin's command-line tools (ABI 1.1 sieve_tool; listed in SeerPolicy::kTools), run by
// `sieve tool seer <name>` inside the CLI's process. Built where core/cli's sieve_cli exists.
// (seer_random_gate.cpp beside it is a standalone executable for images without the CLI.)
#pragma once

namespace sieve::seer {

// distill_gate.cpp: self-distil a SeerAttention-R gate for a model (`sieve distill-gate`).
int distill_gate_main(int argc, const char* const* argv);

}  // namespace sieve::seer
