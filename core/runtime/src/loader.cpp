// Plugin loading: ELF pre-flight (elf_check.cpp), dlopen through Boost.DLL, entry-point
// negotiation, table checks.
#include "sieve/runtime/loader.hpp"
#include "sieve/util/abi_v1_0.hpp"
#include "sieve/util/status.hpp"

#include <dlfcn.h>

#include <boost/dll/shared_library.hpp>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <type_traits>

#include "sieve/runtime/params.hpp"

namespace sieve::runtime {

namespace fs = std::filesystem;

namespace {

std::string file_label(const std::string& path) { return fs::path(path).filename().string(); }

// "the entry point says": a short reason from Boost.DLL's exception text.
std::string dl_reason(const std::exception& e) {
  std::string w = e.what();
  const std::string tag = "(dlerror system message: ";
  size_t at = w.find(tag);
  if (at != std::string::npos) {
    std::string msg = w.substr(at + tag.size());
    if (!msg.empty() && msg.back() == ')') msg.pop_back();
    return msg;
  }
  return w;
}

// Positive "sized" checks that read a table only as far as its header says it reaches.
std::string hex(uint32_t v) {
  char b[16];
  std::snprintf(b, sizeof b, "0x%x", v);
  return b;
}

using util::v1_0_size;

template <class T>
std::string size_problem(const T* p, const char* what) {
  if (p->hdr.struct_size < v1_0_size<T>())
    return std::string(what) + " struct_size " + std::to_string(p->hdr.struct_size) +
           " is smaller than the v1.0 size " + std::to_string(v1_0_size<T>());
  if (p->hdr.struct_size > kMaxStructSize)
    return std::string(what) + " struct_size " + std::to_string(p->hdr.struct_size) +
           " exceeds the limit " + std::to_string(kMaxStructSize);
  return {};
}

}  // namespace

namespace {
// [a-z0-9_]+ plus the characters in `extra`, at most kMaxNameLength bytes (never read past them).
bool is_name(const char* name, const char* extra) {
  if (!name || !*name) return false;
  size_t n = 0;
  for (const char* c = name; *c; ++c, ++n)
    if (n == kMaxNameLength ||
        !((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_' ||
          (*extra && std::strchr(extra, *c))))
      return false;
  return true;
}

// Entry i of a plugin's tool array, walked by the first entry's struct_size (check_tools makes
// every entry that size).
const sieve_tool* tool_at(const sieve_plugin* t, uint32_t i) {
  const auto* base = reinterpret_cast<const unsigned char*>(t->tools);
  return reinterpret_cast<const sieve_tool*>(base + size_t(i) * t->tools->hdr.struct_size);
}

bool has_tools(const sieve_plugin* t) {
  return t && SIEVE_HAS_FIELD(t, sieve_plugin, n_tools) && t->n_tools > 0 && t->tools;
}
}  // namespace

bool is_identifier(const char* name) { return is_name(name, ""); }
bool is_tool_name(const char* name) { return is_name(name, "-"); }

std::vector<const sieve_tool*> LoadedPlugin::tools() const {
  std::vector<const sieve_tool*> out;
  if (has_tools(table))
    for (uint32_t i = 0; i < table->n_tools; ++i) out.push_back(tool_at(table, i));
  return out;
}

const sieve_tool* LoadedPlugin::tool(const std::string& name) const {
  for (const sieve_tool* t : tools())
    if (name == t->name) return t;
  return nullptr;
}

std::string bounded_text(const char* s, size_t max) {
  if (!s) return "(null)";
  const size_t n = strnlen(s, max + 1);
  return n > max ? std::string(s, max) + "..." : std::string(s, n);
}

bool text_too_long(const char* s) { return s && strnlen(s, kMaxTextLength + 1) > kMaxTextLength; }

std::string text_problem(const char* s) {
  if (!s || !*s) return "empty";
  if (text_too_long(s)) return "over-long (> " + std::to_string(kMaxTextLength) + " bytes)";
  return {};
}

namespace {
// "'Name' does not match <pattern>" or "'...' is longer than 64 bytes"; "" when `ok`.
std::string name_problem(const char* name, bool ok, const char* pattern) {
  if (ok) return {};
  std::string out = "'";
  out += bounded_text(name);
  if (name && strnlen(name, kMaxNameLength + 1) > kMaxNameLength)
    return out + "' is longer than " + std::to_string(kMaxNameLength) + " bytes";
  return out + "' does not match " + pattern;
}
}  // namespace

std::string identifier_problem(const char* name) {
  return name_problem(name, is_identifier(name), "[a-z0-9_]+");
}

bool open_plugin_library(const std::string& path, PluginLibrary* out, std::string* error, Unload unload) {
  const std::string file = file_label(path);
  if (std::string why = check_elf_file(path); !why.empty()) {
    *error = file + ": " + why;
    return false;
  }
  auto lib = std::make_shared<boost::dll::shared_library>();
  try {
    // RTLD_NOW: an unresolved symbol fails here, with its name, not at the first call.
    lib->load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    *error = file + ": cannot load: " + dl_reason(e);
    return false;
  }
  if (!lib->has(SIEVE_PLUGIN_ENTRY_SYMBOL)) {
    *error = file + ": no symbol '" SIEVE_PLUGIN_ENTRY_SYMBOL "' (not a Sieve plugin)";
    return false;
  }
  PluginLibrary p;
  p.path = path;
  try {
    p.entry = &lib->get<std::remove_pointer_t<sieve_plugin_entry_fn>>(SIEVE_PLUGIN_ENTRY_SYMBOL);
    if (lib->has(SIEVE_PLUGIN_SCORE_SYMBOL))
      p.score = &lib->get<std::remove_pointer_t<sieve_plugin_score_fn>>(SIEVE_PLUGIN_SCORE_SYMBOL);
  } catch (const std::exception& e) {
    *error = file + ": symbol lookup failed: " + dl_reason(e);
    return false;
  }
  // Pin the plugin's code for the life of the process (RTLD_NODELETE on the already-loaded
  // object): a library with CUDA kernels registers its fatbinary with the CUDA runtime when it is
  // mapped, and unloading then re-loading it (a registry destroyed and rebuilt) makes its kernels
  // crash at launch — seen on an H200 when streaming was loaded and unloaded before CUDA was
  // initialised. Pinned code also can never vanish under device work still in flight.
  if (unload == Unload::never)
    if (void* pin = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE)) ::dlclose(pin);
  p.lib = std::move(lib);
  *out = std::move(p);
  return true;
}

bool negotiate_plugin(const PluginLibrary& library, LoadedPlugin* out, std::string* error,
                      uint32_t host_major) {
  const std::string file = file_label(library.path);
  // Sentinels show whether the plugin wrote its answers.
  uint32_t plugin_major = UINT32_MAX;
  const sieve_plugin* table = nullptr;
  const sieve_status st = library.entry(host_major, &plugin_major, &table);
  const std::string both = "ABI major " + std::to_string(plugin_major) + " (plugin) vs " +
                           std::to_string(host_major) + " (host)";
  if (plugin_major == UINT32_MAX) {
    *error = file + ": " SIEVE_PLUGIN_ENTRY_SYMBOL " did not report the plugin's ABI major (host "
             "offered " + std::to_string(host_major) + ", status " + status_name(st) + ")";
    return false;
  }
  if (st != SIEVE_OK) {
    *error = file + ": " + both + ": the plugin cannot serve this host (" SIEVE_PLUGIN_ENTRY_SYMBOL
             " returned " + status_name(st) + ")";
    return false;
  }
  if (plugin_major != host_major) {
    // v1 hosts speak exactly one major; a plugin that answers another one cannot be used.
    *error = file + ": " + both + ": this host speaks only major " + std::to_string(host_major);
    return false;
  }
  if (!table) {
    *error = file + ": " SIEVE_PLUGIN_ENTRY_SYMBOL " returned SIEVE_OK but no table (" + both + ")";
    return false;
  }
  auto problems = check_plugin_table(table, plugin_major);
  if (!problems.empty()) {
    *error = file + ": " + problems.front();
    for (size_t i = 1; i < problems.size(); ++i) *error += "; " + problems[i];
    return false;
  }
  LoadedPlugin p;
  p.path = library.path;
  p.lib = library.lib;
  p.table = table;
  p.plugin_major = plugin_major;
  if (library.score) {
    p.score = library.score();
    p.has_score = true;
  }
  *out = std::move(p);
  return true;
}

bool load_plugin(const std::string& path, LoadedPlugin* out, std::string* error,
                 uint32_t host_major) {
  try {
    PluginLibrary lib;
    if (!open_plugin_library(path, &lib, error)) return false;
    return negotiate_plugin(lib, out, error, host_major);
  } catch (const std::exception& e) {  // std::bad_alloc and friends: still one line, no escape
    *error = file_label(path) + ": " + e.what();
    return false;
  }
}

std::vector<std::string> check_plugin_header(const sieve_plugin* t, uint32_t expected_major) {
  if (!t) return {"plugin table is NULL"};
  if (auto p = size_problem(t, "plugin table"); !p.empty()) return {p};
  std::vector<std::string> out;
  if (t->abi_major != expected_major)
    out.push_back("plugin table says ABI major " + std::to_string(t->abi_major) +
                  " but the entry point answered " + std::to_string(expected_major));
  if (!is_identifier(t->name))
    out.push_back("plugin name " + identifier_problem(t->name));
  if (!t->policy && !t->kv_store) out.push_back("plugin table has neither a policy nor a KV store");
  return out;
}

std::vector<std::string> check_plugin_table(const sieve_plugin* t, uint32_t expected_major) {
  auto out = check_plugin_header(t, expected_major);
  if (!out.empty()) return out;
  auto add = [&](std::vector<std::string> v) { out.insert(out.end(), v.begin(), v.end()); };
  if (t->policy) {
    add(check_policy_table(t->policy));
    if (t->policy->hdr.struct_size >= v1_0_size<sieve_policy_api>()) {
      if (t->policy->descriptor)
        add(check_policy_descriptor(t->policy->descriptor, t->policy, t->name));
      if (t->policy->params && t->policy->n_params <= kMaxParams)
        for (auto& s : check_schema(ParamSchema::of(*t->policy))) out.push_back("schema: " + s);
    }
  }
  if (t->kv_store) add(check_kv_store_api(t->kv_store));
  add(check_tools(t));
  return out;
}

std::vector<std::string> check_tools(const sieve_plugin* t) {
  // A 1.0 table (or one whose size stops short of the tools) ships none: nothing to read.
  if (!t || !SIEVE_HAS_FIELD(t, sieve_plugin, n_tools) || t->n_tools == 0) return {};
  if (t->n_tools > kMaxTools)
    return {"tools: n_tools " + std::to_string(t->n_tools) + " exceeds the limit " +
            std::to_string(kMaxTools)};
  if (!t->tools) return {"tools: n_tools is " + std::to_string(t->n_tools) + " but tools is NULL"};
  // sieve_tool is new in 1.1: its 1.1 size is the least a producer fills.
  const uint32_t stride = t->tools->hdr.struct_size;
  if (stride < sizeof(sieve_tool))
    return {"tool[0] struct_size " + std::to_string(stride) + " is smaller than the v1.1 size " +
            std::to_string(sizeof(sieve_tool))};
  if (stride > kMaxStructSize)
    return {"tool[0] struct_size " + std::to_string(stride) + " exceeds the limit " +
            std::to_string(kMaxStructSize)};
  std::vector<std::string> out;
  std::vector<std::string> seen;
  for (uint32_t i = 0; i < t->n_tools; ++i) {
    const sieve_tool* tool = tool_at(t, i);
    const std::string at = "tool[" + std::to_string(i) + "]";
    if (tool->hdr.struct_size != stride) {
      out.push_back(at + " struct_size " + std::to_string(tool->hdr.struct_size) +
                    " differs from tool[0]'s " + std::to_string(stride) + " (one array, one size)");
      continue;
    }
    if (!is_tool_name(tool->name)) {
      out.push_back(at + " name " + name_problem(tool->name, false, "[a-z0-9_-]+"));
    } else if (std::find(seen.begin(), seen.end(), tool->name) != seen.end()) {
      out.push_back(at + " name '" + std::string(tool->name) + "' is used twice");
    } else {
      seen.push_back(tool->name);
    }
    if (auto why = text_problem(tool->summary); !why.empty()) out.push_back(at + ": " + why + " summary");
    if (!tool->run) out.push_back(at + ": 'run' is NULL (required)");
  }
  return out;
}

std::vector<std::string> check_policy_table(const sieve_policy_api* api) {
  if (auto p = size_problem(api, "policy table"); !p.empty()) return {p};
  std::vector<std::string> out;
  const struct { const void* fn; const char* name; } required[] = {
      {reinterpret_cast<const void*>(api->validate), "validate"},
      {reinterpret_cast<const void*>(api->create), "create"},
      {reinterpret_cast<const void*>(api->destroy), "destroy"},
      {reinterpret_cast<const void*>(api->last_error), "last_error"}};
  for (auto& r : required)
    if (!r.fn) out.push_back(std::string("policy table: '") + r.name + "' is NULL (required)");
  if (!api->on_append && !api->select && !api->attend && !api->observe && !api->correct &&
      !api->end_step)
    out.push_back("policy table implements no hook (on_append, select, attend, observe, correct, "
                  "end_step are all NULL)");
  if (!api->descriptor) out.push_back("policy table: descriptor is NULL");
  if (api->n_params && !api->params)
    out.push_back("policy table: n_params is " + std::to_string(api->n_params) +
                  " but params is NULL");
  if (api->n_params > kMaxParams)
    out.push_back("policy table: n_params " + std::to_string(api->n_params) +
                  " exceeds the limit " + std::to_string(kMaxParams));
  return out;
}

std::vector<std::string> check_policy_descriptor(const sieve_policy_descriptor* d,
                                                 const sieve_policy_api* api,
                                                 const char* plugin_name) {
  if (auto p = size_problem(d, "descriptor"); !p.empty()) return {p};
  std::vector<std::string> out;
  auto bad = [&](const std::string& s) { out.push_back("descriptor: " + s); };
  if (!is_identifier(d->name))
    bad("name " + identifier_problem(d->name));
  else if (plugin_name && std::strcmp(d->name, plugin_name) != 0)
    bad("name '" + std::string(d->name) + "' differs from the plugin name '" + plugin_name + "'");
  if (auto why = text_problem(d->vendor); !why.empty()) bad(why + " vendor");
  if (auto why = text_problem(d->summary); !why.empty()) bad(why + " summary");
  auto bits = [&](uint32_t v, uint32_t known, const char* what) {
    if (v == 0) bad(std::string(what) + " is 0 (declare at least one)");
    else if (v & ~known) bad(std::string(what) + " has unknown bits " + hex(v & ~known));
  };
  bits(d->phases, SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE, "phases");
  bits(d->devices, SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA, "devices");
  bits(d->dtypes, SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16, "dtypes");
  auto sizes = [&](const int32_t* v, uint32_t n, const char* what) {
    if (n && !v) return bad(std::string(what) + ": n is " + std::to_string(n) + " but the array is NULL");
    if (n > kMaxListedSizes)
      return bad(std::string(what) + ": n is " + std::to_string(n) + ", beyond the limit " +
                 std::to_string(kMaxListedSizes));
    for (uint32_t i = 0; i < n; ++i)
      if (v[i] <= 0) return bad(std::string(what) + "[" + std::to_string(i) + "] = " +
                                std::to_string(v[i]) + " (must be > 0)");
  };
  sizes(d->head_dims, d->n_head_dims, "head_dims");
  sizes(d->page_sizes, d->n_page_sizes, "page_sizes");
  if (d->selection_heads > SIEVE_SEL_PER_Q_HEAD)
    bad("selection_heads " + std::to_string(d->selection_heads) + " is not a sieve_selection_heads");
  const uint32_t known_needs = SIEVE_NEEDS_PAGE_STATS | SIEVE_NEEDS_PRE_ROPE_K |
                               SIEVE_NEEDS_PRE_ROPE_Q | SIEVE_NEEDS_WEIGHTS_FILE |
                               SIEVE_NEEDS_SIDECARS;
  if (d->needs & ~known_needs) bad("needs has unknown bits");
  if (d->evicts_kv > 1) bad("evicts_kv must be 0 or 1");
  if (d->cuda_graph > SIEVE_CUDA_GRAPH_FULL)
    bad("cuda_graph " + std::to_string(d->cuda_graph) + " is not a sieve_cuda_graph_level");
  if (SIEVE_HAS_FIELD(d, sieve_policy_descriptor, selection_basis) &&
      d->selection_basis > SIEVE_SELECTION_BASIS_NONE)
    bad("selection_basis " + std::to_string(d->selection_basis) + " is not a sieve_selection_basis");
  if (SIEVE_HAS_FIELD(d, sieve_policy_descriptor, conform_params))
    if (text_too_long(d->conform_params))  // NULL or "" is allowed: the schema defaults
      bad("over-long (> " + std::to_string(kMaxTextLength) + " bytes) conform_params");
  if (api) {
    if (d->evicts_kv && !api->end_step) bad("evicts_kv is set but end_step is NULL");
    if ((d->needs & SIEVE_NEEDS_PAGE_STATS) && !api->observe)
      bad("needs page statistics but observe is NULL");
    if ((d->needs & SIEVE_NEEDS_PAGE_STATS) && !api->select)
      bad("needs page statistics but select (where statistics are requested) is NULL");
  }
  return out;
}

std::vector<std::string> check_kv_store_api(const sieve_kv_store_api* api) {
  if (auto p = size_problem(api, "KV store table"); !p.empty()) return {p};
  std::vector<std::string> out;
  if (auto why = text_problem(api->name); !why.empty()) out.push_back("KV store table: " + why + " name");
  const struct { const void* fn; const char* name; } required[] = {
      {reinterpret_cast<const void*>(api->create), "create"},
      {reinterpret_cast<const void*>(api->destroy), "destroy"},
      {reinterpret_cast<const void*>(api->last_error), "last_error"},
      {reinterpret_cast<const void*>(api->add_sequence), "add_sequence"},
      {reinterpret_cast<const void*>(api->remove_sequence), "remove_sequence"},
      {reinterpret_cast<const void*>(api->seq_len), "seq_len"},
      {reinterpret_cast<const void*>(api->append), "append"},
      {reinterpret_cast<const void*>(api->view), "view"},
      {reinterpret_cast<const void*>(api->bytes_in_use), "bytes_in_use"}};
  for (auto& r : required)
    if (!r.fn) out.push_back(std::string("KV store table: '") + r.name + "' is NULL (required)");
  // ABI 1.1: read only as far as the table's size says it reaches.
  if (SIEVE_HAS_FIELD(api, sieve_kv_store_api, n_params)) {
    if (api->n_params && !api->params)
      out.push_back("KV store table: n_params is " + std::to_string(api->n_params) + " but params is NULL");
    else if (api->n_params > kMaxParams)
      out.push_back("KV store table: n_params " + std::to_string(api->n_params) + " exceeds the limit " +
                    std::to_string(kMaxParams));
    else if (api->n_params)
      for (auto& p : check_schema(ParamSchema(api->params, api->n_params)))
        out.push_back("KV store schema: " + p);
  }
  if (SIEVE_HAS_FIELD(api, sieve_kv_store_api, descriptor) && api->descriptor) {
    for (auto& p : check_kv_store_descriptor(api->descriptor, api)) out.push_back(p);
  }
  return out;
}

std::vector<std::string> check_kv_store_descriptor(const sieve_kv_store_descriptor* d,
                                                   const sieve_kv_store_api* api) {
  if (auto p = size_problem(d, "KV store descriptor"); !p.empty()) return {p};
  std::vector<std::string> out;
  auto bad = [&](const std::string& s) { out.push_back("KV store descriptor: " + s); };
  if (!is_identifier(d->name)) bad("name " + identifier_problem(d->name));
  if (auto why = text_problem(d->vendor); !why.empty()) bad(why + " vendor");
  if (auto why = text_problem(d->summary); !why.empty()) bad(why + " summary");
  auto bits = [&](uint32_t v, uint32_t known, const char* what, bool nonzero) {
    if (nonzero && v == 0) bad(std::string(what) + " is 0 (declare at least one)");
    else if (v & ~known) bad(std::string(what) + " has unknown bits " + hex(v & ~known));
  };
  bits(d->devices, SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA, "devices", true);
  bits(d->dtypes, SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16, "dtypes", true);
  bits(d->layouts, SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED, "layouts", true);
  bits(d->features, SIEVE_KV_FEATURE_SIDECARS | SIEVE_KV_FEATURE_EVICTION | SIEVE_KV_FEATURE_PRE_ROPE_K |
                        SIEVE_KV_FEATURE_ENGINE_PAGES, "features", false);
  if (d->n_page_sizes && !d->page_sizes)
    bad("page_sizes: n is " + std::to_string(d->n_page_sizes) + " but the array is NULL");
  else if (d->n_page_sizes > kMaxListedSizes)
    bad("page_sizes: n is " + std::to_string(d->n_page_sizes) + ", beyond the limit " +
        std::to_string(kMaxListedSizes));
  else
    for (uint32_t i = 0; i < d->n_page_sizes; ++i)
      if (d->page_sizes[i] <= 0 || d->page_sizes[i] > kMaxPageSize) {
        bad("page_sizes[" + std::to_string(i) + "] = " + std::to_string(d->page_sizes[i]) +
            " (must be in [1, " + std::to_string(kMaxPageSize) + "])");
        break;
      }
  if (!api) return out;
  // A feature a policy may be granted must be reachable through the table.
  auto needs = [&](uint32_t bit, const char* feature, std::initializer_list<std::pair<const void*, const char*>> fns) {
    if (!(d->features & bit)) return;
    for (auto& [fn, name] : fns)
      if (!fn) bad(std::string("features has ") + feature + " but '" + name + "' is NULL");
  };
  needs(SIEVE_KV_FEATURE_SIDECARS, "SIDECARS",
        {{reinterpret_cast<const void*>(api->register_sidecar), "register_sidecar"},
         {reinterpret_cast<const void*>(api->sidecar), "sidecar"}});
  needs(SIEVE_KV_FEATURE_EVICTION, "EVICTION", {{reinterpret_cast<const void*>(api->evict), "evict"}});
  const bool has_bind = SIEVE_HAS_FIELD(api, sieve_kv_store_api, bind_pages) && api->bind_pages;
  needs(SIEVE_KV_FEATURE_ENGINE_PAGES, "ENGINE_PAGES",
        {{has_bind ? reinterpret_cast<const void*>(api->bind_pages) : nullptr, "bind_pages"}});
  return out;
}

}  // namespace sieve::runtime
