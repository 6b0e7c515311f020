// The page-list zeroing kernel of page_zeroer.cuh.
#include "page_zeroer.cuh"

#include <algorithm>
#include <cstring>
#include <string>

#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kv {
namespace {

struct ZeroTargets {
  char* base[PageZeroer::kMaxTargets];
  int64_t bytes[PageZeroer::kMaxTargets];
  int32_t n;
};

// The ids of one launch: inline (list == null) or in device memory.
struct PageIds {
  const int32_t* list;
  int32_t n;
  int32_t inline_ids[PageZeroer::kInlinePages];
};

static_assert(sizeof(ZeroTargets) + sizeof(PageIds) <= 4096, "zero_pages' parameters must stay within 4 KB");

// One block per (page, target) pair at a time; its threads store 16-byte words when the page's
// bytes allow (sidecar pages are a few KB: Quest's min/max of 8 heads x 128 dims is 8 KB in f32),
// single bytes otherwise (a bf16 sidecar of an odd width).
__global__ void zero_pages_kernel(const __grid_constant__ PageIds ids, const __grid_constant__ ZeroTargets t) {
  const int64_t pairs = int64_t(ids.n) * t.n;
  for (int64_t pr = blockIdx.x; pr < pairs; pr += gridDim.x) {
    const int32_t which = int32_t(pr % t.n);
    const int64_t k = pr / t.n;
    const int64_t page = ids.list ? ids.list[k] : ids.inline_ids[k];
    const int64_t n = t.bytes[which];
    char* dst = t.base[which] + page * n;
    if (n % 16 == 0 && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
      uint4* d = reinterpret_cast<uint4*>(dst);
      for (int64_t i = threadIdx.x; i < n / 16; i += blockDim.x) d[i] = make_uint4(0, 0, 0, 0);
    } else {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] = 0;
    }
  }
}

}  // namespace

PageZeroer::PageZeroer(const sieve_host_services* services, DLDevice device, cudaStream_t stream, TokenWriter& ring,
                       const char* who)
    : services_(services), device_(device), stream_(stream), ring_(ring), who_(who) {
  const size_t bytes = size_t(kChunkPages) * sizeof(int32_t);
  device_ids_ = static_cast<int32_t*>(services_->alloc(services_->host_ctx, device_, bytes, 256));
  require(device_ids_ != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
          std::string(who_) + ": cannot allocate " + std::to_string(bytes) + " bytes of " + device_name(device_) +
              " memory for the page-id list");
}

PageZeroer::~PageZeroer() {
  cudaStreamSynchronize(stream_);  // a pending launch may still read the id buffer (teardown only)
  services_->free(services_->host_ctx, device_, device_ids_);
}

void PageZeroer::zero(const std::vector<PageBytes>& targets, const std::vector<int32_t>& pages) {
  if (pages.empty() || targets.empty()) return;  // a launch of no blocks is an error
  for (size_t t0 = 0; t0 < targets.size(); t0 += kMaxTargets) {
    ZeroTargets zt{};
    for (; zt.n < kMaxTargets && t0 + size_t(zt.n) < targets.size(); ++zt.n) {
      zt.base[zt.n] = static_cast<char*>(targets[t0 + size_t(zt.n)].base);
      zt.bytes[zt.n] = int64_t(targets[t0 + size_t(zt.n)].bytes_per_page);
    }
    for (size_t begin = 0; begin < pages.size(); begin += size_t(kChunkPages)) {
      PageIds ids;
      ids.n = int32_t(std::min<size_t>(size_t(kChunkPages), pages.size() - begin));
      if (ids.n <= kInlinePages) {
        ids.list = nullptr;
        std::memcpy(ids.inline_ids, pages.data() + begin, size_t(ids.n) * sizeof(int32_t));
      } else {
        ring_.upload(device_ids_, pages.data() + begin, size_t(ids.n) * sizeof(int32_t));
        ids.list = device_ids_;
      }
      const int64_t pairs = int64_t(ids.n) * zt.n;
      const unsigned blocks = unsigned(std::min<int64_t>(pairs, 65535));
      zero_pages_kernel<<<blocks, 128, 0, stream_>>>(ids, zt);
      check_cuda(cudaGetLastError(), who_, "page zeroing kernel launch");
    }
  }
}

}  // namespace sieve::kv
