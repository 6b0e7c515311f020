// The single-tile Hopper kernels of microtests.hpp.
#include "async_copy.cuh"
#include "device.hpp"
#include "microtests.hpp"
#include "wgmma.cuh"

namespace sieve::kernels::cuda::sm90 {
namespace {

constexpr int kD = 128;
constexpr int kThreads = 128;                  // one warpgroup
constexpr int kHalfBytes64 = 64 * 128;         // one 64-column half of a 64-row tile

// Dynamic shared memory is only 16-byte aligned by contract: the kernels ask for 1 KB more and
// start their tiles at the next 1024-byte boundary (the swizzle atom).
__device__ inline unsigned char* align_atom(unsigned char* p) {
  const uint32_t a = smem_u32(p);
  return p + ((kSwAtomBytes - (a % kSwAtomBytes)) % kSwAtomBytes);
}

// rows x 128 row-major global -> two swizzled 64-column halves `half_bytes` apart, by plain stores.
template <class T>
__device__ void stage_swizzled(unsigned char* dst, const T* src, int rows, int half_bytes) {
  for (int i = threadIdx.x; i < rows * kD; i += kThreads) {
    const int r = i / kD, c = i % kD;
    *reinterpret_cast<T*>(dst + (c / 64) * half_bytes + sw128_offset(r, c % 64)) = src[i];
  }
}

// S = Q·Kᵀ over head_dim 128: 8 k16 steps, 4 per 64-column half, each 32 bytes further into the
// swizzled rows.
template <class T, int N>
__device__ void qk_mma(float (&d)[N / 2], const unsigned char* sq, const unsigned char* sk) {
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = (kk % 4) * 32;
    const uint64_t a = desc_k_major(smem_u32(sq + (kk / 4) * kHalfBytes64) + off);
    const uint64_t b = desc_k_major(smem_u32(sk + (kk / 4) * N * 128) + off);
    wgmma_ss<T, N>(d, a, b, kk > 0);
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(d);
}

// The accumulator fragment (wgmma.cuh's header) -> row-major out[64][N].
template <int N>
__device__ void store_acc(const float (&d)[N / 2], float* out) {
  const int w = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      out[(16 * w + g) * N + 8 * j + 2 * t + e] = d[4 * j + e];
      out[(16 * w + 8 + g) * N + 8 * j + 2 * t + e] = d[4 * j + 2 + e];
    }
}

template <class T, int N>
__global__ void __launch_bounds__(kThreads) qk_tile_kernel(const T* q, const T* k, float* s) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sq = align_atom(smem_raw);
  unsigned char* sk = sq + 2 * kHalfBytes64;
  stage_swizzled(sq, q, 64, kHalfBytes64);
  stage_swizzled(sk, k, N, N * 128);
  fence_async_shared();
  __syncthreads();
  float d[N / 2] = {};
  qk_mma<T, N>(d, sq, sk);
  store_acc<N>(d, s);
}

template <class T>
__global__ void __launch_bounds__(kThreads) pv_tile_kernel(const T* p, const T* v, float* o) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* sv = align_atom(smem_raw);
  stage_swizzled(sv, v, 64, kHalfBytes64);
  fence_async_shared();
  __syncthreads();
  // P's A fragments, one per 16 keys: a0 (g, 2t), a1 (g + 8, 2t), a2 (g, 2t + 8), a3 (g + 8, 2t + 8).
  const int w = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  const uint32_t* p32 = reinterpret_cast<const uint32_t*>(p);
  uint32_t a[4][4];
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int r = 0; r < 4; ++r) a[ks][r] = p32[((16 * w + g + 8 * (r & 1)) * 64 + 16 * ks + 2 * t + 8 * (r >> 1)) / 2];
  float d[kD / 2] = {};
  wgmma_fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    wgmma_rs_tb<T, kD>(d, a[ks], desc_mn_major(smem_u32(sv + ks * 16 * 128), kHalfBytes64), ks > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_regs(d);
  store_acc<kD>(d, o);
}

template <class T>
__global__ void __launch_bounds__(kThreads) tma_qk_tile_kernel(const __grid_constant__ CUtensorMap kmap,
                                                               const int32_t* pages, int32_t page_size,
                                                               int32_t kvh, const T* q, float* s, uint8_t* dump) {
  extern __shared__ unsigned char smem_raw[];
  __shared__ uint64_t full;
  unsigned char* sk = align_atom(smem_raw);
  unsigned char* sq = sk + 2 * kHalfBytes64;
  if (threadIdx.x == 0) {
    mbar_init(&full, 1);
    fence_mbar_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_arrive_expect_tx(&full, 2 * kHalfBytes64);
    for (int pg = 0; pg < 64 / page_size; ++pg)
      for (int half = 0; half < 2; ++half)
        tma_load_4d(sk + half * kHalfBytes64 + pg * page_size * 128, &kmap, &full, half * 64, 0, kvh, pages[pg]);
  }
  stage_swizzled(sq, q, 64, kHalfBytes64);
  fence_async_shared();
  __syncthreads();
  mbar_wait(&full, 0);
  float d[32] = {};
  qk_mma<T, 64>(d, sq, sk);
  store_acc<64>(d, s);
  for (int i = threadIdx.x; i < 2 * kHalfBytes64 / 16; i += kThreads)
    reinterpret_cast<uint4*>(dump)[i] = reinterpret_cast<const uint4*>(sk)[i];
}

template <class K>
cudaError_t with_smem(K kernel, size_t bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

}  // namespace

cudaError_t run_qk_tile(Storage dt, int n_keys, const void* q, const void* k, float* s, cudaStream_t stream) {
  return dispatch_storage16(dt, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const size_t bytes = kSwAtomBytes + 2 * kHalfBytes64 + size_t(n_keys) * 2 * 128;
    auto launch = [&](auto kernel) {
      if (cudaError_t e = with_smem(kernel, bytes); e != cudaSuccess) return e;
      kernel<<<1, kThreads, bytes, stream>>>(static_cast<const T*>(q), static_cast<const T*>(k), s);
      return cudaGetLastError();
    };
    if (n_keys == 64) return launch(qk_tile_kernel<T, 64>);
    if (n_keys == 128) return launch(qk_tile_kernel<T, 128>);
    return cudaErrorInvalidValue;
  });
}

cudaError_t run_pv_tile(Storage dt, const void* p, const void* v, float* o, cudaStream_t stream) {
  return dispatch_storage16(dt, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const size_t bytes = kSwAtomBytes + 2 * kHalfBytes64;
    if (cudaError_t e = with_smem(pv_tile_kernel<T>, bytes); e != cudaSuccess) return e;
    pv_tile_kernel<T><<<1, kThreads, bytes, stream>>>(static_cast<const T*>(p), static_cast<const T*>(v), o);
    return cudaGetLastError();
  });
}

cudaError_t run_tma_qk_tile(Storage dt, const CUtensorMap& kmap, const int32_t* pages, int32_t page_size,
                            int32_t kvh, const void* q, float* s, uint8_t* dump, cudaStream_t stream) {
  // Each page lands at a multiple of page_size rows: atoms stay whole when page_size is a
  // multiple of 8.
  if (page_size < 8 || page_size > 64 || page_size % 8 != 0 || 64 % page_size != 0) return cudaErrorInvalidValue;
  return dispatch_storage16(dt, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    const size_t bytes = kSwAtomBytes + 4 * kHalfBytes64;
    if (cudaError_t e = with_smem(tma_qk_tile_kernel<T>, bytes); e != cudaSuccess) return e;
    tma_qk_tile_kernel<T><<<1, kThreads, bytes, stream>>>(kmap, pages, page_size, kvh, static_cast<const T*>(q), s,
                                                          dump);
    return cudaGetLastError();
  });
}

}  // namespace sieve::kernels::cuda::sm90
