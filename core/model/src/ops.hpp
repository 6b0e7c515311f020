// The dense, non-attention math of the forward pass on one device: what the engine asks of the
// CPU (OpenBLAS + loops) and of CUDA (cuBLAS + the small kernels in cuda/). Attention is not
// here: it runs only through the runtime's LayerRunner.
//
// Every pointer is device memory of the backend, every matrix row-major. Calls on CUDA are
// enqueued on the host's stream and never synchronise, except the copies to the host.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include <dlpack/dlpack.h>

namespace sieve::model::detail {

class Ops {
 public:
  virtual ~Ops() = default;
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void to_device(void* dst, const void* src, size_t bytes) = 0;  // host → device
  virtual void to_host(void* dst, const void* src, size_t bytes) = 0;    // device → host, synced
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;       // device → device

  // out[t] = table[tokens[t]]: [n, dim]
  virtual void embed(const int32_t* tokens, int32_t n, const float* table, int32_t dim, float* out) = 0;
  // out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w
  virtual void rmsnorm(const float* x, const float* w, int32_t n, int32_t dim, float eps, float* out) = 0;
  // y[n, out] (+)= x[n, in] · W[out, in]^T (+ bias[out] when given); accumulate adds into y.
  virtual void matmul(const float* x, int32_t n, int32_t in, const float* w, int32_t out_dim, const float* bias,
                      float* y, bool accumulate) = 0;
  // In place on x [n, n_heads * head_dim]: rotate channel pairs (2i, 2i+1) of every head by
  // positions[t] * theta^(-2i / head_dim).
  virtual void rope(float* x, int32_t n, int32_t n_heads, int32_t head_dim, const int32_t* positions,
                    float theta) = 0;
  // gate[i] = silu(gate[i]) * up[i], i < count
  virtual void swiglu(float* gate, const float* up, int64_t count) = 0;
  // out[r] = x[rows[r]]: [m, dim]
  virtual void gather_rows(const float* x, const int32_t* rows, int32_t m, int32_t dim, float* out) = 0;
};

std::unique_ptr<Ops> make_cpu_ops();
// `stream` is the host's cudaStream_t; throws sieve::Error when CUDA is not built or fails.
std::unique_ptr<Ops> make_cuda_ops(DLDevice device, void* stream);

}  // namespace sieve::model::detail
