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

// Read-only bandwidth: a kernel that reads `bytes` (random data) once and writes nothing of
// size, median of `reps` after warm-up: bytes read / s / 1e9. A read-only stream runs faster than
// a copy, which also writes: this, not the copy, is the decode kernels' ceiling.
enum class ReadPath {
  kLoads,   // 16-byte loads, 8 in flight per thread, 8 CTAs of 256 threads per SM, grid stride
  kBulk,    // the bulk-copy engine into shared memory, 6 x 32 KB in flight per SM (sm_90)
  kPaged8,  // 16-byte loads, 2 CTAs per SM, each reading 4 KB of every 32 KB (a paged KV pool's
            // pattern: one KV head of pages holding 8, page 16, head_dim 128, bf16)
  kPaged1,  // the same grid, each CTA one contiguous stream (the layout's effect, against kPaged8)
};
double measure_read_gbs(size_t bytes, int reps, ReadPath path, std::string* error);

// cuBLAS bf16 GEMM n x n x n with f32 accumulation on random inputs, median of `reps`:
// 2 n^3 / s / 1e12. Returns < 0 and sets *error on failure.
double measure_bf16_gemm_tflops(int n, int reps, std::string* error);

// Peak rate of mma.sync m16n8k16 bf16 (f32 accumulation), the instruction the tensor-core
// attention kernels use: a register-only loop of independent MMAs on every SM, no memory traffic.
// 2*16*8*16 flops per instruction / s / 1e12. Returns < 0 and sets *error on failure.
double measure_mma_sync_tflops(int sm_count, std::string* error);

// The floor of a per-call fixed cost: microseconds per launch of an empty kernel (`ctas` CTAs of
// 128 threads) in a CUDA graph of 256 such launches on one stream, each waiting for the one
// before, replayed (median of `reps`). With `pdl` each is a programmatic dependent launch of the
// one before (sm_90: it is scheduled while that one drains, then waits for it), as the attention
// row kernel is launched. Returns < 0 and sets *error on failure.
double measure_graph_launch_us(int ctas, bool pdl, int reps, std::string* error);

}  // namespace sieve::bench
