// Reading files whose content is untrusted (models, tokenizers, configs, gate weights, prompt
// and threshold files). One place decides what may be opened and how much may be read, so every
// reader refuses the same things with the same one line "<what> '<path>': <problem>" (sieve::Error):
//  - only regular files (after following symlinks): a directory, FIFO (would block forever),
//    socket or device is refused by name before it is opened; a symlink loop says so;
//  - reads are exact (a short read is an error naming the offset), never past a size limit the
//    caller states, so a huge or lying file cannot make the reader allocate without bound;
//  - the path is escaped (printable.hpp) wherever it appears in a message.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "sieve/abi.h"

namespace sieve {

class InputFile {
 public:
  // Opens `path`; `what` names the role in messages ("model", "tokenizer", ...).
  InputFile(const std::string& path, std::string what);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Exactly n bytes at `offset`.
  void read_at(uint64_t offset, void* dst, size_t n) const;
  // The whole file; refused when it is larger than max_bytes.
  std::vector<std::byte> read_all(uint64_t max_bytes) const;
  std::string read_text(uint64_t max_bytes) const;
  // Throws "<what> '<path>': <problem>".
  [[noreturn]] void refuse(const std::string& problem, sieve_status status = SIEVE_ERR_INVALID_ARGUMENT) const;

 private:
  void check_limit(uint64_t max_bytes) const;
  std::string path_, what_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Whole-file shorthands.
std::vector<std::byte> read_file(const std::string& path, const std::string& what, uint64_t max_bytes);
std::string read_text_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// "<what> '<printable path>'", the start of every message about a file.
std::string file_label(const std::string& what, const std::string& path);

}  // namespace sieve
