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

 private:
  std::string path_;
  std::string error_;
  void* handle_ = nullptr;
};

}  // namespace sieve::testing
