#include "prompts.hpp"

#include <fstream>

#include "sieve/util/error.hpp"
#include "sieve/util/escape.hpp"
#include "sieve/util/regular_file.hpp"

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
  if (std::string why = regular_file_problem(path, 16 << 20); !why.empty())
    fail(SIEVE_ERR_NOT_FOUND, "prompts file '" + escape_for_message(path) + "' " + why);
  std::ifstream f(path);
  if (!f) fail(SIEVE_ERR_NOT_FOUND, "prompts file '" + escape_for_message(path) + "': cannot open");
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) out.push_back(line);
  if (out.empty()) fail(SIEVE_ERR_INVALID_ARGUMENT, "prompts file '" + path + "' has no non-blank line");
  return out;
}

std::vector<std::string> prompts_or_defaults(const std::string& path, const std::vector<std::string>& defaults) {
  return path.empty() ? defaults : read_prompts(path);
}

}  // namespace sieve::cli
