// The host-services table the runtime hands every plugin: memory (host and CUDA), the CUDA
// stream, logging routed to spdlog, a monotonic clock, and the core kernels.
//
// The host owns memory and streams: a HostServices object creates (and destroys) the stream its
// device work is enqueued on, and counts allocations so a test or `sieve conform` can check that
// per-layer hooks do not allocate on the hot path.
#pragma once
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "sieve/host_services.h"

namespace sieve::runtime {

class HostServices {
 public:
  // `device`: where attention runs. For kDLCUDA a non-blocking stream is created on that device,
  // unless the caller hands its own `cuda_stream` (borrowed: never destroyed here; a CPU device
  // refuses one); construction throws sieve::Error (SIEVE_ERR_DEVICE) with the reason when CUDA
  // is unusable.
  explicit HostServices(DLDevice device, void* cuda_stream = nullptr);
  ~HostServices();
  HostServices(const HostServices&) = delete;
  HostServices& operator=(const HostServices&) = delete;

  const sieve_host_services* table() const { return &table_; }
  DLDevice device() const { return device_; }
  void* cuda_stream() const { return stream_; }

  // Wait for the device work enqueued so far; false with a message if the device reported an
  // error.
  bool synchronize(std::string* error) const;

  // Allocation counter (both devices) and bytes currently held through this table.
  uint64_t allocation_count() const { return allocations_.load(); }
  int64_t bytes_held() const { return bytes_held_.load(); }

  // Metrics plugins reported through the table: name -> (count, sum, min, max) over all calls.
  struct MetricSummary {
    uint64_t count = 0;
    double sum = 0, min = 0, max = 0;
    double mean() const { return count ? sum / double(count) : 0.0; }
  };
  std::vector<std::pair<std::string, MetricSummary>> metrics() const;
  void clear_metrics();

  // This device's memory through the table, as util::GrowBuffer's allocator: alloc throws
  // sieve::Error (SIEVE_ERR_OUT_OF_MEMORY) naming the size and the device.
  struct DeviceMemory {
    const HostServices& services;
    void* alloc(size_t bytes);
    void free(void* p);
  };
  DeviceMemory device_memory() const { return DeviceMemory{*this}; }

  // Copy `bytes` between host and this device (either direction; blocking). For tools and
  // checks, never on a hot path.
  bool copy(void* dst, DLDevice dst_dev, const void* src, DLDevice src_dev, size_t bytes,
            std::string* error) const;

 private:
  static void* alloc(void* ctx, DLDevice device, size_t bytes, size_t alignment);
  static void free(void* ctx, DLDevice device, void* ptr);
  static void* stream(void* ctx);
  static void log(void* ctx, sieve_log_level level, const char* source, const char* message);
  static uint64_t now_ns(void* ctx);
  static sieve_status attend(void* ctx, const sieve_attention_args* args);
  static const char* kernel_error(void* ctx);
  static void metric(void* ctx, const char* name, int32_t layer, int32_t head, double value);

  DLDevice device_;
  void* stream_ = nullptr;
  bool owns_stream_ = false;
  sieve_kernels kernels_{};
  sieve_host_services table_{};
  std::atomic<uint64_t> allocations_{0};
  std::atomic<int64_t> bytes_held_{0};
  mutable std::mutex metrics_mutex_;
  std::map<std::string, MetricSummary> metrics_;
};

// Number of usable CUDA devices (0 in a CPU-only build or without a GPU); never fails.
int cuda_devices();

}  // namespace sieve::runtime
