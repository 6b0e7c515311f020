// Hopper's asynchronous copies as the prefill kernel uses them: mbarrier-based producer/consumer
// hand-off (init, expected transaction bytes, phase-parity wait) and the TMA engine's tiled load
// (cp.async.bulk.tensor) of one box of a tensor map into shared memory, completing on an mbarrier.
// A stage's "full" barrier is armed by the producer with the bytes it will receive and flips its
// phase when they have landed; its "empty" barrier counts the consumers' arrivals. Waiters track
// the phase parity (0, 1, 0, ...) of each use. Internal to core/kernels/cuda (sm_90).
#pragma once
#include <cuda.h>  // CUtensorMap (the type only; the driver call is host-side, tensor_map.cpp)

#include <cstdint>

#include "wgmma.cuh"

namespace sieve::kernels::cuda::sm90 {

__device__ inline void mbar_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
// After the barriers are initialised, before any other thread or the TMA engine uses them.
__device__ inline void fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }

// One arrival that also announces `bytes` of transactions (the TMA loads of this phase).
__device__ inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ inline void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Blocks until the phase with this parity has completed.
__device__ inline void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// Loads the box at coordinates (c0 innermost .. c3) of a 4-D tensor map into dst (aligned as the
// map's swizzle needs: 1024 bytes for 128-byte swizzle); completes `bar`'s transaction bytes.
// `map` must live in parameter, constant or global memory (a __grid_constant__ kernel parameter).
__device__ inline void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1,
                                   int32_t c2, int32_t c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}

// The same for a 3-D tensor map (coordinates c0 innermost .. c2).
__device__ inline void tma_load_3d(void* dst, const CUtensorMap* map, uint64_t* bar, int32_t c0, int32_t c1,
                                   int32_t c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];\n" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}

}  // namespace sieve::kernels::cuda::sm90
