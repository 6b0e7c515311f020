// PolicyBase: what a policy instance written in C++ derives from. It holds what create() was
// given (host services, geometry, store), the instance's last_error, and offers logging through
// the host's log callback and scratch allocation through the host's allocator.
// The hooks are virtual; a derived policy overrides only the ones it uses, and policy_api.hpp sets
// the others to NULL in the C table (detected at compile time from which ones are overridden).
// Hooks report failure by throwing (sieve::plugin::fail / Error); the trampolines catch.
#pragma once
#include <sieve/policy.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>

#include "sieve/plugin/error.hpp"
#include "sieve/plugin/params.hpp"

namespace sieve::plugin {

// Everything create() received, validated by the trampoline before the constructor runs:
// `services` and `geometry` are non-null and large enough for ABI v1.0; `params` matches the
// schema. `kv` / `kv_api` may be NULL when the host has no store yet.
struct CreateContext {
  const sieve_host_services* services;
  const sieve_geometry* geometry;
  Params params;
  sieve_kv_store* kv;
  const sieve_kv_store_api* kv_api;
  const char* policy_name;  // the descriptor's name, used as the log source
};

// Memory from the host's allocator, returned to it on destruction. Allocate in create (the
// constructor), never in a hook.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const sieve_host_services* services, DLDevice device, void* ptr, size_t bytes)
      : services_(services), device_(device), ptr_(ptr), bytes_(bytes) {}
  HostBuffer(HostBuffer&& o) noexcept { swap(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    HostBuffer(std::move(o)).swap(*this);
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (ptr_ && services_ && services_->free) services_->free(services_->host_ctx, device_, ptr_);
  }
  void swap(HostBuffer& o) noexcept {
    std::swap(services_, o.services_);
    std::swap(device_, o.device_);
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
  }
  template <class T = void>
  T* get() const noexcept { return static_cast<T*>(ptr_); }
  size_t bytes() const noexcept { return bytes_; }
  DLDevice device() const noexcept { return device_; }
  explicit operator bool() const noexcept { return ptr_ != nullptr; }

 private:
  const sieve_host_services* services_ = nullptr;
  DLDevice device_{kDLCPU, 0};
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

namespace detail {
template <class D>
struct Trampolines;
}

class PolicyBase {
 public:
  explicit PolicyBase(const CreateContext& ctx);
  virtual ~PolicyBase() = default;
  PolicyBase(const PolicyBase&) = delete;
  PolicyBase& operator=(const PolicyBase&) = delete;

  // ---- Hooks (policy.h gives the order). Override the ones the policy implements. ------------
  virtual void on_append(const sieve_layer_call& call, const sieve_kv_append& append);
  virtual void select(const sieve_layer_call& call, sieve_selection& selection, uint32_t& stats);
  virtual void attend(const sieve_layer_call& call, const sieve_selection& selection,
                      DLTensor& out);
  virtual void observe(const sieve_layer_call& call, const sieve_attention_stats& stats);
  virtual void correct(const sieve_layer_call& call, const sieve_selection& selection,
                       DLTensor& out);
  virtual void end_step(const sieve_step_end& step);

  // Message of the last failed hook ("" if none failed yet). Valid until the next failure.
  const char* last_error() const noexcept { return last_error_.c_str(); }

  // The sieve_hook_bits this instance uses: those given to use_hooks(), else `overridden` (every
  // hook the class overrides). The host asks once, right after create.
  uint32_t instance_hooks(uint32_t overridden) const noexcept {
    return uses_some_hooks_ ? hooks_ : overridden;
  }

 protected:
  const sieve_host_services& services() const noexcept { return *services_; }
  const sieve_geometry& geometry() const noexcept { return geometry_; }
  sieve_kv_store* kv() const noexcept { return kv_; }
  const sieve_kv_store_api* kv_api() const noexcept { return kv_api_; }
  const char* name() const noexcept { return name_; }

  // Call in the constructor when this instance uses only some of the hooks the class overrides
  // (sieve_hook_bits, e.g. a mode that selects and leaves the attention to the core kernel): the
  // host then never calls the others, and its chain checks count only these (ABI 1.1).
  void use_hooks(uint32_t hooks) noexcept {
    hooks_ = hooks;
    uses_some_hooks_ = true;
  }

  // The host's CUDA stream (a cudaStream_t), NULL for the default stream or no CUDA.
  void* cuda_stream() const noexcept;

  // Allocate through the host (call from the constructor). Throws OUT_OF_MEMORY when the host
  // returns NULL, UNSUPPORTED when it offers no allocator.
  HostBuffer allocate(DLDevice device, size_t bytes, size_t alignment = 256) const;

  // The host's core attention kernel (services.kernels->attend) on `args`, with the header and
  // the geometry's head counts and head_dim filled in (the rest, scale 0 = 1/sqrt(head_dim)
  // included, as the caller set it). Throws the kernel's status with `what` and the host's
  // message, or UNSUPPORTED when the host offers no kernel.
  void core_kernel_attend(sieve_attention_args args, std::string_view what) const;

  // Log one line through the host's log callback (dropped when the host gave none). Never throws.
  void log(sieve_log_level level, std::string_view message) const noexcept;
  template <class... Args>
  void log_debug(Args&&... args) const { log(SIEVE_LOG_DEBUG, str(std::forward<Args>(args)...)); }
  template <class... Args>
  void log_info(Args&&... args) const { log(SIEVE_LOG_INFO, str(std::forward<Args>(args)...)); }
  template <class... Args>
  void log_warn(Args&&... args) const { log(SIEVE_LOG_WARN, str(std::forward<Args>(args)...)); }

 private:
  template <class D>
  friend struct detail::Trampolines;
  void set_last_error(const char* hook, const std::string& message) noexcept;

  const sieve_host_services* services_;
  sieve_geometry geometry_;
  sieve_kv_store* kv_;
  const sieve_kv_store_api* kv_api_;
  const char* name_;
  std::string last_error_;
  uint32_t hooks_ = 0;
  bool uses_some_hooks_ = false;
};

}  // namespace sieve::plugin
