// The CUDA side of dtype_dispatch.hpp (CUDA translation units only): the element types a launcher
// dispatches to, and the element conversions every kernel uses: to_f32 / from_f32 for a template
// type, load_storage / store_storage for a Storage known only at run time (round to nearest even,
// as sieve/util/half.hpp on the host, so CPU and CUDA stores hold the same bits).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "sieve/util/dtype_dispatch.hpp"

namespace sieve {

using CudaStorageTypes = StorageTypes<float, __half, __nv_bfloat16>;

// The Storage of a CUDA element type (a kernel comparing its template type with a runtime dtype).
template <class T>
__host__ __device__ constexpr Storage storage_of_type() {
  if constexpr (std::is_same_v<T, float>) return Storage::f32;
  else if constexpr (std::is_same_v<T, __half>) return Storage::f16;
  else {
    static_assert(std::is_same_v<T, __nv_bfloat16>, "not a CUDA storage type");
    return Storage::bf16;
  }
}

// Host code: f(type_tag<T>{}) with T = float, __half or __nv_bfloat16.
template <class F>
decltype(auto) dispatch_cuda_storage(Storage s, F&& f) {
  return dispatch_storage<CudaStorageTypes>(s, std::forward<F>(f));
}

template <class T>
__device__ __forceinline__ float to_f32(T v);
template <>
__device__ __forceinline__ float to_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ float to_f32<__half>(__half v) { return __half2float(v); }
template <>
__device__ __forceinline__ float to_f32<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Element i of a buffer whose dtype is a kernel argument (q / out of mixed-dtype calls).
__device__ __forceinline__ float load_storage(const void* base, Storage s, int64_t i) {
  if (s == Storage::f32) return static_cast<const float*>(base)[i];
  if (s == Storage::f16) return __half2float(static_cast<const __half*>(base)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}
__device__ __forceinline__ void store_storage(void* base, Storage s, int64_t i, float v) {
  if (s == Storage::f32) static_cast<float*>(base)[i] = v;
  else if (s == Storage::f16) static_cast<__half*>(base)[i] = __float2half_rn(v);
  else static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v);
}

}  // namespace sieve
