// Before reading a small text file a user named (a chain file, a prompts file): it must exist, be
// a regular file (a FIFO would block the read, /dev/zero never end it, a directory read as empty)
// and hold at most `max_bytes`. Returns "" when it may be read, else the reason, e.g. "is not a
// regular file", for a message that names the file first.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

namespace sieve {

inline std::string regular_file_problem(const std::string& path, std::uintmax_t max_bytes) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) return "cannot be opened" + (ec ? " (" + ec.message() + ")" : "");
  if (!std::filesystem::is_regular_file(status)) return "is not a regular file";
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return "cannot be opened (" + ec.message() + ")";
  if (size > max_bytes) return "is larger than " + std::to_string(max_bytes) + " bytes";
  return {};
}

}  // namespace sieve
