// The policy benchmark's device-side helpers: memory through the services table (Buffer, Tensor),
// deterministic random fills, and a timer of the work enqueued on the services' stream (CUDA
// events on the GPU, the steady clock on the CPU).
#pragma once
#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "runner.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"
#ifdef SIEVE_WITH_CUDA
#include <cuda_runtime.h>

#include "gpu_support.hpp"
#endif

namespace sieve::bench {

using runtime::HostServices;
using Clock = std::chrono::steady_clock;

// Device (or host) memory through the services table, freed with it.
class Buffer {
 public:
  Buffer(HostServices& s, size_t bytes) : s_(s) {
    bytes_ = std::max<size_t>(bytes, 4);
    p_ = s.table()->alloc(s.table()->host_ctx, s.device(), bytes_, 256);
    require(p_ != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
            "cannot allocate " + std::to_string(bytes_) + " bytes on " + device_name(s.device()));
  }
  ~Buffer() { s_.table()->free(s_.table()->host_ctx, s_.device(), p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return p_; }
  void upload(const void* host, size_t bytes) {
    std::string err;
    require(s_.copy(p_, s_.device(), host, kCpu, bytes, &err), SIEVE_ERR_DEVICE, err);
  }

 private:
  HostServices& s_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// A tensor view over a Buffer (the shape lives here).
struct Tensor {
  std::unique_ptr<Buffer> buf;
  std::vector<int64_t> shape;
  DLTensor t{};
  Tensor(HostServices& s, std::vector<int64_t> sh, DLDataType dt) : shape(std::move(sh)) {
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    buf = std::make_unique<Buffer>(s, size_t(std::max<int64_t>(n, 1)) * dtype_bytes(dt));
    t = make_view(buf->get(), s.device(), dt, int(shape.size()), shape.data());
  }
  int64_t numel() const { return sieve::numel(t); }
};

// n random values (N(0,1)-like, deterministic in seed) of dt at p on the services' device.
inline void fill_random(HostServices& s, void* p, DLDataType dt, int64_t n, uint64_t seed) {
#ifdef SIEVE_WITH_CUDA
  if (s.device().device_type == kDLCUDA) {
    cudaError_t e = fill_device_random(p, dt, n, seed, 1.f, static_cast<cudaStream_t>(s.cuda_stream()));
    require(e == cudaSuccess, SIEVE_ERR_DEVICE, std::string("random fill: ") + cudaGetErrorString(e));
    return;
  }
#else
  (void)s;
#endif
  fill_host_random(p, dt, n, seed);
}

// Times device work enqueued on the services' stream between start() and stop().
class Timer {
 public:
  explicit Timer(HostServices& s) : s_(s) {
#ifdef SIEVE_WITH_CUDA
    if (s.device().device_type == kDLCUDA) {
      require(cudaEventCreate(&e0_) == cudaSuccess && cudaEventCreate(&e1_) == cudaSuccess, SIEVE_ERR_DEVICE,
              "cudaEventCreate failed");
    }
#endif
  }
  ~Timer() {
#ifdef SIEVE_WITH_CUDA
    if (e0_) cudaEventDestroy(e0_);
    if (e1_) cudaEventDestroy(e1_);
#endif
  }
  void start() {
#ifdef SIEVE_WITH_CUDA
    if (e0_) {
      cudaEventRecord(e0_, static_cast<cudaStream_t>(s_.cuda_stream()));
      return;
    }
#endif
    t0_ = Clock::now();
  }
  double stop_ms() {
#ifdef SIEVE_WITH_CUDA
    if (e0_) {
      cudaEventRecord(e1_, static_cast<cudaStream_t>(s_.cuda_stream()));
      cudaError_t e = cudaEventSynchronize(e1_);
      float ms = 0;
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0_, e1_);
      require(e == cudaSuccess, SIEVE_ERR_DEVICE, std::string("timing: ") + cudaGetErrorString(e));
      return double(ms);
    }
#endif
    std::string err;
    require(s_.synchronize(&err), SIEVE_ERR_DEVICE, err);
    return std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
  }

 private:
  HostServices& s_;
  Clock::time_point t0_;
#ifdef SIEVE_WITH_CUDA
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
#endif
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace sieve::bench
