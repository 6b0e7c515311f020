// DLTensor helpers shared by the runtime, the kernels and plugins (header-only, no ABI impact).
#pragma once
#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "sieve/util/half.hpp"

namespace sieve {

inline constexpr DLDataType kF32{kDLFloat, 32, 1};
inline constexpr DLDataType kF16{kDLFloat, 16, 1};
inline constexpr DLDataType kBF16{kDLBfloat, 16, 1};
inline constexpr DLDataType kI32{kDLInt, 32, 1};
inline constexpr DLDevice kCpu{kDLCPU, 0};

inline bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}
inline bool is_float_storage(DLDataType t) {
  return same_dtype(t, kF32) || same_dtype(t, kF16) || same_dtype(t, kBF16);
}
inline size_t dtype_bytes(DLDataType t) { return size_t(t.bits) * t.lanes / 8; }
inline std::string dtype_name(DLDataType t) {
  if (same_dtype(t, kF32)) return "f32";
  if (same_dtype(t, kF16)) return "f16";
  if (same_dtype(t, kBF16)) return "bf16";
  if (same_dtype(t, kI32)) return "int32";
  return "dtype(code=" + std::to_string(t.code) + ",bits=" + std::to_string(t.bits) + ")";
}
inline std::string device_name(DLDevice d) {
  if (d.device_type == kDLCPU) return "cpu";
  if (d.device_type == kDLCUDA) return "cuda:" + std::to_string(d.device_id);
  return "device(" + std::to_string(int(d.device_type)) + ")";
}

inline int64_t numel(const DLTensor& t) {
  int64_t n = 1;
  for (int i = 0; i < t.ndim; ++i) n *= t.shape[i];
  return n;
}
// Strides in elements; DLPack allows strides == NULL for compact row-major.
inline int64_t stride(const DLTensor& t, int dim) {
  if (t.strides) return t.strides[dim];
  int64_t s = 1;
  for (int i = t.ndim - 1; i > dim; --i) s *= t.shape[i];
  return s;
}
inline bool is_contiguous(const DLTensor& t) {
  int64_t s = 1;
  for (int i = t.ndim - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && stride(t, i) != s) return false;
    s *= t.shape[i];
  }
  return true;
}
template <class T = void>
inline T* data_ptr(const DLTensor& t) {
  return reinterpret_cast<T*>(static_cast<char*>(t.data) + t.byte_offset);
}

// Describe what is wrong with `t` against an expected rank/dtype, or "" when it fits.
inline std::string check_tensor(const DLTensor* t, const char* what, int ndim,
                                std::initializer_list<int64_t> shape = {}) {
  if (!t) return std::string(what) + ": null tensor";
  if (!t->data) return std::string(what) + ": null data pointer";
  if (t->ndim != ndim)
    return std::string(what) + ": expected " + std::to_string(ndim) + " dims, got " +
           std::to_string(t->ndim);
  int i = 0;
  for (int64_t s : shape) {
    if (s >= 0 && t->shape[i] != s)
      return std::string(what) + ": dim " + std::to_string(i) + " is " +
             std::to_string(t->shape[i]) + ", expected " + std::to_string(s);
    ++i;
  }
  for (int d = 0; d < t->ndim; ++d)
    if (t->shape[d] < 0) return std::string(what) + ": negative dim";
  return {};
}

// Scalar load/store of a float-storage element (host memory).
inline float load_float(const void* base, DLDataType t, int64_t i) {
  if (t.bits == 32) return static_cast<const float*>(base)[i];
  uint16_t h = static_cast<const uint16_t*>(base)[i];
  return t.code == kDLBfloat ? bf16_to_f32(h) : f16_to_f32(h);
}
inline void store_float(void* base, DLDataType t, int64_t i, float v) {
  if (t.bits == 32) {
    static_cast<float*>(base)[i] = v;
  } else {
    static_cast<uint16_t*>(base)[i] = t.code == kDLBfloat ? f32_to_bf16(v) : f32_to_f16(v);
  }
}

// An owning host tensor (tests, tools, the reference path): compact row-major storage plus the
// DLTensor that borrows it.
class HostTensor {
 public:
  HostTensor() = default;
  HostTensor(std::vector<int64_t> shape, DLDataType dtype) : shape_(std::move(shape)) {
    int64_t n = 1;
    for (auto s : shape_) n *= s;
    bytes_.assign(size_t(n) * dtype_bytes(dtype) + 64, 0);
    t_.data = bytes_.data();
    t_.device = kCpu;
    t_.ndim = int(shape_.size());
    t_.dtype = dtype;
    t_.shape = shape_.data();
    t_.strides = nullptr;
    t_.byte_offset = 0;
  }
  HostTensor(const HostTensor& o) : HostTensor(o.shape_, o.t_.dtype) { bytes_ = o.bytes_; t_.data = bytes_.data(); }
  HostTensor& operator=(const HostTensor& o) {
    if (this != &o) { HostTensor c(o); swap(c); }
    return *this;
  }
  HostTensor(HostTensor&& o) noexcept { swap(o); }
  HostTensor& operator=(HostTensor&& o) noexcept { swap(o); return *this; }
  void swap(HostTensor& o) noexcept {
    std::swap(shape_, o.shape_); std::swap(bytes_, o.bytes_); std::swap(t_, o.t_);
    t_.shape = shape_.data(); o.t_.shape = o.shape_.data();
  }

  DLTensor& dl() { return t_; }
  const DLTensor& dl() const { return t_; }
  DLTensor* operator->() { return &t_; }
  int64_t numel() const { return sieve::numel(t_); }
  size_t nbytes() const { return size_t(numel()) * dtype_bytes(t_.dtype); }
  template <class T> T* data() { return static_cast<T*>(t_.data); }
  template <class T> const T* data() const { return static_cast<const T*>(t_.data); }
  float get(int64_t i) const { return load_float(t_.data, t_.dtype, i); }
  void set(int64_t i, float v) { store_float(t_.data, t_.dtype, i, v); }
  const std::vector<int64_t>& shape() const { return shape_; }

 private:
  std::vector<int64_t> shape_;
  std::vector<unsigned char> bytes_;
  DLTensor t_{};
};

// A DLTensor view over an existing buffer (shape array owned by the caller).
inline DLTensor make_view(void* data, DLDevice dev, DLDataType dtype, int ndim, int64_t* shape,
                          int64_t* strides = nullptr) {
  DLTensor t{};
  t.data = data;
  t.device = dev;
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  t.strides = strides;
  t.byte_offset = 0;
  return t;
}

}  // namespace sieve
