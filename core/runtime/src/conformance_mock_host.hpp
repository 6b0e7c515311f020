// The host services conformance hands a plugin's create() in its static checks: host memory from
// aligned_alloc, counted so a check can see what a refused create() left behind; spdlog logging;
// no device memory, no stream, no kernels (a static check runs none).
#pragma once

#include <cstddef>
#include <map>
#include <mutex>

#include "sieve/host_services.h"

namespace sieve::runtime {

class MockHost {
 public:
  MockHost();
  MockHost(const MockHost&) = delete;
  MockHost& operator=(const MockHost&) = delete;

  const sieve_host_services* services() const { return &services_; }
  // Allocations made through services() and not freed yet.
  size_t live_allocations();

 private:
  static void* alloc(void* ctx, DLDevice dev, size_t bytes, size_t alignment);
  static void free(void* ctx, DLDevice dev, void* p);

  std::mutex mu_;
  std::map<void*, size_t> live_;  // outstanding allocations -> bytes
  sieve_kernels kernels_{};
  sieve_host_services services_{};
};

}  // namespace sieve::runtime
