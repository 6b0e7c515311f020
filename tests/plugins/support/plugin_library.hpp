// PluginLibrary: load a built plugin .so with plain dlopen/dlsym and negotiate its ABI major, so
// policy tests exercise the very binary a host loads, independently of the runtime's loader.
#pragma once
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sieve/sieve.h>

#include <string>

namespace sieve::testing {

class PluginLibrary {
 public:
  // `name` as in sieve_add_plugin(NAME ...): loads SIEVE_PLUGIN_DIR/libsieve_<name>.so.
  explicit PluginLibrary(const std::string& name)
      : path_(std::string(SIEVE_PLUGIN_DIR) + "/libsieve_" + name + ".so") {
    handle_ = dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      const char* e = dlerror();
      error_ = e ? e : "dlopen failed";
    }
  }
  ~PluginLibrary() {
    if (handle_) dlclose(handle_);
  }
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  bool loaded() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }
  const std::string& path() const { return path_; }
  void* symbol(const char* name) const { return handle_ ? dlsym(handle_, name) : nullptr; }
  sieve_plugin_entry_fn entry() const {
    return reinterpret_cast<sieve_plugin_entry_fn>(symbol(SIEVE_PLUGIN_ENTRY_SYMBOL));
  }

  // The plugin table for a host speaking `host_major`, or NULL after a test failure naming why.
  const sieve_plugin* negotiate(uint32_t host_major = SIEVE_ABI_MAJOR) const {
    sieve_plugin_entry_fn fn = entry();
    if (!fn) {
      ADD_FAILURE() << path_ << ": no " << SIEVE_PLUGIN_ENTRY_SYMBOL << " (" << error_ << ")";
      return nullptr;
    }
    uint32_t plugin_major = 0;
    const sieve_plugin* table = nullptr;
    if (sieve_status s = fn(host_major, &plugin_major, &table); s != SIEVE_OK || !table) {
      ADD_FAILURE() << path_ << ": entry refused host major " << host_major << " (status " << s
                    << ", plugin major " << plugin_major << ")";
      return nullptr;
    }
    return table;
  }

  // The policy table of a loaded, negotiated plugin (what a policy test's SetUp needs), or NULL
  // after a test failure naming why.
  const sieve_policy_api* policy(uint32_t host_major = SIEVE_ABI_MAJOR) const {
    if (!loaded()) {
      ADD_FAILURE() << path_ << ": " << error_;
      return nullptr;
    }
    const sieve_plugin* table = negotiate(host_major);
    if (table && !table->policy) ADD_FAILURE() << path_ << ": the plugin has no policy table";
    return table ? table->policy : nullptr;
  }

 private:
  std::string path_;
  std::string error_;
  void* handle_ = nullptr;
};

// api->create on `services` with these parameter values and no KV store: the policy, or NULL
// after a test failure "<what> = <status>: <the plugin's reason>".
inline sieve_policy* create_or_fail(const sieve_policy_api* api, const sieve_host_services* services,
                                    const sieve_geometry& g, const sieve_param_value* values, uint32_t n_values,
                                    const std::string& what = "create") {
  sieve_policy* p = nullptr;
  std::string reason;
  const sieve_reason_sink sink{&reason, [](void* ctx, const char* m) { *static_cast<std::string*>(ctx) += m; }};
  const sieve_status s = api->create(services, &g, values, n_values, nullptr, nullptr, &p, sink);
  if (s != SIEVE_OK || !p) {
    ADD_FAILURE() << what << " = " << s << ": " << reason;
    return nullptr;
  }
  return p;
}

}  // namespace sieve::testing
