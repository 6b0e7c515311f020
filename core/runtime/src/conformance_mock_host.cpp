// conformance_mock_host.hpp: counted host memory, spdlog logging, no device.
#include "conformance_mock_host.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace sieve::runtime {

namespace {
void* mock_stream(void*) { return nullptr; }
void mock_log(void*, sieve_log_level level, const char* source, const char* message) {
  auto lvl = level >= SIEVE_LOG_ERROR ? spdlog::level::err
             : level == SIEVE_LOG_WARN ? spdlog::level::warn
             : level == SIEVE_LOG_INFO ? spdlog::level::info
                                        : spdlog::level::debug;
  spdlog::log(lvl, "[{}] {}", source ? source : "?", message ? message : "");
}
uint64_t mock_now(void*) {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch()).count());
}
sieve_status mock_attend(void*, const sieve_attention_args*) { return SIEVE_ERR_UNSUPPORTED; }
const char* mock_kernel_error(void*) { return "static conformance runs no kernels"; }
void mock_metric(void*, const char*, int32_t, int32_t, double) {}
}  // namespace

MockHost::MockHost() {
  kernels_ = {SIEVE_HEADER_INIT(sieve_kernels), mock_attend, mock_kernel_error, 0};  // no variants
  services_ = {SIEVE_HEADER_INIT(sieve_host_services), this, alloc, free, mock_stream, mock_log,
               mock_now, &kernels_, mock_metric};
}

size_t MockHost::live_allocations() {
  std::lock_guard<std::mutex> lock(mu_);
  return live_.size();
}

void* MockHost::alloc(void* ctx, DLDevice dev, size_t bytes, size_t alignment) {
  if (dev.device_type != kDLCPU) return nullptr;  // static conformance has no device memory
  auto* h = static_cast<MockHost*>(ctx);
  alignment = std::max<size_t>(alignment, 16);
  if (alignment & (alignment - 1)) return nullptr;
  size_t rounded = (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded);
  if (p) {
    std::lock_guard<std::mutex> lock(h->mu_);
    h->live_[p] = bytes;
  }
  return p;
}

void MockHost::free(void* ctx, DLDevice, void* p) {
  if (!p) return;
  auto* h = static_cast<MockHost*>(ctx);
  std::lock_guard<std::mutex> lock(h->mu_);
  if (h->live_.erase(p)) std::free(p);
  else spdlog::error("conformance host: free() of a pointer it did not allocate");
}

}  // namespace sieve::runtime
