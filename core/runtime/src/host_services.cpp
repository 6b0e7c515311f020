#include "sieve/runtime/host_services.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "sieve/kernels/attention_cpu.hpp"
#include "sieve/kernels/attention_cuda.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"

#ifdef SIEVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sieve::runtime {

namespace {
thread_local std::string t_kernel_error;

// Allocation sizes, so bytes_held stays exact without trusting callers.
std::mutex g_sizes_mutex;
std::unordered_map<void*, size_t> g_sizes;
}  // namespace

int cuda_devices() { return kernels::cuda_device_count(); }

HostServices::HostServices(DLDevice device, void* cuda_stream) : device_(device) {
  require(!cuda_stream || device.device_type == kDLCUDA, SIEVE_ERR_INVALID_ARGUMENT,
          "a CUDA stream was given for a session on " + device_name(device));
  if (device.device_type == kDLCUDA) {
#ifdef SIEVE_WITH_CUDA
    int n = cuda_devices();
    require(n > 0, SIEVE_ERR_DEVICE, "CUDA requested but no CUDA device is usable");
    require(device.device_id >= 0 && device.device_id < n, SIEVE_ERR_DEVICE,
            "CUDA device " + std::to_string(device.device_id) + " does not exist (" +
                std::to_string(n) + " found)");
    cudaError_t e = cudaSetDevice(device.device_id);
    require(e == cudaSuccess, SIEVE_ERR_DEVICE, std::string("cudaSetDevice: ") + cudaGetErrorString(e));
    cudaStream_t s = static_cast<cudaStream_t>(cuda_stream);
    if (!s) {
      e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
      require(e == cudaSuccess, SIEVE_ERR_DEVICE,
              std::string("cudaStreamCreate: ") + cudaGetErrorString(e));
      owns_stream_ = true;
    }
    stream_ = s;
#else
    fail(SIEVE_ERR_DEVICE, "CUDA requested but this build of Sieve has no CUDA support");
#endif
  } else {
    require(device.device_type == kDLCPU, SIEVE_ERR_INVALID_ARGUMENT,
            "unsupported device " + device_name(device));
  }
  kernels_.hdr = SIEVE_HEADER_INIT(sieve_kernels);
  kernels_.attend = &HostServices::attend;
  kernels_.last_error = &HostServices::kernel_error;
  kernels_.variants = SIEVE_VARIANT_KEY_SPANS;  // attend_cpu and attend_cuda both compute them
  table_.hdr = SIEVE_HEADER_INIT(sieve_host_services);
  table_.host_ctx = this;
  table_.alloc = &HostServices::alloc;
  table_.free = &HostServices::free;
  table_.cuda_stream = &HostServices::stream;
  table_.log = &HostServices::log;
  table_.now_ns = &HostServices::now_ns;
  table_.kernels = &kernels_;
  table_.metric = &HostServices::metric;
}

HostServices::~HostServices() {
#ifdef SIEVE_WITH_CUDA
  if (stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    if (owns_stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  }
#endif
}

bool HostServices::synchronize(std::string* error) const {
#ifdef SIEVE_WITH_CUDA
  if (stream_) {
    cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
    if (e != cudaSuccess) {
      if (error) *error = std::string("device error: ") + cudaGetErrorString(e);
      return false;
    }
  }
#endif
  (void)error;
  return true;
}

void* HostServices::DeviceMemory::alloc(size_t bytes) {
  const sieve_host_services* t = services.table();
  void* p = t->alloc(t->host_ctx, services.device(), bytes, 256);
  require(p != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
          "runtime: cannot allocate " + std::to_string(bytes) + " bytes on " + device_name(services.device()));
  return p;
}

void HostServices::DeviceMemory::free(void* p) {
  const sieve_host_services* t = services.table();
  t->free(t->host_ctx, services.device(), p);
}

bool HostServices::copy(void* dst, DLDevice dst_dev, const void* src, DLDevice src_dev,
                        size_t bytes, std::string* error) const {
  if (dst_dev.device_type == kDLCPU && src_dev.device_type == kDLCPU) {
    std::memcpy(dst, src, bytes);
    return true;
  }
#ifdef SIEVE_WITH_CUDA
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  if (e != cudaSuccess) {
    if (error) *error = std::string("cudaMemcpy: ") + cudaGetErrorString(e);
    return false;
  }
  return true;
#else
  if (error) *error = "copy to/from a CUDA device in a build without CUDA";
  return false;
#endif
}

void* HostServices::alloc(void* ctx, DLDevice device, size_t bytes, size_t alignment) {
  auto* self = static_cast<HostServices*>(ctx);
  if (bytes == 0) bytes = 1;
  void* p = nullptr;
  if (device.device_type == kDLCPU) {
    if (alignment < 64) alignment = 64;
    if (alignment & (alignment - 1)) return nullptr;  // not a power of two
    p = std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  } else if (device.device_type == kDLCUDA) {
#ifdef SIEVE_WITH_CUDA
    // cudaMalloc aligns to 256 bytes, which covers every alignment a kernel asks for.
    if (alignment > 256 || cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
#endif
  }
  if (p) {
    ++self->allocations_;
    self->bytes_held_ += int64_t(bytes);
    std::lock_guard<std::mutex> lock(g_sizes_mutex);
    g_sizes[p] = bytes;
  }
  return p;
}

void HostServices::free(void* ctx, DLDevice device, void* ptr) {
  if (!ptr) return;
  auto* self = static_cast<HostServices*>(ctx);
  {
    std::lock_guard<std::mutex> lock(g_sizes_mutex);
    auto it = g_sizes.find(ptr);
    if (it != g_sizes.end()) {
      self->bytes_held_ -= int64_t(it->second);
      g_sizes.erase(it);
    }
  }
  if (device.device_type == kDLCPU) {
    std::free(ptr);
  } else if (device.device_type == kDLCUDA) {
#ifdef SIEVE_WITH_CUDA
    cudaFree(ptr);
#endif
  }
}

void* HostServices::stream(void* ctx) { return static_cast<HostServices*>(ctx)->stream_; }

void HostServices::log(void*, sieve_log_level level, const char* source, const char* message) {
  static const spdlog::level::level_enum map[] = {spdlog::level::trace, spdlog::level::debug,
                                                  spdlog::level::info, spdlog::level::warn,
                                                  spdlog::level::err};
  auto lv = (level >= SIEVE_LOG_TRACE && level <= SIEVE_LOG_ERROR) ? map[level] : spdlog::level::info;
  spdlog::log(lv, "[{}] {}", source ? source : "plugin", message ? message : "");
}

uint64_t HostServices::now_ns(void*) {
  return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count());
}

sieve_status HostServices::attend(void* ctx, const sieve_attention_args* args) {
  auto* self = static_cast<HostServices*>(ctx);
  t_kernel_error.clear();
  if (!args || !args->q) {
    t_kernel_error = "attend: null arguments";
    return SIEVE_ERR_INVALID_ARGUMENT;
  }
  if (args->q->device.device_type == kDLCUDA)
    return kernels::attend_cuda(*args, self->stream_, &t_kernel_error);
  return kernels::attend_cpu(*args, &t_kernel_error);
}

const char* HostServices::kernel_error(void*) { return t_kernel_error.c_str(); }

void HostServices::metric(void* ctx, const char* name, int32_t, int32_t, double value) {
  auto* self = static_cast<HostServices*>(ctx);
  if (!name) return;
  std::lock_guard<std::mutex> lock(self->metrics_mutex_);
  MetricSummary& m = self->metrics_[name];
  m.min = m.count ? std::min(m.min, value) : value;
  m.max = m.count ? std::max(m.max, value) : value;
  m.sum += value;
  ++m.count;
}

std::vector<std::pair<std::string, HostServices::MetricSummary>> HostServices::metrics() const {
  std::lock_guard<std::mutex> lock(metrics_mutex_);
  return {metrics_.begin(), metrics_.end()};
}

void HostServices::clear_metrics() {
  std::lock_guard<std::mutex> lock(metrics_mutex_);
  metrics_.clear();
}

}  // namespace sieve::runtime
