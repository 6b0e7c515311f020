// Device helpers of the GPU benchmark (gpu_support.cu): random fill, and the two ceilings.
// Internal to bench/.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "sieve/util/tensor.hpp"

namespace sieve::bench {

// n values of dtype `dt` at device pointer p: N(0,1)-like (sum of uniforms from a counter hash),
// times `scale`; deterministic in seed, never zero-filled.
cudaError_t fill_device_random(void* p, DLDataType dt, int64_t n, uint64_t seed, float scale,
                               cudaStream_t stream);

// Device-to-device cudaMemcpyAsync of `bytes` (random data), median of `reps` after warm-up:
// (read + written bytes) / s / 1e9. Returns < 0 and sets *error on a CUDA failure.
double measure_copy_gbs(size_t bytes, int reps, std::string* error);

// cuBLAS bf16 GEMM n x n x n with f32 accumulation on random inputs, median of `reps`:
// 2 n^3 / s / 1e12. Returns < 0 and sets *error on failure.
double measure_bf16_gemm_tflops(int n, int reps, std::string* error);

// Peak rate of mma.sync m16n8k16 bf16 (f32 accumulation), the instruction the tensor-core
// attention kernels use: a register-only loop of independent MMAs on every SM, no memory traffic.
// 2*16*8*16 flops per instruction / s / 1e12. Returns < 0 and sets *error on failure.
double measure_mma_sync_tflops(int sm_count, std::string* error);

}  // namespace sieve::bench
