// Listed pages of device per-page tensors (sidecars) set to zero in one kernel launch, on the
// store's stream, whatever order the ids come in (page_zero.hpp). A list of up to kInlinePages
// ids (a decode step's or a 4096-token prefill's new pages) rides in the kernel's parameters and
// copies nothing; a longer one goes up through the TokenWriter's pinned staging ring into one
// device buffer, kChunkPages ids per launch (stream order puts each upload after the launch that
// read the previous chunk). Up to kMaxTargets tensors per launch (a store's sidecar slots).
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "sieve/host_services.h"
#include "sieve/kv/page_zero.hpp"
#include "token_writer.cuh"

namespace sieve::kv {

class PageZeroer {
 public:
  static constexpr int32_t kInlinePages = 512;
  static constexpr int32_t kChunkPages = 64 * 1024;
  static constexpr int kMaxTargets = 4;

  // The id buffer is allocated here (services->alloc on `device`, which the caller made
  // current); `ring` uploads longer lists and must outlive this object; `who` names the store.
  PageZeroer(const sieve_host_services* services, DLDevice device, cudaStream_t stream, TokenWriter& ring,
             const char* who);
  ~PageZeroer();
  PageZeroer(const PageZeroer&) = delete;
  PageZeroer& operator=(const PageZeroer&) = delete;

  // Enqueues the zeroing of every listed page (ids in [0, pages of each target)) of every target.
  void zero(const std::vector<PageBytes>& targets, const std::vector<int32_t>& pages);

 private:
  const sieve_host_services* services_;
  DLDevice device_;
  cudaStream_t stream_;
  TokenWriter& ring_;
  const char* who_;
  int32_t* device_ids_ = nullptr;
};

}  // namespace sieve::kv
