// Device memory reused by every GPU case: one allocation grown to the largest case, never shrunk
// (a cudaMalloc per case would cost more than many cases take), carved into 256-byte aligned
// pieces. Internal to bench/.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace sieve::bench {

class DeviceArena {
 public:
  DeviceArena() = default;
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  ~DeviceArena() { release(); }

  // Makes room for `bytes` and forgets every earlier piece; false when the device has no room.
  bool reserve(size_t bytes) {
    used_ = 0;
    if (bytes <= cap_) return true;
    release();
    if (cudaMalloc(&base_, bytes) != cudaSuccess) {
      cudaGetLastError();
      base_ = nullptr;
      return false;
    }
    cap_ = bytes;
    return true;
  }

  // The next `bytes` of the reservation (the caller reserved enough).
  void* take(size_t bytes) {
    const size_t off = (used_ + 255) & ~size_t(255);
    used_ = off + bytes;
    return static_cast<char*>(base_) + off;
  }

  // A piece holding `h`, copied on `stream`: the case's kernels run on that (non-blocking) stream,
  // and a plain cudaMemcpy would not order before them. From pageable memory cudaMemcpy returns
  // once the data is staged, its DMA possibly still in flight, and the legacy stream it uses does
  // not synchronise with a non-blocking one: the first kernel could read the piece before it
  // lands (on an H200 the Hopper prefill read zeros of a freshly allocated selection, 16K 50%).
  template <class T>
  T* upload(const std::vector<T>& h, cudaStream_t stream, cudaError_t* error) {
    T* d = static_cast<T*>(take(std::max<size_t>(h.size(), 1) * sizeof(T)));
    if (!h.empty() && *error == cudaSuccess)
      *error = cudaMemcpyAsync(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice, stream);
    return d;
  }

  void release() {
    if (base_) cudaFree(base_);
    base_ = nullptr;
    cap_ = used_ = 0;
  }

 private:
  void* base_ = nullptr;
  size_t cap_ = 0, used_ = 0;
};

}  // namespace sieve::bench
