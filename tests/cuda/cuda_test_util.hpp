// What the CUDA tests share: the skip-without-a-device fixture, owning device buffers, and host
// services (alloc/free through cudaMalloc with a live-allocation count, one stream).
#pragma once
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <utility>

#include "sieve/host_services.h"
#include "sieve/util/tensor.hpp"

namespace sieve::cuda_test {

#define SIEVE_CUDA_OK(expr)                                                              \
  do {                                                                                   \
    cudaError_t e_ = (expr);                                                             \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_);               \
  } while (0)

// "" when a CUDA device is usable, else why not.
inline std::string no_cuda_reason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e);
  }
  if (n == 0) return "cudaGetDeviceCount found 0 devices";
  return {};
}

// Every CUDA test derives from this: it skips (with the reason) where there is no device, and
// gives the test a non-blocking stream.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = no_cuda_reason();
    if (!why.empty()) GTEST_SKIP() << "no CUDA device: " << why;
    SIEVE_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
      cudaStreamDestroy(stream_);
    }
  }
  cudaStream_t stream_ = nullptr;
};

// An owning device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes && cudaMalloc(&p_, bytes) != cudaSuccess) {
      p_ = nullptr;
      ADD_FAILURE() << "cudaMalloc(" << bytes << ") failed";
    }
  }
  ~DeviceBuffer() {
    if (p_) cudaFree(p_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(o.p_), bytes_(o.bytes_) { o.p_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// A device copy of a host tensor (same shape, dtype, compact) and the DLTensor that views it.
struct DeviceTensor {
  DeviceBuffer buf;
  DLTensor dl{};
  DeviceTensor() = default;
  explicit DeviceTensor(const HostTensor& h, int device = 0) : buf(std::max<size_t>(h.nbytes(), 1)) {
    dl = h.dl();
    dl.data = buf.get();
    dl.byte_offset = 0;
    dl.device = DLDevice{kDLCUDA, device};
    upload(h);
  }
  // A pageable cudaMemcpy may return before the data lands, and the tests' streams do not wait
  // for the legacy stream: finish the copy before any stream reads it.
  void upload(const HostTensor& h) {
    if (!h.nbytes()) return;
    EXPECT_EQ(cudaMemcpy(buf.get(), h.dl().data, h.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void download(HostTensor& h) const {
    if (h.nbytes()) {
      EXPECT_EQ(cudaMemcpy(h.dl().data, buf.get(), h.nbytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    }
  }
};

// Host services for a store under test: device memory through cudaMalloc, host memory through
// malloc, both counted so a test can check that whoever allocated also freed.
struct TestServices {
  sieve_host_services table{};
  cudaStream_t stream = nullptr;
  int live = 0;

  explicit TestServices(cudaStream_t s) : stream(s) {
    table.hdr = SIEVE_HEADER_INIT(sieve_host_services);
    table.host_ctx = this;
    table.alloc = [](void* ctx, DLDevice dev, size_t bytes, size_t) -> void* {
      void* p = nullptr;
      if (dev.device_type == kDLCUDA) {
        if (cudaSetDevice(dev.device_id) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
      } else {
        p = std::malloc(bytes);
      }
      if (p) ++static_cast<TestServices*>(ctx)->live;
      return p;
    };
    table.free = [](void* ctx, DLDevice dev, void* p) {
      if (!p) return;
      if (dev.device_type == kDLCUDA) cudaFree(p);
      else std::free(p);
      --static_cast<TestServices*>(ctx)->live;
    };
    table.cuda_stream = [](void* ctx) -> void* { return static_cast<TestServices*>(ctx)->stream; };
    table.log = [](void*, sieve_log_level, const char*, const char*) {};
    table.now_ns = [](void*) -> uint64_t {
      return uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
    };
    table.kernels = nullptr;
  }
};

}  // namespace sieve::cuda_test
