// What the Hopper host code shares: whether a device runs sm_90a code, and the dispatch of a
// 16-bit storage dtype to its CUDA type (the wgmma kernels have no f32 form). Internal to
// core/kernels/cuda.
#pragma once
#include <cuda_runtime.h>

#include <type_traits>

#include "sieve/util/storage_cuda.cuh"

namespace sieve::kernels::cuda::sm90 {

// True when `device` is compute capability 9.0 exactly: sm_90a machine code (wgmma, setmaxnreg)
// runs nowhere else, not even on later architectures.
bool device_has_wgmma(int device);

// f(type_tag<T>{}) for T = __half or __nv_bfloat16; cudaErrorInvalidValue for f32.
template <class F>
cudaError_t dispatch_storage16(Storage s, F&& f) {
  return dispatch_cuda_storage(s, [&](auto tag) -> cudaError_t {
    if constexpr (std::is_same_v<typename decltype(tag)::type, float>) return cudaErrorInvalidValue;
    else return f(tag);
  });
}

}  // namespace sieve::kernels::cuda::sm90
