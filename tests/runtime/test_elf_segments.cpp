// check_elf_file on copies of a real plugin with one header field corrupted, the offset computed
// from the plugin's own headers. The segment cases are byte-flipped copies that crashed the host
// (ASan build) after passing the probe process, which touches no host memory after loading and
// then ran no finalisers: a p_memsz making a loadable segment reach past the next one (glibc
// mapped its zero-fill over the host's heap: SEGV in a later delete), and a DT_FINI_ARRAY pointing
// into read-only data (glibc called those bytes at the host's exit). Then every section header
// and every dynamic-section address glibc follows, moved outside the file or the object.
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

// The dynamic entry with `tag` and where it lies in the file.
struct DynamicEntry {
  size_t offset;
  Elf64_Dyn d;
};

std::vector<DynamicEntry> dynamic_entries(const std::vector<char>& image, Elf64_Sxword tag) {
  std::vector<DynamicEntry> out;
  for (const Header& h : program_headers(image, PT_DYNAMIC))
    for (size_t at = h.ph.p_offset; at + sizeof(Elf64_Dyn) <= h.ph.p_offset + h.ph.p_filesz;
         at += sizeof(Elf64_Dyn)) {
      DynamicEntry e{at, {}};
      std::memcpy(&e.d, image.data() + at, sizeof e.d);
      if (e.d.d_tag == tag) out.push_back(e);
    }
  return out;
}

// A section header of an image and where it lies in the file.
struct Section {
  unsigned index;
  size_t offset;
  Elf64_Shdr sh;
};

std::vector<Section> section_headers(const std::vector<char>& image) {
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof eh);
  std::vector<Section> out;
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Section s{i, size_t(eh.e_shoff + i * sizeof(Elf64_Shdr)), {}};
    std::memcpy(&s.sh, image.data() + s.offset, sizeof s.sh);
    out.push_back(s);
  }
  return out;
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
  // The first loadable segment without permission `flag` (PF_W, PF_X).
  const Header* first_load_without(uint32_t flag) const {
    for (const Header& h : loads_)
      if (!(h.ph.p_flags & flag)) return &h;
    return nullptr;
  }
  // A copy with the dynamic entry `e` pointing at `ptr`, written out; its path.
  std::string with_pointer(DynamicEntry e, uint64_t ptr) {
    e.d.d_un.d_ptr = ptr;
    auto bad = image_;
    std::memcpy(bad.data() + e.offset, &e.d, sizeof e.d);
    return write(bad);
  }
  // A copy with section header `s` replaced, written out; its path.
  std::string with_section(const Section& s) {
    auto bad = image_;
    std::memcpy(bad.data() + s.offset, &s.sh, sizeof s.sh);
    return write(bad);
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

TEST_F(HostileElfSegments, AFiniArrayInReadOnlyDataIsRefused) {
  auto fini = dynamic_entries(image_, DT_FINI_ARRAY);
  ASSERT_EQ(fini.size(), 1u) << "the dense plugin has a C++ static destructor list";
  // Into the first loadable segment without write permission (headers, .rodata), as the flip did.
  const Header* read_only = first_load_without(PF_W);
  ASSERT_NE(read_only, nullptr);
  EXPECT_EQ(check_elf_file(with_pointer(fini[0], read_only->ph.p_vaddr)),
            "malformed dynamic section: DT_FINI_ARRAY at " + hex(read_only->ph.p_vaddr) +
                " is not in a writable loadable segment: the loader would call the unrelocated "
                "bytes it finds there");
}

TEST_F(HostileElfSegments, AFiniFunctionOutsideCodeIsRefused) {
  auto fini = dynamic_entries(image_, DT_FINI);
  if (fini.empty()) GTEST_SKIP() << "this toolchain linked the dense plugin without DT_FINI";
  const Header* data = first_load_without(PF_X);
  ASSERT_NE(data, nullptr);
  EXPECT_EQ(check_elf_file(with_pointer(fini[0], data->ph.p_vaddr)),
            "malformed dynamic section: DT_FINI at " + hex(data->ph.p_vaddr) +
                " is not in an executable loadable segment: the loader would call it");
}

// Section headers: glibc never reads them (check_elf_file's comment), but one that points
// outside the file, or a loaded section the segments do not put where it says, is a damaged file.
TEST_F(HostileElfSegments, SectionHeadersPastTheEndAreRefused) {
  Elf64_Ehdr eh;
  std::memcpy(&eh, image_.data(), sizeof eh);
  ASSERT_GT(eh.e_shnum, 1u);
  eh.e_shoff = image_.size() - sizeof(Elf64_Shdr);  // the last entry fits, the others do not
  auto bad = image_;
  std::memcpy(bad.data(), &eh, sizeof eh);
  EXPECT_EQ(check_elf_file(write(bad)), "truncated ELF file: section headers at byte " +
                                            std::to_string(eh.e_shoff) + " lie past its end (" +
                                            std::to_string(image_.size()) + " bytes)");
}

TEST_F(HostileElfSegments, EverySectionReachingPastTheFileIsRefused) {
  const uint64_t size = image_.size();
  unsigned cases = 0;
  for (Section s : section_headers(image_)) {
    if (s.sh.sh_type == SHT_NULL || s.sh.sh_type == SHT_NOBITS || s.sh.sh_size == 0) continue;
    SCOPED_TRACE("section " + std::to_string(s.index));
    const std::string past = "malformed ELF file: section " + std::to_string(s.index) + " claims bytes up to ";
    Section longer = s;  // one byte too long
    longer.sh.sh_size = size - s.sh.sh_offset + 1;
    EXPECT_EQ(check_elf_file(with_section(longer)), past + std::to_string(size + 1) + ", the file has " + std::to_string(size));
    Section moved = s;  // starting at the end of the file
    moved.sh.sh_offset = size;
    EXPECT_EQ(check_elf_file(with_section(moved)),
              past + std::to_string(size + s.sh.sh_size) + ", the file has " + std::to_string(size));
    ++cases;
  }
  EXPECT_GE(cases, 10u) << "the dense plugin has fewer than 10 sections with file bytes?";
}

TEST_F(HostileElfSegments, EveryLoadedSectionOutsideItsSegmentIsRefused) {
  unsigned cases = 0;
  for (Section s : section_headers(image_)) {
    if (!(s.sh.sh_flags & SHF_ALLOC) || s.sh.sh_type == SHT_NOBITS || s.sh.sh_size == 0) continue;
    SCOPED_TRACE("section " + std::to_string(s.index));
    auto refusal = [&](const Section& bad) {
      return "malformed ELF file: section " + std::to_string(s.index) + " (loaded at " +
             hex(bad.sh.sh_addr) + ", " + std::to_string(bad.sh.sh_size) + " bytes from byte " +
             std::to_string(bad.sh.sh_offset) + ") is not where the loadable segments put it";
    };
    Section beyond = s;  // an address past the object's memory
    beyond.sh.sh_addr = image_end();
    EXPECT_EQ(check_elf_file(with_section(beyond)), refusal(beyond));
    Section shifted = s;  // in the file, one byte before where its segment maps its address
    shifted.sh.sh_offset -= 1;
    EXPECT_EQ(check_elf_file(with_section(shifted)), refusal(shifted));
    ++cases;
  }
  EXPECT_GE(cases, 8u) << "the dense plugin has fewer than 8 loaded sections?";
}

// Every address in the dynamic section that glibc follows, moved past the object's memory.
TEST_F(HostileElfSegments, EveryDynamicPointerOutsideTheObjectIsRefused) {
  const struct { Elf64_Sxword tag; const char* name; } pointers[] = {
      {DT_STRTAB, "DT_STRTAB"},     {DT_SYMTAB, "DT_SYMTAB"},         {DT_HASH, "DT_HASH"},
      {DT_GNU_HASH, "DT_GNU_HASH"}, {DT_RELA, "DT_RELA"},             {DT_JMPREL, "DT_JMPREL"},
      {DT_INIT, "DT_INIT"},         {DT_FINI, "DT_FINI"},             {DT_INIT_ARRAY, "DT_INIT_ARRAY"},
      {DT_FINI_ARRAY, "DT_FINI_ARRAY"}, {DT_PREINIT_ARRAY, "DT_PREINIT_ARRAY"},
      {DT_PLTGOT, "DT_PLTGOT"},     {DT_VERSYM, "DT_VERSYM"},         {DT_VERNEED, "DT_VERNEED"},
      {DT_VERDEF, "DT_VERDEF"}};
  const uint64_t outside = image_end() + 0x1000;
  unsigned cases = 0;
  for (const auto& p : pointers)
    for (const DynamicEntry& e : dynamic_entries(image_, p.tag)) {
      SCOPED_TRACE(p.name);
      const std::string why = check_elf_file(with_pointer(e, outside));
      EXPECT_THAT(why, HasSubstr(std::string("malformed dynamic section: ") + p.name + " at " + hex(outside) + " ("));
      EXPECT_THAT(why, HasSubstr(") lies outside the loadable segments"));
      ++cases;
    }
  EXPECT_GE(cases, 8u) << "the dense plugin has fewer than 8 of these dynamic entries?";
}

}  // namespace
