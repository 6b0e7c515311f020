// Prompts for the commands that run a model on text (sieve eval, sieve calibrate, sieve
// delta-diag): the built-in default set and prompt files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sieve::cli {

// Four short story openings for the embedded stories260K: the prompts of sieve eval and
// sieve calibrate delta without --prompts.
const std::vector<std::string>& default_prompts();

// One prompt per non-blank line of the file (lines kept as written). Throws sieve::Error with one
// line when the file cannot be read (a regular file of at most kMaxPromptsFileBytes:
// sieve/util/file_input.hpp) or has no non-blank line.
constexpr uint64_t kMaxPromptsFileBytes = 64u << 20;
std::vector<std::string> read_prompts(const std::string& path);

// `defaults` when no file is named, else the file's prompts (read_prompts).
std::vector<std::string> prompts_or_defaults(const std::string& path,
                                             const std::vector<std::string>& defaults = default_prompts());

}  // namespace sieve::cli
