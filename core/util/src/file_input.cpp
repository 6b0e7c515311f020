#include "sieve/util/file_input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "sieve/util/error.hpp"
#include "sieve/util/printable.hpp"

namespace sieve {

namespace {
// Why a file of this mode cannot be read as input ("" for a regular file).
std::string not_regular(mode_t mode) {
  if (S_ISREG(mode)) return "";
  if (S_ISDIR(mode)) return "is a directory, not a file";
  if (S_ISFIFO(mode)) return "is a FIFO (named pipe), not a regular file";
  if (S_ISSOCK(mode)) return "is a socket, not a regular file";
  if (S_ISCHR(mode) || S_ISBLK(mode)) return "is a device, not a regular file";
  return "is not a regular file";
}
std::string open_problem(int err) {
  if (err == ELOOP) return "cannot open: symlink loop (too many levels of symbolic links)";
  return std::string("cannot open: ") + std::strerror(err);
}
}  // namespace

std::string file_label(const std::string& what, const std::string& path) {
  return what + " '" + printable(path) + "'";
}

InputFile::InputFile(const std::string& path, std::string what) : path_(path), what_(std::move(what)) {
  // stat before open: opening a FIFO for reading blocks until a writer comes.
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0)
    refuse(open_problem(errno), errno == ENOENT ? SIEVE_ERR_NOT_FOUND : SIEVE_ERR_INVALID_ARGUMENT);
  if (std::string p = not_regular(st.st_mode); !p.empty()) refuse(p);
  // O_NONBLOCK and a second check on the descriptor: the path may have been swapped meanwhile.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) refuse(open_problem(errno), errno == ENOENT ? SIEVE_ERR_NOT_FOUND : SIEVE_ERR_INVALID_ARGUMENT);
  if (::fstat(fd_, &st) != 0) refuse(std::string("cannot stat: ") + std::strerror(errno));
  if (std::string p = not_regular(st.st_mode); !p.empty()) refuse(p);
  size_ = uint64_t(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::refuse(const std::string& problem, sieve_status status) const {
  fail(status, file_label(what_, path_) + ": " + problem);
}

void InputFile::read_at(uint64_t offset, void* dst, size_t n) const {
  if (offset > size_ || n > size_ - offset)
    refuse("truncated: " + std::to_string(n) + " bytes at offset " + std::to_string(offset) + " run past its end (" +
           std::to_string(size_) + " bytes)");
  auto* out = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, out, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) refuse("read failed at byte " + std::to_string(offset) + ": " + std::strerror(errno));
    if (got == 0) refuse("ends at byte " + std::to_string(offset) + " (truncated while being read?)");
    out += got;
    offset += uint64_t(got);
    n -= size_t(got);
  }
}

void InputFile::check_limit(uint64_t max_bytes) const {
  if (size_ > max_bytes)
    refuse(std::to_string(size_) + " bytes, more than the " + std::to_string(max_bytes) +
           " bytes such a file may have");
}

std::vector<std::byte> InputFile::read_all(uint64_t max_bytes) const {
  check_limit(max_bytes);
  std::vector<std::byte> bytes(static_cast<size_t>(size_));
  read_at(0, bytes.data(), bytes.size());
  return bytes;
}

std::string InputFile::read_text(uint64_t max_bytes) const {
  check_limit(max_bytes);
  std::string text(static_cast<size_t>(size_), '\0');
  read_at(0, text.data(), text.size());
  return text;
}

std::vector<std::byte> read_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  return InputFile(path, what).read_all(max_bytes);
}
std::string read_text_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  return InputFile(path, what).read_text(max_bytes);
}

}  // namespace sieve
