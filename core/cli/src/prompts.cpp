#include "sieve/cli/prompts.hpp"

#include <sstream>

#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"

namespace sieve::cli {

const std::vector<std::string>& default_prompts() {
  static const std::vector<std::string> prompts = {
      "Once upon a time",
      "Lily and Ben went to the park to play",
      "The little dog was sad because",
      "One day, a big bird flew",
  };
  return prompts;
}

std::vector<std::string> read_prompts(const std::string& path) {
  std::istringstream f(read_text_file(path, "prompts file", kMaxPromptsFileBytes));
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) out.push_back(line);
  if (out.empty()) fail(SIEVE_ERR_INVALID_ARGUMENT, file_label("prompts file", path) + " has no non-blank line");
  return out;
}

std::vector<std::string> prompts_or_defaults(const std::string& path, const std::vector<std::string>& defaults) {
  return path.empty() ? defaults : read_prompts(path);
}

}  // namespace sieve::cli
