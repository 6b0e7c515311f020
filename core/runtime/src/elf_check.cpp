// check_elf_file (loader.hpp): what can be validated of a shared object before dlopen. glibc's
// loader trusts the file's headers and its dynamic section: a byte-flipped DT_STRTAB or a
// relocation pointing outside the object makes dlopen itself crash. Every check here reads the
// file with bounded reads; nothing is mapped or executed.
#include <elf.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "sieve/runtime/loader.hpp"

namespace sieve::runtime {

namespace fs = std::filesystem;

namespace {

#if defined(__x86_64__)
constexpr uint16_t kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kHostMachine = EM_AARCH64;
#elif defined(__powerpc64__)
constexpr uint16_t kHostMachine = EM_PPC64;
#else
constexpr uint16_t kHostMachine = EM_NONE;  // unknown: skip the architecture check
#endif
constexpr unsigned char kHostByteOrder =
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;

// Limits far above what a linker writes for a plugin; beyond them the file is not one.
constexpr unsigned kMaxProgramHeaders = 256;
constexpr uint64_t kMaxDynamicEntries = 4096;
constexpr uint64_t kMaxRelocations = uint64_t(1) << 24;
constexpr size_t kMaxDynamicString = 4096;  // a DT_NEEDED name or a DT_RUNPATH

std::string printable_prefix(const unsigned char* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n && i < 16; ++i) s += (p[i] >= 32 && p[i] < 127) ? char(p[i]) : '.';
  return s;
}

std::string num(uint64_t v) { return std::to_string(v); }
std::string hex(uint64_t v) {
  char b[24];
  std::snprintf(b, sizeof b, "0x%llx", static_cast<unsigned long long>(v));
  return b;
}

class ElfFile {
 public:
  ElfFile(const std::string& path, uint64_t size) : in_(path, std::ios::binary), size_(size) {}
  bool open() const { return bool(in_); }
  uint64_t size() const { return size_; }
  bool past_end(uint64_t off, uint64_t len) const { return off > size_ || len > size_ - off; }
  // Reads exactly len bytes at off; false when they are not all in the file.
  bool read(uint64_t off, void* to, uint64_t len) {
    if (past_end(off, len)) return false;
    in_.clear();
    in_.seekg(std::streamoff(off));
    in_.read(static_cast<char*>(to), std::streamsize(len));
    return uint64_t(in_.gcount()) == len;
  }
  size_t read_some(void* to, size_t len) {
    in_.read(static_cast<char*>(to), std::streamsize(len));
    return size_t(in_.gcount());
  }

 private:
  std::ifstream in_;
  uint64_t size_;
};

// The loadable segments: where a virtual address lives in the file and in memory.
struct Segments {
  std::vector<Elf64_Phdr> load;
  // The segment holding [vaddr, vaddr + len) whole, with at least the permissions in `flags`.
  const Elf64_Phdr* holding(uint64_t vaddr, uint64_t len, uint32_t flags = 0) const {
    for (const auto& p : load)
      if (vaddr >= p.p_vaddr && vaddr - p.p_vaddr <= p.p_memsz &&
          len <= p.p_memsz - (vaddr - p.p_vaddr) && (p.p_flags & flags) == flags)
        return &p;
    return nullptr;
  }
  // The file offset of [vaddr, vaddr + len) when it is backed by file bytes, else UINT64_MAX.
  uint64_t file_offset(uint64_t vaddr, uint64_t len) const {
    const Elf64_Phdr* p = holding(vaddr, len);
    if (!p || vaddr - p->p_vaddr + len > p->p_filesz) return UINT64_MAX;
    return p->p_offset + (vaddr - p->p_vaddr);
  }
};

std::string check_headers(ElfFile& f, const Elf64_Ehdr& eh, Segments* seg, Elf64_Phdr* dynamic) {
  const std::string size = " (" + num(f.size()) + " bytes)";
  if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum == 0 || eh.e_phnum > kMaxProgramHeaders)
    return "malformed ELF header: " + num(eh.e_phnum) + " program headers of " +
           num(eh.e_phentsize) + " bytes";
  if (f.past_end(eh.e_phoff, uint64_t(eh.e_phnum) * sizeof(Elf64_Phdr)))
    return "truncated ELF file: program headers reach past its end" + size;
  uint64_t claimed_end = eh.e_phoff + uint64_t(eh.e_phnum) * sizeof(Elf64_Phdr);
  if (eh.e_shnum) {
    if (eh.e_shentsize != sizeof(Elf64_Shdr))
      return "malformed ELF header: section headers of " + num(eh.e_shentsize) + " bytes";
    if (f.past_end(eh.e_shoff, uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr)))
      return "truncated ELF file: section headers at byte " + num(eh.e_shoff) +
             " lie past its end" + size;
    if (eh.e_shstrndx >= eh.e_shnum)
      return "malformed ELF header: section name table index " + num(eh.e_shstrndx) + " of " +
             num(eh.e_shnum) + " sections";
    claimed_end = std::max(claimed_end, eh.e_shoff + uint64_t(eh.e_shnum) * sizeof(Elf64_Shdr));
  }
  bool have_dynamic = false;
  unsigned last_load = 0;  // the program header index of seg->load.back()
  std::vector<Elf64_Phdr> relro;
  for (unsigned i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    if (!f.read(eh.e_phoff + uint64_t(i) * sizeof ph, &ph, sizeof ph))
      return "truncated ELF file: unreadable program header";
    if (ph.p_type == PT_GNU_RELRO) relro.push_back(ph);
    if (ph.p_type != PT_LOAD && ph.p_type != PT_DYNAMIC) continue;
    if (f.past_end(ph.p_offset, ph.p_filesz))
      return "truncated ELF file: segment " + num(i) + " ends at byte " +
             num(ph.p_offset + ph.p_filesz) + ", the file has " + num(f.size());
    claimed_end = std::max(claimed_end, ph.p_offset + ph.p_filesz);
    if (ph.p_type == PT_LOAD) {
      if (ph.p_filesz > ph.p_memsz || (ph.p_align & (ph.p_align - 1)) ||
          ph.p_vaddr + ph.p_memsz < ph.p_vaddr)
        return "malformed ELF file: loadable segment " + num(i) + " has inconsistent sizes";
      // glibc reserves the object's address range from the first loadable segment's start to the
      // LAST one's end (the gABI lists them ascending and disjoint) and then maps each segment,
      // zero-fill included, at a fixed address: a segment reaching past the next one's start
      // (a byte-flipped p_memsz) or listed out of order is mapped over whatever the host has
      // beyond the reservation — its heap, seen under ASan — and the host dies later, not dlopen.
      if (!seg->load.empty()) {
        const Elf64_Phdr& prev = seg->load.back();
        if (ph.p_vaddr < prev.p_vaddr + prev.p_memsz)
          return "malformed ELF file: loadable segment " + num(last_load) + " (p_vaddr " +
                 hex(prev.p_vaddr) + ", p_memsz " + hex(prev.p_memsz) + ") reaches past the start "
                 "of the next loadable segment " + num(i) + " (p_vaddr " + hex(ph.p_vaddr) +
                 "): the loader would map it over memory outside the library";
      }
      seg->load.push_back(ph);
      last_load = i;
    } else {
      if (have_dynamic) return "malformed ELF file: two dynamic segments";
      have_dynamic = true;
      *dynamic = ph;
    }
  }
  if (seg->load.empty()) return "malformed ELF file: no loadable segment";
  if (!have_dynamic) return "not a dynamically loadable object (no dynamic segment)";
  // glibc write-protects the RELRO range after relocating, wherever it points.
  for (const auto& r : relro)
    if (!seg->holding(r.p_vaddr, r.p_memsz))
      return "malformed ELF file: PT_GNU_RELRO (p_vaddr " + hex(r.p_vaddr) + ", p_memsz " +
             hex(r.p_memsz) + ") lies outside the loadable segments: the loader would "
             "write-protect memory outside the library";
  for (unsigned i = 0; i < eh.e_shnum; ++i) {
    Elf64_Shdr sh{};
    if (!f.read(eh.e_shoff + uint64_t(i) * sizeof sh, &sh, sizeof sh))
      return "truncated ELF file: unreadable section header";
    if (sh.sh_type == SHT_NOBITS || sh.sh_type == SHT_NULL) continue;
    if (f.past_end(sh.sh_offset, sh.sh_size))
      return "malformed ELF file: section " + num(i) + " claims bytes up to " +
             num(sh.sh_offset + sh.sh_size) + ", the file has " + num(f.size());
    claimed_end = std::max(claimed_end, sh.sh_offset + sh.sh_size);
    // glibc maps segments and never reads a section header, so a damaged one cannot mislead
    // dlopen; but a linker derives a loaded section's address and file offset from the segment
    // that holds it, and a section that disagrees with the segments means the headers were
    // damaged, as the size mismatch below does.
    if ((sh.sh_flags & SHF_ALLOC) && sh.sh_size && seg->file_offset(sh.sh_addr, sh.sh_size) != sh.sh_offset)
      return "malformed ELF file: section " + num(i) + " (loaded at " + hex(sh.sh_addr) + ", " +
             num(sh.sh_size) + " bytes from byte " + num(sh.sh_offset) +
             ") is not where the loadable segments put it";
  }
  // Linkers and strip write the section headers last: bytes beyond what the headers describe
  // mean the file was extended or its header offsets were damaged.
  if (eh.e_shnum && claimed_end != f.size())
    return "malformed ELF file: its headers describe " + num(claimed_end) + " bytes, the file has " +
           num(f.size());
  return {};
}

// The dynamic section: every address dlopen will follow lies in a loadable segment, every table
// has the entry size glibc assumes, every string offset lies in the string table, and every
// relocation writes inside the object.
std::string check_dynamic(ElfFile& f, const Segments& seg, const Elf64_Phdr& dynamic) {
  if (dynamic.p_filesz % sizeof(Elf64_Dyn) || dynamic.p_filesz / sizeof(Elf64_Dyn) > kMaxDynamicEntries)
    return "malformed dynamic section: " + num(dynamic.p_filesz) + " bytes";
  if (!seg.holding(dynamic.p_vaddr, dynamic.p_memsz))
    return "malformed dynamic section: not inside a loadable segment";
  std::vector<Elf64_Dyn> dyn(dynamic.p_filesz / sizeof(Elf64_Dyn));
  if (!f.read(dynamic.p_offset, dyn.data(), dynamic.p_filesz))
    return "truncated ELF file: unreadable dynamic section";
  uint64_t value[DT_NUM] = {};
  bool has[DT_NUM] = {};
  bool terminated = false;
  std::vector<std::pair<const char*, uint64_t>> strings;  // DT_NEEDED & co: string offsets
  uint64_t gnu_hash = 0, versym = 0, verneed = 0, verdef = 0;
  for (const auto& d : dyn) {
    if (d.d_tag == DT_NULL) {
      terminated = true;
      break;
    }
    if (d.d_tag >= 0 && d.d_tag < DT_NUM) {
      value[d.d_tag] = d.d_un.d_val;
      has[d.d_tag] = true;
    }
    switch (d.d_tag) {
      case DT_NEEDED: strings.push_back({"DT_NEEDED", d.d_un.d_val}); break;
      case DT_SONAME: strings.push_back({"DT_SONAME", d.d_un.d_val}); break;
      case DT_RPATH: strings.push_back({"DT_RPATH", d.d_un.d_val}); break;
      case DT_RUNPATH: strings.push_back({"DT_RUNPATH", d.d_un.d_val}); break;
      case DT_GNU_HASH: gnu_hash = d.d_un.d_ptr; break;
      case DT_VERSYM: versym = d.d_un.d_ptr; break;
      case DT_VERNEED: verneed = d.d_un.d_ptr; break;
      case DT_VERDEF: verdef = d.d_un.d_ptr; break;
      default: break;
    }
  }
  if (!terminated) return "malformed dynamic section: no DT_NULL terminator";
  if (!has[DT_STRTAB] || !has[DT_SYMTAB] || !has[DT_STRSZ] || (!has[DT_HASH] && !gnu_hash))
    return "malformed dynamic section: no string table, symbol table or hash table";
  auto in_load = [&](const char* what, uint64_t addr, uint64_t len) -> std::string {
    if (seg.holding(addr, len)) return {};
    return std::string("malformed dynamic section: ") + what + " at " + hex(addr) + " (" +
           num(len) + " bytes) lies outside the loadable segments";
  };
  const struct { int tag, size_tag; const char* name; } tables[] = {
      {DT_STRTAB, DT_STRSZ, "DT_STRTAB"},         {DT_SYMTAB, -1, "DT_SYMTAB"},
      {DT_HASH, -1, "DT_HASH"},                   {DT_RELA, DT_RELASZ, "DT_RELA"},
      {DT_JMPREL, DT_PLTRELSZ, "DT_JMPREL"},      {DT_INIT, -1, "DT_INIT"},
      {DT_FINI, -1, "DT_FINI"},                   {DT_INIT_ARRAY, DT_INIT_ARRAYSZ, "DT_INIT_ARRAY"},
      {DT_FINI_ARRAY, DT_FINI_ARRAYSZ, "DT_FINI_ARRAY"},
      {DT_PREINIT_ARRAY, DT_PREINIT_ARRAYSZ, "DT_PREINIT_ARRAY"}, {DT_PLTGOT, -1, "DT_PLTGOT"}};
  for (const auto& t : tables) {
    if (!has[t.tag]) continue;
    const uint64_t len = t.size_tag >= 0 ? value[t.size_tag] : 1;
    if (auto why = in_load(t.name, value[t.tag], len); !why.empty()) return why;
  }
  // What glibc calls, at load and at the host's exit (after any probe): DT_INIT and DT_FINI are
  // code; the init/fini arrays hold addresses the loader relocates, so a linker puts them in a
  // writable segment (unless the object has text relocations). A flipped DT_FINI_ARRAY pointing
  // into read-only data made the host call rodata bytes at exit.
  const bool textrel = has[DT_TEXTREL] || (has[DT_FLAGS] && (value[DT_FLAGS] & DF_TEXTREL));
  for (const auto& t : tables) {
    const bool code = t.tag == DT_INIT || t.tag == DT_FINI;
    const bool array = t.tag == DT_INIT_ARRAY || t.tag == DT_FINI_ARRAY || t.tag == DT_PREINIT_ARRAY;
    if (!has[t.tag] || !(code || (array && !textrel))) continue;
    const uint64_t len = t.size_tag >= 0 ? value[t.size_tag] : 1;
    if (!seg.holding(value[t.tag], len, code ? PF_X : PF_W))
      return std::string("malformed dynamic section: ") + t.name + " at " + hex(value[t.tag]) +
             (code ? " is not in an executable loadable segment: the loader would call it"
                   : " is not in a writable loadable segment: the loader would call the "
                     "unrelocated bytes it finds there");
  }
  for (auto [name, addr] : {std::pair{"DT_GNU_HASH", gnu_hash}, {"DT_VERSYM", versym},
                            {"DT_VERNEED", verneed}, {"DT_VERDEF", verdef}})
    if (addr)
      if (auto why = in_load(name, addr, 1); !why.empty()) return why;
  if (has[DT_SYMENT] && value[DT_SYMENT] != sizeof(Elf64_Sym))
    return "malformed dynamic section: DT_SYMENT " + num(value[DT_SYMENT]);
  if (has[DT_RELAENT] && value[DT_RELAENT] != sizeof(Elf64_Rela))
    return "malformed dynamic section: DT_RELAENT " + num(value[DT_RELAENT]);
  if (has[DT_REL] || has[DT_RELSZ]) return "malformed dynamic section: DT_REL on a RELA target";
  if (has[DT_JMPREL] && (!has[DT_PLTREL] || value[DT_PLTREL] != DT_RELA))
    return "malformed dynamic section: DT_PLTREL is not DT_RELA";

  // The string table: file-backed, and every name dlopen reads from it ends inside it.
  const uint64_t strsz = value[DT_STRSZ];
  const uint64_t stroff = seg.file_offset(value[DT_STRTAB], strsz);
  if (stroff == UINT64_MAX) return "malformed dynamic section: DT_STRTAB is not backed by the file";
  for (auto [what, off] : strings) {
    if (off >= strsz) return std::string("malformed dynamic section: ") + what + " offset " +
                             num(off) + " is past the string table (" + num(strsz) + " bytes)";
    char text[kMaxDynamicString];
    const uint64_t len = std::min<uint64_t>(strsz - off, sizeof text);
    if (!f.read(stroff + off, text, len) || !std::memchr(text, 0, len))
      return std::string("malformed dynamic section: ") + what + " string is not terminated";
  }

  // Relocations: each writes inside a loadable segment (glibc applies them without checking).
  for (auto [table, size_tag] : {std::pair{DT_RELA, DT_RELASZ}, {DT_JMPREL, DT_PLTRELSZ}}) {
    if (!has[table]) continue;
    const uint64_t bytes = value[size_tag];
    if (bytes % sizeof(Elf64_Rela) || bytes / sizeof(Elf64_Rela) > kMaxRelocations)
      return "malformed dynamic section: relocation table of " + num(bytes) + " bytes";
    const uint64_t off = seg.file_offset(value[table], bytes);
    if (off == UINT64_MAX) return "malformed dynamic section: relocations not backed by the file";
    std::vector<Elf64_Rela> rela(bytes / sizeof(Elf64_Rela));
    if (!f.read(off, rela.data(), bytes)) return "truncated ELF file: unreadable relocations";
    for (size_t i = 0; i < rela.size(); ++i)
      if (!seg.holding(rela[i].r_offset, sizeof(uint64_t)))
        return "malformed relocation " + num(i) + ": writes to " + hex(rela[i].r_offset) +
               ", outside the object";
  }
  return {};
}

}  // namespace

std::string check_elf_file(const std::string& path) {
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return "no such file";
  if (!fs::is_regular_file(st)) return "not a regular file";
  const uint64_t size = fs::file_size(path, ec);
  if (ec) return "cannot read its size: " + ec.message();

  ElfFile f(path, size);
  if (!f.open()) return "cannot open it for reading";
  Elf64_Ehdr eh{};
  const size_t got = f.read_some(&eh, sizeof eh);
  if (got < SELFMAG || std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0)
    return "not an ELF shared library (file starts with '" +
           printable_prefix(eh.e_ident, got) + "')";
  if (eh.e_ident[EI_CLASS] != ELFCLASS64) return "not a 64-bit ELF file";
  if (got < sizeof eh)
    return "truncated ELF file (" + num(size) + " bytes, shorter than its header)";
  if (eh.e_ident[EI_DATA] != kHostByteOrder || eh.e_ident[EI_VERSION] != EV_CURRENT ||
      eh.e_version != EV_CURRENT || eh.e_ehsize != sizeof eh)
    return "malformed ELF header (byte order, version or header size)";
  if (eh.e_type != ET_DYN) return "not an ELF shared object (e_type " + num(eh.e_type) + ")";
  if (kHostMachine != EM_NONE && eh.e_machine != kHostMachine)
    return "built for ELF machine " + num(eh.e_machine) + ", this host is " + num(kHostMachine);
  Segments seg;
  Elf64_Phdr dynamic{};
  if (auto why = check_headers(f, eh, &seg, &dynamic); !why.empty()) return why;
  return check_dynamic(f, seg, dynamic);
}

}  // namespace sieve::runtime
