// CUDA half of page_bound.hpp.
//   minmax_append: block (touched page t, sequence b); threads over (KV head, channel). The page's
//                  new tokens are read back from the store's pages; the first token of a page
//                  initialises it, later appends fold into the stored min/max (as the CPU).
//   page_bounds:   one warp per (sequence, page, KV head); lane l sums channels l, l + 32, ...,
//                  then a butterfly — the canonical order of page_bound.hpp, so the CPU's bits.
// Templated on the KV storage type only (3 instantiations each); q's dtype is a runtime switch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "sieve/selection/page_bound.hpp"
#include "sieve/selection/page_bound_cuda.hpp"

namespace sieve::selection {
namespace {

constexpr int kAppendThreads = 256;
constexpr int kWarps = 8;  // warps per block of the bound kernel

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

__device__ __forceinline__ float load_any(const void* p, Storage t, int64_t i) {
  switch (t) {
    case Storage::f16: return __half2float(static_cast<const __half*>(p)[i]);
    case Storage::bf16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    default: return static_cast<const float*>(p)[i];
  }
}

template <class T>
__global__ void __launch_bounds__(kAppendThreads) minmax_append(MinMaxAppendLaunch a) {
  const int32_t b = int32_t(blockIdx.y);
  const int32_t ps = a.page_size, d = a.head_dim, H = a.n_kv_heads;
  const int32_t n_pages = a.kv_indptr[b + 1] - a.kv_indptr[b];
  if (n_pages <= 0) return;
  const int64_t len = int64_t(n_pages - 1) * ps + a.last_page_len[b];
  // No new_indptr: recompute the whole sequence (catch-up).
  const int64_t n_new = a.new_indptr ? a.new_indptr[b + 1] - a.new_indptr[b] : len;
  if (n_new <= 0 || n_new > len) return;
  const int64_t first = len - n_new;
  const int64_t logical = first / ps + blockIdx.x;
  if (logical * ps >= len) return;
  const int64_t start = first > logical * ps ? first : logical * ps;
  const int64_t end = len < (logical + 1) * ps ? len : (logical + 1) * ps;
  const int32_t offset = int32_t(start - logical * ps), stop = int32_t(end - logical * ps);
  const int64_t phys = a.kv_indices[a.kv_indptr[b] + logical];
  const T* k = static_cast<const T*>(a.k_pages);
  T* side = static_cast<T*>(a.sidecar);
  for (int32_t i = int32_t(threadIdx.x); i < H * d; i += kAppendThreads) {
    const int32_t h = i / d, c = i % d;
    const int64_t kbase = ((phys * H + h) * ps) * d + c;
    const int64_t sbase = (phys * H + h) * 2 * d + c;
    int32_t t = offset;
    float mn, mx;
    if (offset == 0) {
      mn = mx = to_f32(k[kbase]);
      ++t;
    } else {
      mn = to_f32(side[sbase]);
      mx = to_f32(side[sbase + d]);
    }
    for (; t < stop; ++t) {
      const float v = to_f32(k[kbase + int64_t(t) * d]);
      mn = fminf(mn, v);
      mx = fmaxf(mx, v);
    }
    side[sbase] = from_f32<T>(mn);
    side[sbase + d] = from_f32<T>(mx);
  }
}

template <class T>
__global__ void __launch_bounds__(kWarps * 32) page_bounds(PageBoundLaunch a) {
  const int32_t b = int32_t(blockIdx.y);
  const int32_t lane = int32_t(threadIdx.x) & 31;
  const int32_t Hkv = a.n_kv_heads, d = a.head_dim, G = a.n_q_heads / a.n_kv_heads;
  const int64_t pair = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  const int32_t j = int32_t(pair / Hkv), kh = int32_t(pair % Hkv);
  const int32_t begin = a.kv_indptr[b];
  if (j >= a.kv_indptr[b + 1] - begin) return;
  const int64_t q_row = int64_t(a.qo_indptr[b + 1]) - 1;
  if (q_row < a.qo_indptr[b]) return;
  const int64_t item = int64_t(begin) + j;
  const int64_t phys = a.kv_indices[item];
  const T* mm = static_cast<const T*>(a.sidecar) + (phys * Hkv + kh) * 2 * d;
  float group_best = 0.0f;
  for (int32_t g = 0; g < G; ++g) {
    const int32_t h = kh * G + g;
    const int64_t qbase = (q_row * a.n_q_heads + h) * d;
    float acc = 0.0f;
    for (int32_t c = lane; c < d; c += 32)
      acc = add_rn(acc, bound_term(load_any(a.q, a.q_dtype, qbase + c), to_f32(mm[c]), to_f32(mm[d + c])));
    for (int off = 16; off > 0; off >>= 1) acc = add_rn(acc, __shfl_xor_sync(0xffffffffu, acc, off));
    if (a.group_max) group_best = g == 0 ? acc : fmaxf(group_best, acc);
    else if (lane == 0) a.scores[item * a.layout.item_stride + h * a.layout.head_stride] = acc;
  }
  if (a.group_max && lane == 0)
    a.scores[item * a.layout.item_stride + kh * a.layout.head_stride] = group_best;
}

const char* last_launch_error() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace

const char* launch_minmax_append(const MinMaxAppendLaunch& a) noexcept {
  if (a.batch <= 0 || a.max_pages_touched <= 0) return nullptr;
  const dim3 grid(unsigned(a.max_pages_touched), unsigned(a.batch));
  auto stream = static_cast<cudaStream_t>(a.stream);
  switch (a.kv_dtype) {
    case Storage::f32: minmax_append<float><<<grid, kAppendThreads, 0, stream>>>(a); break;
    case Storage::f16: minmax_append<__half><<<grid, kAppendThreads, 0, stream>>>(a); break;
    case Storage::bf16: minmax_append<__nv_bfloat16><<<grid, kAppendThreads, 0, stream>>>(a); break;
    default: return "min/max append: unsupported KV dtype";
  }
  return last_launch_error();
}

const char* launch_page_bounds(const PageBoundLaunch& a) noexcept {
  if (a.batch <= 0 || a.max_pages <= 0) return nullptr;
  if (a.n_kv_heads <= 0 || a.n_q_heads % a.n_kv_heads != 0) return "page bounds: bad head counts";
  const int64_t pairs = int64_t(a.max_pages) * a.n_kv_heads;
  const dim3 grid(unsigned((pairs + kWarps - 1) / kWarps), unsigned(a.batch));
  auto stream = static_cast<cudaStream_t>(a.stream);
  switch (a.kv_dtype) {
    case Storage::f32: page_bounds<float><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case Storage::f16: page_bounds<__half><<<grid, kWarps * 32, 0, stream>>>(a); break;
    case Storage::bf16: page_bounds<__nv_bfloat16><<<grid, kWarps * 32, 0, stream>>>(a); break;
    default: return "page bounds: unsupported KV dtype";
  }
  return last_launch_error();
}

}  // namespace sieve::selection
