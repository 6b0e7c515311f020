// What the KV-store suite needs to drive a store on either device and read back what it holds:
// tensors uploaded through the host services, a view copied to the host and checked against what
// the attention kernels assume of a page table, and the f64 reference of every resident token.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "sieve/kv_store.h"
#include "sieve/runtime/host_services.hpp"

namespace sieve::runtime::store_conform {

// Host bytes on the store's device (device memory through the host services for CUDA).
class DeviceBuffer {
 public:
  DeviceBuffer(HostServices& host, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* data() const { return data_; }
  void upload(const void* src, size_t bytes);
  void download(void* dst, size_t bytes) const;

 private:
  HostServices& host_;
  void* data_ = nullptr;
};

// Resident tokens of one (layer, sequence) in token order, K and V rows of n_kv_heads * head_dim
// values: what the store must hand back. Values are f32-representable, so an f32 store holds them
// exactly and a 16-bit store within one rounding.
struct RefRows {
  std::vector<double> k, v, k_pre_rope;  // k_pre_rope: empty unless the store keeps pre-RoPE keys
  int64_t tokens(int64_t row) const { return int64_t(k.size()) / row; }
};
using Reference = std::map<std::pair<int32_t, int32_t>, RefRows>;  // (layer, seq) -> rows

// A view copied to the host. Pool element (page, head, slot, dim) is read through the view's
// strides (NULL: compact HND) and byte_offset.
struct ViewCopy {
  int32_t batch = 0, page_size = 0;
  int64_t capacity = 0;
  std::vector<int32_t> indptr, indices, last_page_len;  // from the device arrays
  std::vector<unsigned char> k, v, k_pre_rope;           // the pools' bytes
  int64_t k_strides[4]{}, v_strides[4]{}, pre_strides[4]{};
  DLDataType dtype{};
  double k_at(int32_t page, int32_t head, int32_t slot, int32_t dim) const;
  double v_at(int32_t page, int32_t head, int32_t slot, int32_t dim) const;
  double pre_at(int32_t page, int32_t head, int32_t slot, int32_t dim) const;
  // Physical pages of batch entry b, in token order.
  std::vector<int32_t> pages(int32_t b) const;
};

struct Shape {
  int32_t n_kv_heads, head_dim, page_size, capacity;
  DLDataType dtype;
  DLDevice device;
  bool pre_rope = false;  // configured to keep pre-RoPE keys: the view must carry them
};

// Copies `view` to the host and checks what the kernels rely on: tensors on the store's device
// with the configured shape and dtype, indptr from 0 and non-decreasing with resident_tokens
// pages per sequence, page ids in [0, capacity), no physical page listed twice (two live
// sequences never share a page), last_page_len in 1..page_size and matching the resident tokens,
// host mirrors equal to the device arrays. Returns every problem (empty: usable); `out` is filled
// only as far as the structure allowed.
std::vector<std::string> copy_view(HostServices& host, const sieve_paged_kv& view, const Shape& shape,
                                   const std::vector<int32_t>& resident_tokens, ViewCopy* out);

// The first stored K or V value of batch entry b that differs from `ref` by more than one
// rounding to the store's dtype (0 for f32: exact), as one line; "" when all match.
std::string compare_rows(const ViewCopy& view, int32_t b, const RefRows& ref, const Shape& shape,
                         const std::string& who);

// Unit roundoff of the store's dtype (the largest relative error of one round-to-nearest
// conversion from f32; 0 for f32 storage): tests/common/tolerance.hpp derives the same numbers.
double conversion_bound(DLDataType dtype);

}  // namespace sieve::runtime::store_conform
