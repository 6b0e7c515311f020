// MockHostServices: a gmock double of the host-services table (host_services.h) for policy tests.
//
//   ::testing::NiceMock<sieve::testing::MockHostServices> host;
//   api->create(host.table(), &geometry, ...);
//   EXPECT_CALL(host, alloc).Times(0);          // hooks must not allocate
//   EXPECT_CALL(host, log(SIEVE_LOG_WARN, "streaming", HasSubstr("dense")));
//
// Default actions (set here; override with ON_CALL / EXPECT_CALL): alloc/free hand out real
// memory — host memory for kDLCPU, the allocator given to set_device_allocator() for any other
// device (NULL without one) — and track it: live_allocations() counts what was not freed, and
// freeing a pointer this host did not hand out is a test failure. cuda_stream returns NULL,
// now_ns a steady clock, kernels->attend SIEVE_ERR_UNSUPPORTED, log does nothing.
// Wrap in NiceMock to silence "uninteresting call" warnings, StrictMock to forbid every
// unexpected call.
#pragma once
#include <gmock/gmock.h>
#include <sieve/sieve.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>

namespace sieve::testing {

class MockHostServices {
 public:
  using DeviceAlloc = std::function<void*(DLDevice, size_t)>;
  using DeviceFree = std::function<void(DLDevice, void*)>;

  MockHostServices() {
    kernels_.hdr = SIEVE_HEADER_INIT(sieve_kernels);
    kernels_.attend = &attend_cb;
    table_.hdr = SIEVE_HEADER_INIT(sieve_host_services);
    table_.host_ctx = this;
    table_.alloc = &alloc_cb;
    table_.free = &free_cb;
    table_.cuda_stream = &cuda_stream_cb;
    table_.log = &log_cb;
    table_.now_ns = &now_ns_cb;
    table_.kernels = &kernels_;
    using ::testing::_;
    ON_CALL(*this, alloc(_, _, _)).WillByDefault([this](DLDevice d, size_t n, size_t a) {
      return real_alloc(d, n, a);
    });
    ON_CALL(*this, free(_, _)).WillByDefault([this](DLDevice d, void* p) { real_free(d, p); });
    ON_CALL(*this, cuda_stream()).WillByDefault(::testing::Return(nullptr));
    ON_CALL(*this, now_ns()).WillByDefault([] {
      return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count());
    });
    ON_CALL(*this, attend(_)).WillByDefault(::testing::Return(SIEVE_ERR_UNSUPPORTED));
  }
  ~MockHostServices() {
    for (auto& [p, d] : live_) release(d, p);  // a test that leaked has already failed its check
  }
  MockHostServices(const MockHostServices&) = delete;
  MockHostServices& operator=(const MockHostServices&) = delete;

  MOCK_METHOD(void*, alloc, (DLDevice device, size_t bytes, size_t alignment));
  MOCK_METHOD(void, free, (DLDevice device, void* ptr));
  MOCK_METHOD(void*, cuda_stream, ());
  MOCK_METHOD(void, log, (sieve_log_level level, std::string source, std::string message));
  MOCK_METHOD(uint64_t, now_ns, ());
  MOCK_METHOD(sieve_status, attend, (const sieve_attention_args* args));

  // The C table a plugin receives; host_ctx is this object.
  const sieve_host_services* table() const { return &table_; }
  sieve_host_services* mutable_table() { return &table_; }  // to NULL a callback in a test

  // Memory for devices other than kDLCPU (a CUDA test passes cudaMalloc/cudaFree).
  void set_device_allocator(DeviceAlloc alloc, DeviceFree free) {
    device_alloc_ = std::move(alloc);
    device_free_ = std::move(free);
  }
  size_t live_allocations() const { return live_.size(); }

  // The real allocator behind the default actions.
  void* real_alloc(DLDevice device, size_t bytes, size_t alignment) {
    void* p = nullptr;
    if (device.device_type == kDLCPU) {
      size_t align = alignment < alignof(std::max_align_t) ? alignof(std::max_align_t) : alignment;
      if (align & (align - 1)) {
        ADD_FAILURE() << "alloc: alignment " << alignment << " is not a power of two";
        return nullptr;
      }
      p = std::aligned_alloc(align, (bytes + align - 1) / align * align + (bytes == 0 ? align : 0));
    } else if (device_alloc_) {
      p = device_alloc_(device, bytes);
    }
    if (p) live_[p] = device;
    return p;
  }
  void real_free(DLDevice device, void* p) {
    if (!p) return;
    auto it = live_.find(p);
    if (it == live_.end()) {
      ADD_FAILURE() << "free: " << p << " was not allocated by this host (or freed twice)";
      return;
    }
    if (it->second.device_type != device.device_type || it->second.device_id != device.device_id)
      ADD_FAILURE() << "free: " << p << " freed on device type " << device.device_type
                    << ", allocated on " << it->second.device_type;
    live_.erase(it);
    release(device, p);
  }

 private:
  static MockHostServices* self(void* ctx) { return static_cast<MockHostServices*>(ctx); }
  static void* alloc_cb(void* ctx, DLDevice d, size_t n, size_t a) { return self(ctx)->alloc(d, n, a); }
  static void free_cb(void* ctx, DLDevice d, void* p) { self(ctx)->free(d, p); }
  static void* cuda_stream_cb(void* ctx) { return self(ctx)->cuda_stream(); }
  static void log_cb(void* ctx, sieve_log_level level, const char* source, const char* message) {
    self(ctx)->log(level, source ? source : "", message ? message : "");
  }
  static uint64_t now_ns_cb(void* ctx) { return self(ctx)->now_ns(); }
  static sieve_status attend_cb(void* ctx, const sieve_attention_args* args) {
    return self(ctx)->attend(args);
  }
  void release(DLDevice device, void* p) {
    if (device.device_type == kDLCPU) std::free(p);
    else if (device_free_) device_free_(device, p);
  }

  sieve_kernels kernels_{};
  sieve_host_services table_{};
  DeviceAlloc device_alloc_;
  DeviceFree device_free_;
  std::map<void*, DLDevice> live_;
};

}  // namespace sieve::testing
