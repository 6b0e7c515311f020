// The delta_correction plugin's command-line tools (ABI 1.1 sieve_tool; listed in
// DeltaCorrectionPolicy::kTools), run by `sieve tool delta_correction <name>` inside the CLI's
// process. Built where core/cli's sieve_cli exists.
#pragma once

namespace sieve::delta_correction {

// diag.cpp: the Δ Attention paper's distribution-shift diagnostic, per layer: output cosine and
// attention-row Spearman of sparse / recompute / Δ prefill against dense (`sieve delta-diag`).
int diag_main(int argc, const char* const* argv);

}  // namespace sieve::delta_correction
