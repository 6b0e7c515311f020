// Appended tokens into a device page pool, and host -> device uploads without a synchronisation:
// what the core CUDA store and the engine-pool store share (the engine's pool may be strided:
// NHD or combined pages, so destinations are PoolTargets).
//
// A decode step's slot list (up to kInlineSlots tokens) rides in the kernel's parameters, so it
// copies nothing and never waits. Larger slot lists (and anything a store uploads) go through a
// pinned staging ring (kStages buffers of kStageBytes, allocated at setup with cudaMallocHost).
// Each upload takes the next buffer, waits on the host for the event recorded after that
// buffer's previous copy (a wait on a copy enqueued kStages uploads ago, normally long done),
// fills it, enqueues cudaMemcpyAsync and records the event again. Uploads larger than a buffer are
// split into chunks. The device-side destination of slot lists is one buffer reused by every
// chunk: stream order puts each copy after the kernel that read the previous chunk.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <string>
#include <vector>

#include "sieve/host_services.h"
#include "sieve/kv/token_scatter.hpp"

namespace sieve::kv {

// A failed CUDA call as the store's error (SIEVE_ERR_DEVICE), naming `who` and the call.
void check_cuda(cudaError_t e, const char* who, const char* what);

// Makes a device current for the scope of a call.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
  bool changed_ = false;
};

class TokenWriter {
 public:
  static constexpr int64_t kInlineSlots = 128;

  // Everything is allocated here (device memory through services->alloc); `who` names the store
  // in errors. The caller has made `device` current.
  TokenWriter(const sieve_host_services* services, DLDevice device, cudaStream_t stream, const char* who);
  // Drains the stream (pending copies may read the ring), then frees.
  ~TokenWriter();
  TokenWriter(const TokenWriter&) = delete;
  TokenWriter& operator=(const TokenWriter&) = delete;

  // Writes row ts.src of inputs[i] to targets[i] for every slot, for every non-null inputs[i]
  // (K, V, pre-RoPE K: [n, n_kv_heads, head_dim], unit-stride along head_dim), converting to
  // `dst_dtype`; one launch per chunk and input dtype. When `view_last` is given and the step is
  // small enough, the first launch also writes view_last[0, n_last) to last_dst (a store's view
  // table) and write returns true; otherwise the caller publishes it.
  bool write(const std::vector<TokenSlot>& slots, const DLTensor* const inputs[3], const PoolTarget targets[3],
             DLDataType dst_dtype, int32_t n_kv_heads, int32_t head_dim, int32_t* last_dst,
             const int32_t* view_last, int32_t n_last);

  // Host -> device copy through the pinned ring, stream-ordered, no device synchronisation.
  void upload(void* dst, const void* src, size_t bytes);

 private:
  static constexpr int kStages = 4;
  void release() noexcept;
  const sieve_host_services* services_;
  DLDevice device_;
  cudaStream_t stream_;
  const char* who_;
  TokenSlot* device_slots_ = nullptr;
  char* staging_ = nullptr;
  std::array<cudaEvent_t, kStages> stage_done_{};
  int n_events_ = 0;
  int next_stage_ = 0;
};

}  // namespace sieve::kv
