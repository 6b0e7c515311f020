// Host memory for the CPU cases and ceilings: 2 MiB-aligned and advised to use transparent huge
// pages, as a KV cache's one large allocation would be (with 4 KiB pages every 4 KiB K or V slab
// of a scattered page is a TLB miss, which nested paging in a VM makes costly). Internal to bench/.
#pragma once
#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace sieve::bench {

class PoolBuffer {
 public:
  explicit PoolBuffer(size_t n) : bytes_((std::max<size_t>(n, 1) + kHuge - 1) / kHuge * kHuge) {
    p_ = std::aligned_alloc(kHuge, bytes_);
    if (!p_) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(p_, bytes_, MADV_HUGEPAGE);  // advice: without it (or with THP off) 4 KiB pages
#endif
  }
  ~PoolBuffer() { std::free(p_); }
  PoolBuffer(const PoolBuffer&) = delete;
  PoolBuffer& operator=(const PoolBuffer&) = delete;
  unsigned char* data() const { return static_cast<unsigned char*>(p_); }
  size_t size() const { return bytes_; }

 private:
  static constexpr size_t kHuge = size_t(2) << 20;
  size_t bytes_;
  void* p_ = nullptr;
};

}  // namespace sieve::bench
