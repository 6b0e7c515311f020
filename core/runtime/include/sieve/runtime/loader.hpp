// Loading one plugin file: open the shared library, find the entry point, negotiate the ABI
// major, and check the table it hands back before anything else touches it.
//
// Lifetime: a LoadedPlugin shares ownership of its library (shared_ptr). The registry holds one
// reference and drops it only in its destructor, which a host runs after it has synchronised its
// devices and destroyed its policy instances; any object that keeps a copy of the LoadedPlugin
// (a resolved chain, a running instance) keeps the handle alive. Beyond that, a loaded plugin's
// code is pinned (RTLD_NODELETE) for the life of the process: the CUDA runtime does not survive
// a library with device code being unmapped and mapped again, and pinned code can never vanish
// under device work in flight. Dropping the last handle releases the handle, not the code.
//
// Every failure is one line that starts with the file name and names the symbol or the version
// involved. No exception escapes these functions.
#pragma once

#include <sieve/plugin.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace boost::dll {
class shared_library;  // kept out of the public headers: users need not see Boost.DLL
}

namespace sieve::runtime {

// An opened plugin file whose entry point was found, before negotiation.
struct PluginLibrary {
  std::string path;
  std::shared_ptr<boost::dll::shared_library> lib;
  sieve_plugin_entry_fn entry = nullptr;
  sieve_plugin_score_fn score = nullptr;  // optional export; nullptr when absent
};

// A negotiated plugin whose table passed the checks below.
struct LoadedPlugin {
  std::string path;
  std::shared_ptr<boost::dll::shared_library> lib;
  const sieve_plugin* table = nullptr;
  uint32_t plugin_major = 0;
  int32_t score = 0;       // sieve_plugin_score(), 0 when the plugin does not export it
  bool has_score = false;

  const char* name() const { return table ? table->name : ""; }
  const sieve_policy_api* policy() const { return table ? table->policy : nullptr; }
  const sieve_kv_store_api* kv_store() const { return table ? table->kv_store : nullptr; }
  const sieve_policy_descriptor* descriptor() const {
    return policy() ? policy()->descriptor : nullptr;
  }
  // The tools the plugin ships (ABI 1.1; none for a 1.0 table), as checked at load.
  std::vector<const sieve_tool*> tools() const;
  // The tool called `name`, nullptr when the plugin has none of that name.
  const sieve_tool* tool(const std::string& name) const;
};

// Pre-flight check of a file before dlopen (elf_check.cpp): exists, is a regular file, is an ELF
// shared object for this machine's class, byte order and architecture; its program and section
// header tables, segments and sections lie within the file and account for all of it; its
// loadable segments are listed ascending and disjoint in memory and PT_GNU_RELRO lies inside them
// (glibc maps and write-protects by them at fixed addresses, over the host's memory); its dynamic
// section is terminated, every table address it names (strings, symbols, hashes, relocations,
// init/fini arrays) lies in a loadable segment, string offsets lie in the string table, and every
// relocation writes inside the object. glibc's dlopen trusts all of this and can die of SIGSEGV
// or SIGBUS instead of failing. Returns "" when the file looks loadable, else the reason (without
// the file name). What it cannot see (damaged code, constructors) discovery's probe process
// catches (registry.hpp).
std::string check_elf_file(const std::string& path);

// Bounds on what a plugin table declares: a count or a string beyond them refuses the plugin
// with the reason, before anything iterates over it.
inline constexpr uint32_t kMaxParams = 256;         // sieve_policy_api::n_params
inline constexpr uint32_t kMaxListedSizes = 256;    // descriptor n_head_dims, n_page_sizes
inline constexpr size_t kMaxNameLength = 64;        // plugin, policy, KV store, parameter names
inline constexpr size_t kMaxTextLength = 4096;      // vendor, summary, doc, default, choices
inline constexpr uint32_t kMaxStructSize = 65536;   // any struct_size (later minors grow them)
inline constexpr int32_t kMaxPageSize = 65536;      // tokens per page a KV store may list
inline constexpr uint32_t kMaxTools = 64;           // sieve_plugin::n_tools

// A plugin-supplied string for a message: at most `max` bytes of it ("(null)" for NULL, "..."
// appended when cut), never reading past them.
std::string bounded_text(const char* s, size_t max = kMaxNameLength);
// s is non-NULL and not terminated within kMaxTextLength bytes.
bool text_too_long(const char* s);
// Empty when s is non-NULL, non-empty and terminated within kMaxTextLength bytes, else why not
// ("empty", "over-long (> 4096 bytes)").
std::string text_problem(const char* s);
// Empty when is_identifier(name), else "'Name' does not match [a-z0-9_]+" or "'...' is longer
// than 64 bytes".
std::string identifier_problem(const char* name);

// What happens to an opened library when the last PluginLibrary / LoadedPlugin holding it goes:
// `never`: it stays mapped for the life of the process (loader.cpp says why) and its finalisers
// run at the process's exit; `on_release`: dlclose unmaps it and runs its finalisers then (the
// probe process, to run in the child what the host would run at its exit).
enum class Unload { never, on_release };

// check_elf_file + dlopen (RTLD_NOW | RTLD_LOCAL) + look up the entry and score symbols.
bool open_plugin_library(const std::string& path, PluginLibrary* out, std::string* error,
                         Unload unload = Unload::never);

// Call the entry point offering `host_major`, check the answer and the table.
bool negotiate_plugin(const PluginLibrary& library, LoadedPlugin* out, std::string* error,
                      uint32_t host_major = SIEVE_ABI_MAJOR);

// open_plugin_library + negotiate_plugin. A different host_major lets conformance offer a
// major the plugin lacks.
bool load_plugin(const std::string& path, LoadedPlugin* out, std::string* error,
                 uint32_t host_major = SIEVE_ABI_MAJOR);

// Structural checks of what a plugin hands back; each returns every problem found (empty: fine).
// They read only what the header sizes say is there and never call into the plugin.
//  - header: struct_size covers the v1.0 fields, abi_major == the negotiated major, a
//    [a-z0-9_]+ name, at least one of policy / kv_store;
//  - every table: struct_size at least the v1.0 size and at most kMaxStructSize;
//  - policy table: size, required functions (validate, create, destroy, last_error), at least
//    one hook, a descriptor, params non-NULL when n_params > 0, n_params <= kMaxParams;
//  - descriptor: size, [a-z0-9_]+ name equal to the plugin's, vendor, summary, known and non-zero
//    phase/device/dtype bits, head-dim and page-size arrays (at most kMaxListedSizes), selection heads, needs bits, CUDA-graph
//    level, evicts_kv => end_step, page stats => observe and select;
//  - kv store: size, name, required functions; ABI 1.1 (when the table reaches them): the
//    parameter schema (check_schema), the descriptor below;
//  - kv store descriptor: size, [a-z0-9_]+ name, vendor, summary, known and non-zero device /
//    dtype / layout bits, known feature bits, page sizes in [1, kMaxPageSize]; with `api`, every
//    declared feature reachable (SIDECARS => register_sidecar + sidecar, EVICTION => evict,
//    ENGINE_PAGES => bind_pages);
//  - tools (ABI 1.1, read only when the table's size reaches them): n_tools <= kMaxTools, the
//    array non-NULL when n_tools > 0, every entry the same struct_size between the v1.1 size and
//    kMaxStructSize, a unique [a-z0-9_-]+ name, a summary, run non-NULL;
//  - plugin table: all of the above plus check_schema (params.hpp): what the loader refuses.
std::vector<std::string> check_plugin_header(const sieve_plugin* table, uint32_t expected_major);
std::vector<std::string> check_policy_table(const sieve_policy_api* api);
std::vector<std::string> check_policy_descriptor(const sieve_policy_descriptor* d,
                                                 const sieve_policy_api* api,
                                                 const char* plugin_name);
std::vector<std::string> check_kv_store_api(const sieve_kv_store_api* api);
std::vector<std::string> check_kv_store_descriptor(const sieve_kv_store_descriptor* d,
                                                   const sieve_kv_store_api* api);
std::vector<std::string> check_tools(const sieve_plugin* table);
std::vector<std::string> check_plugin_table(const sieve_plugin* table, uint32_t expected_major);


// Is `name` a valid policy / parameter name: [a-z0-9_]+, at most kMaxNameLength bytes.
bool is_identifier(const char* name);
// Is `name` a valid tool name: [a-z0-9_-]+ (a command word: "distill-gate"), at most
// kMaxNameLength bytes.
bool is_tool_name(const char* name);

}  // namespace sieve::runtime
