// For the fuzz targets whose parser reads a path (the safetensors container, gate files): the
// input placed in one in-memory file per process (memfd, named through /proc/self/fd: a regular
// file to the reader, without a disk write per input), rewritten for each input.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace sieve::fuzz {

inline const std::string& scratch_file(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("sieve_fuzz_input", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ::ftruncate(fd, 0) != 0) std::abort();
  for (size_t done = 0; done < size;) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, off_t(done));
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  return path;
}

}  // namespace sieve::fuzz
