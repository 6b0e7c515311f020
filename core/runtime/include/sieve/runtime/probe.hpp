// Discovery's probe: before a plugin file is loaded into the host, it is loaded in a forked child
// process (check_elf_file, dlopen, the entry point, the table checks, then dlclose, running the
// finalisers the host would run at its exit; not sieve_plugin_score, which may touch a GPU). A
// file that crashes or hangs glibc's loader, its own constructors or finalisers or its entry
// point then costs a reason string instead of the host process. What a plugin does after it loaded
// cleanly is trusted (docs/abi.md, "What the host trusts").
#pragma once

#include <sieve/abi.h>

#include <cstdint>
#include <string>
#include <vector>

namespace sieve::runtime {

// For each file: "" when it loaded in the probe process (or is loaded in this one already, or no
// child could be forked: then the caller loads it unprobed, after a warning); otherwise why not,
// one line starting with the file name. One child loads the files in order; when it crashes or
// hangs (killed after 10 s per file it was given) in one, that file is refused and a new child
// goes on with the next.
// Answers are cached for the life of the process by (path, device, inode, size, mtime): a file
// replaced on disk is probed again.
std::vector<std::string> probe_plugin_files(const std::vector<std::string>& paths,
                                            uint32_t host_major = SIEVE_ABI_MAJOR);
std::string probe_plugin_file(const std::string& path, uint32_t host_major = SIEVE_ABI_MAJOR);

}  // namespace sieve::runtime
