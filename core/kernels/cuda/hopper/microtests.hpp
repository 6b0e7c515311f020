// Single-tile kernels that prove the Hopper building blocks one at a time on the GPU, before the
// prefill kernel composes them (tests/cuda/hopper_microtest_test.cpp checks each against an f64
// reference). Every kernel is one warpgroup (128 threads), head_dim 128, 16-bit inputs (T = bf16 or
// f16 by `dt`), f32 outputs, row-major:
//  - qk_tile: S[64][n_keys] = Q[64][128] · K[n_keys][128]ᵀ, both staged by plain stores into
//    128-byte-swizzled shared memory, wgmma with both operands from descriptors (n_keys 64 or 128).
//  - pv_tile: O[64][128] = P[64][64] · V[64][128], P from registers (mma.sync's A fragment), V
//    MN-major through a transposed descriptor.
//  - tma_qk_tile: the 64 keys of `pages` (64 / page_size physical pages of KV head `kvh`) loaded by
//    TMA through `kmap` (tensor_map.hpp), then S = Q·Kᵀ as qk_tile; `dump` receives the raw
//    shared-memory K tile (2 x 64 x 128 bytes), so the test checks the engine's swizzle against
//    sw128_offset byte for byte.
// Internal to core/kernels/cuda; built with SIEVE_CUDA_HOPPER.
#pragma once
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "device.hpp"  // device_has_wgmma, for the tests
#include "sieve/util/dtype_dispatch.hpp"

namespace sieve::kernels::cuda::sm90 {

cudaError_t run_qk_tile(Storage dt, int n_keys, const void* q, const void* k, float* s, cudaStream_t stream);
cudaError_t run_pv_tile(Storage dt, const void* p, const void* v, float* o, cudaStream_t stream);
cudaError_t run_tma_qk_tile(Storage dt, const CUtensorMap& kmap, const int32_t* pages, int32_t page_size,
                            int32_t kvh, const void* q, float* s, uint8_t* dump, cudaStream_t stream);

}  // namespace sieve::kernels::cuda::sm90
