// A scratch buffer that only grows: a call larger than every call before it reallocates (at
// least doubling, so a slowly growing size reallocates O(log n) times); every other call reuses
// it, so the hot path allocates nothing. The allocator is the owner's (the runtime's services
// table, the model's device ops): anything with `void* alloc(size_t)` and `void free(void*)`,
// passed to each call so the buffer holds no reference and its owner frees it in its destructor.
#pragma once
#include <algorithm>
#include <cstddef>

namespace sieve::util {

class GrowBuffer {
 public:
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

  // At least `bytes` bytes; true when it (re)allocated. The old contents are not kept.
  template <class Allocator>
  bool ensure(Allocator& a, size_t bytes) {
    if (bytes_ >= bytes) return false;
    const size_t grown = std::max(bytes, bytes_ * 2);
    release(a);
    ptr_ = a.alloc(grown);  // an allocator that cannot allocate throws
    bytes_ = grown;
    return true;
  }

  template <class Allocator>
  void release(Allocator& a) {
    if (ptr_) a.free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace sieve::util
