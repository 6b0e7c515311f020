// check_elf_file on copies of a real plugin with one program-header field corrupted, the offset
// computed from the plugin's own headers. The case: a byte-flipped p_memsz made a loadable segment
// reach past the next one; glibc sized its reservation from the last segment's end and mapped the
// long segment's zero-fill over the host's heap (ASan build: SEGV in a later delete). The probe
// process survives such a copy (it touches no memory after loading), so only this check stops it.
#include <elf.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sieve/runtime/loader.hpp>
#include <sieve/runtime/registry.hpp>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "runtime_test_util.hpp"

using namespace sieve::runtime;
using ::testing::HasSubstr;

namespace {

std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

// A program header of an image and where it lies in the file.
struct Header {
  unsigned index;
  size_t offset;
  Elf64_Phdr ph;
};

std::vector<Header> program_headers(const std::vector<char>& image, uint32_t type) {
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof eh);
  std::vector<Header> out;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Header h{i, size_t(eh.e_phoff + i * sizeof(Elf64_Phdr)), {}};
    std::memcpy(&h.ph, image.data() + h.offset, sizeof h.ph);
    if (h.ph.p_type == type) out.push_back(h);
  }
  return out;
}

void put(std::vector<char>* image, const Header& h) {
  std::memcpy(image->data() + h.offset, &h.ph, sizeof h.ph);
}

class HostileElfSegments : public ::testing::Test {
 protected:
  void SetUp() override {
    image_ = sieve::test::read_bytes(std::string(SIEVE_PLUGIN_DIR) + "/libsieve_dense.so");
    ASSERT_GT(image_.size(), sizeof(Elf64_Ehdr));
    loads_ = program_headers(image_, PT_LOAD);
    ASSERT_GE(loads_.size(), 2u) << "the dense plugin has one loadable segment?";
    // The pristine copy passes: what the cases below refuse is the one field they change.
    ASSERT_EQ(check_elf_file(write(image_)), "");
  }
  std::string write(const std::vector<char>& image) {
    const std::string path = dir_.str() + "/libsieve_corrupt.so";
    sieve::test::write_bytes(path, image);
    return path;
  }
  // The address one past the last loadable segment's memory.
  uint64_t image_end() const { return loads_.back().ph.p_vaddr + loads_.back().ph.p_memsz; }

  sieve::test::ScratchDir dir_;
  std::vector<char> image_;
  std::vector<Header> loads_;
};

std::string overlap_message(const Header& a, const Header& b) {
  return "malformed ELF file: loadable segment " + std::to_string(a.index) + " (p_vaddr " +
         hex(a.ph.p_vaddr) + ", p_memsz " + hex(a.ph.p_memsz) +
         ") reaches past the start of the next loadable segment " + std::to_string(b.index) +
         " (p_vaddr " + hex(b.ph.p_vaddr) + "): the loader would map it over memory outside the "
         "library";
}

TEST_F(HostileElfSegments, ALoadSegmentReachingPastTheNextIsRefused) {
  // As the flipped copy: the second-to-last segment grows 13 MiB past the last one's end.
  Header grown = loads_[loads_.size() - 2];
  grown.ph.p_memsz = image_end() - grown.ph.p_vaddr + (uint64_t(13) << 20);
  auto bad = image_;
  put(&bad, grown);
  const std::string path = write(bad);
  EXPECT_EQ(check_elf_file(path), overlap_message(grown, loads_.back()));

  LoadedPlugin p;
  std::string error;
  EXPECT_FALSE(load_plugin(path, &p, &error));
  EXPECT_EQ(error, "libsieve_corrupt.so: " + overlap_message(grown, loads_.back()));

  Registry r;  // discovery names the file and the field, and the host is still here
  ASSERT_TRUE(r.add_directory(dir_.str()));
  EXPECT_TRUE(r.names().empty());
  ASSERT_EQ(r.failures().size(), 1u);
  EXPECT_THAT(r.failures()[0].reason, HasSubstr("libsieve_corrupt.so: malformed ELF file: loadable "
                                                "segment " + std::to_string(grown.index)));
}

TEST_F(HostileElfSegments, AnOverlapByOneByteIsRefused) {
  Header grown = loads_[0];
  grown.ph.p_memsz = loads_[1].ph.p_vaddr - grown.ph.p_vaddr + 1;
  auto bad = image_;
  put(&bad, grown);
  EXPECT_EQ(check_elf_file(write(bad)), overlap_message(grown, loads_[1]));
}

TEST_F(HostileElfSegments, LoadSegmentsOutOfOrderAreRefused) {
  // The first two loadable headers swapped: glibc would reserve too little for the first.
  Header first = loads_[0], second = loads_[1];
  std::swap(first.offset, second.offset);
  std::swap(first.index, second.index);
  auto bad = image_;
  put(&bad, first);
  put(&bad, second);
  EXPECT_EQ(check_elf_file(write(bad)), overlap_message(second, first));
}

TEST_F(HostileElfSegments, RelroOutsideTheLoadSegmentsIsRefused) {
  auto relro = program_headers(image_, PT_GNU_RELRO);
  if (relro.empty()) GTEST_SKIP() << "this toolchain linked the dense plugin without RELRO";
  Header wide = relro[0];
  wide.ph.p_memsz = image_end() - wide.ph.p_vaddr + (uint64_t(1) << 20);
  auto bad = image_;
  put(&bad, wide);
  EXPECT_EQ(check_elf_file(write(bad)),
            "malformed ELF file: PT_GNU_RELRO (p_vaddr " + hex(wide.ph.p_vaddr) + ", p_memsz " +
                hex(wide.ph.p_memsz) + ") lies outside the loadable segments: the loader would "
                "write-protect memory outside the library");
}

}  // namespace
