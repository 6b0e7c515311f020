// cuda/raas_cuda.hpp's kernels and the pinned stamp mirror.
#include <cuda_runtime.h>

#include <cmath>
#include <utility>

#include "cuda/raas_cuda.hpp"

namespace sieve::raas {
namespace {

constexpr int kThreads = 256;

const char* launched() noexcept {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

// x * scale - top, both rounded (no fused multiply-add), as the CPU computes it in float.
__device__ __forceinline__ float scaled_minus(float s, float scale, float top) {
  return __fsub_rn(__fmul_rn(s, scale), top);
}

// Block (q head h, sequence b): max over the sequence's pages of the scaled bound, then
// Σ exp(double(x - max)) — the softmax denominator of the CPU's stamp_head.
__global__ void __launch_bounds__(kThreads) head_softmax_stats(AlphaFlagsLaunch a) {
  const int32_t h = int32_t(blockIdx.x), b = int32_t(blockIdx.y);
  const int32_t begin = a.kv_indptr[b], n = a.kv_indptr[b + 1] - begin;
  const float* row = a.scores + int64_t(h) * a.nnz + begin;
  __shared__ float smax[kThreads];
  __shared__ double ssum[kThreads];
  float m = -INFINITY;
  for (int32_t j = int32_t(threadIdx.x); j < n; j += kThreads) m = fmaxf(m, __fmul_rn(row[j], a.scale));
  smax[threadIdx.x] = m;
  __syncthreads();
  for (int off = kThreads / 2; off > 0; off /= 2) {
    if (int(threadIdx.x) < off) smax[threadIdx.x] = fmaxf(smax[threadIdx.x], smax[threadIdx.x + off]);
    __syncthreads();
  }
  const float top = smax[0];
  double s = 0.0;
  for (int32_t j = int32_t(threadIdx.x); j < n; j += kThreads) s += exp(double(scaled_minus(row[j], a.scale, top)));
  ssum[threadIdx.x] = s;
  __syncthreads();
  for (int off = kThreads / 2; off > 0; off /= 2) {
    if (int(threadIdx.x) < off) ssum[threadIdx.x] += ssum[threadIdx.x + off];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    a.head_max[int64_t(b) * a.n_q_heads + h] = top;
    a.head_sum[int64_t(b) * a.n_q_heads + h] = ssum[0];
  }
}

// Thread per (sequence b, page j): stamped when any q head's normalised score exceeds alpha.
__global__ void __launch_bounds__(kThreads) alpha_flags(AlphaFlagsLaunch a) {
  const int32_t b = int32_t(blockIdx.y);
  const int32_t j = int32_t(blockIdx.x) * kThreads + int32_t(threadIdx.x);
  const int32_t begin = a.kv_indptr[b], n = a.kv_indptr[b + 1] - begin;
  if (j >= n) return;
  uint8_t stamped = 0;
  for (int32_t h = 0; h < a.n_q_heads && !stamped; ++h) {
    const int64_t bh = int64_t(b) * a.n_q_heads + h;
    const float x = scaled_minus(a.scores[int64_t(h) * a.nnz + begin + j], a.scale, a.head_max[bh]);
    stamped = exp(double(x)) / a.head_sum[bh] > a.alpha ? 1 : 0;
  }
  a.flags[begin + j] = stamped;
}

// Block per row: mark the row's pages (several rows may mark one page: the same byte value).
__global__ void __launch_bounds__(kThreads) mark_rows(MarkRowsLaunch a) {
  const int32_t r = int32_t(blockIdx.x);
  const int32_t from = a.row_indptr[r], to = a.row_indptr[r + 1];
  const int32_t base = *a.seg_begin;
  for (int32_t i = from + int32_t(threadIdx.x); i < to; i += kThreads) a.flags[base + a.row_indices[i]] = 1;
}

}  // namespace

const char* launch_alpha_flags(const AlphaFlagsLaunch& a) noexcept {
  if (a.batch <= 0 || a.max_pages <= 0 || a.n_q_heads <= 0) return nullptr;
  auto s = static_cast<cudaStream_t>(a.stream);
  head_softmax_stats<<<dim3(unsigned(a.n_q_heads), unsigned(a.batch)), kThreads, 0, s>>>(a);
  if (const char* e = launched()) return e;
  alpha_flags<<<dim3(unsigned((a.max_pages + kThreads - 1) / kThreads), unsigned(a.batch)), kThreads, 0, s>>>(a);
  return launched();
}

const char* launch_mark_rows(const MarkRowsLaunch& a) noexcept {
  if (a.n_rows <= 0) return nullptr;
  mark_rows<<<unsigned(a.n_rows), kThreads, 0, static_cast<cudaStream_t>(a.stream)>>>(a);
  return launched();
}

const char* zero_async(void* device_ptr, size_t bytes, void* stream) noexcept {
  if (bytes == 0) return nullptr;
  const cudaError_t e = cudaMemsetAsync(device_ptr, 0, bytes, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

StampMirror::StampMirror(void* host, size_t bytes) {
  cudaError_t e = cudaHostRegister(host, bytes, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();
    error_ = cudaGetErrorString(e);
    return;
  }
  host_ = host;
  cudaEvent_t ev = nullptr;
  e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    error_ = cudaGetErrorString(e);
    release();
    return;
  }
  event_ = ev;
  error_ = nullptr;
}

StampMirror::~StampMirror() { release(); }

StampMirror::StampMirror(StampMirror&& o) noexcept
    : host_(std::exchange(o.host_, nullptr)),
      event_(std::exchange(o.event_, nullptr)),
      error_(std::exchange(o.error_, "moved from")) {}

StampMirror& StampMirror::operator=(StampMirror&& o) noexcept {
  if (this != &o) {
    release();
    host_ = std::exchange(o.host_, nullptr);
    event_ = std::exchange(o.event_, nullptr);
    error_ = std::exchange(o.error_, "moved from");
  }
  return *this;
}

void StampMirror::release() noexcept {
  if (event_) {
    cudaEventSynchronize(static_cast<cudaEvent_t>(event_));  // no copy may still target host_
    cudaEventDestroy(static_cast<cudaEvent_t>(event_));
    event_ = nullptr;
  }
  if (host_) {
    cudaHostUnregister(host_);
    host_ = nullptr;
  }
}

const char* StampMirror::copy_async(size_t offset, const void* device_src, size_t bytes, void* stream) noexcept {
  if (error_) return error_;
  auto s = static_cast<cudaStream_t>(stream);
  cudaError_t e = bytes ? cudaMemcpyAsync(static_cast<char*>(host_) + offset, device_src, bytes,
                                          cudaMemcpyDeviceToHost, s)
                        : cudaSuccess;
  if (e == cudaSuccess) e = cudaEventRecord(static_cast<cudaEvent_t>(event_), s);
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* StampMirror::upload_async(size_t offset, void* device_dst, size_t bytes, void* stream) noexcept {
  if (error_) return error_;
  if (bytes == 0) return nullptr;
  const cudaError_t e = cudaMemcpyAsync(device_dst, static_cast<const char*>(host_) + offset, bytes,
                                        cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream));
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* StampMirror::wait() noexcept {
  if (error_) return error_;
  const cudaError_t e = cudaEventSynchronize(static_cast<cudaEvent_t>(event_));
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace sieve::raas
