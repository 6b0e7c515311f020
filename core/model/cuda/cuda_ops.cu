// The CUDA backend: cuBLAS (f32, no TF32: CPU and CUDA logits must agree to 1e-4) for the
// projections, and one small kernel each for the embedding gather, RMSNorm, RoPE, SwiGLU and the
// row gather. Everything is enqueued on the host's stream.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "../src/ops.hpp"
#include "sieve/util/error.hpp"

namespace sieve::model::detail {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(SIEVE_ERR_DEVICE, std::string("model (CUDA): ") + what + ": " + cudaGetErrorString(e));
}
void check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail(SIEVE_ERR_DEVICE, std::string("model (cuBLAS): ") + what + ": status " + std::to_string(int(s)));
}

__global__ void embed_kernel(const int32_t* tokens, int32_t dim, const float* table, float* out) {
  const int32_t t = blockIdx.x;
  const float* row = table + int64_t(tokens[t]) * dim;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) out[int64_t(t) * dim + i] = row[i];
}

__global__ void gather_kernel(const float* x, const int32_t* rows, int32_t dim, float* out) {
  const int32_t r = blockIdx.x;
  const float* row = x + int64_t(rows[r]) * dim;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) out[int64_t(r) * dim + i] = row[i];
}

// One block per row; the sum of squares is reduced over the block.
__global__ void rmsnorm_kernel(const float* x, const float* w, int32_t dim, float eps, float* out) {
  __shared__ float partial[32];
  const float* xr = x + int64_t(blockIdx.x) * dim;
  float ss = 0.f;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < (blockDim.x + 31) / 32 ? partial[threadIdx.x] : 0.f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x == 0) partial[0] = ss;
  }
  __syncthreads();
  const float inv = 1.f / sqrtf(partial[0] / float(dim) + eps);
  float* o = out + int64_t(blockIdx.x) * dim;
  for (int32_t i = threadIdx.x; i < dim; i += blockDim.x) o[i] = w[i] * (inv * xr[i]);
}

// One thread per (token, head, pair).
__global__ void rope_kernel(float* x, int64_t pairs, int32_t n_heads, int32_t head_dim, const int32_t* positions,
                            float theta) {
  const int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (p >= pairs) return;
  const int32_t half = head_dim / 2;
  const int32_t i = int32_t(p % half) * 2;
  const int64_t th = p / half;  // token * n_heads + head
  const int64_t t = th / n_heads;
  float* v = x + th * head_dim;
  const float freq = 1.f / powf(theta, float(i) / float(head_dim));
  const float a = float(positions[t]) * freq;
  const float c = cosf(a), s = sinf(a);
  const float v0 = v[i], v1 = v[i + 1];
  v[i] = v0 * c - v1 * s;
  v[i + 1] = v0 * s + v1 * c;
}

__global__ void swiglu_kernel(float* gate, const float* up, int64_t count) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= count) return;
  const float g = gate[i];
  gate[i] = g / (1.f + expf(-g)) * up[i];
}

__global__ void bias_kernel(float* y, const float* bias, int32_t out_dim, int64_t count) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) y[i] += bias[i % out_dim];
}

unsigned blocks(int64_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

class CudaOps final : public Ops {
 public:
  CudaOps(DLDevice device, void* stream) : stream_(static_cast<cudaStream_t>(stream)) {
    check(cudaSetDevice(device.device_id), "cudaSetDevice");
    check(cublasCreate(&handle_), "cublasCreate");
    check(cublasSetStream(handle_, stream_), "cublasSetStream");
    // Plain f32 arithmetic: no TF32 tensor-core rounding.
    check(cublasSetMathMode(handle_, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  }
  ~CudaOps() override {
    cudaStreamSynchronize(stream_);
    cublasDestroy(handle_);
  }

  void* alloc(size_t bytes) override {
    void* p = nullptr;
    check(cudaMalloc(&p, std::max<size_t>(bytes, 1)), "cudaMalloc");
    return p;
  }
  void free(void* p) override {
    if (p) cudaFree(p);
  }
  void to_device(void* dst, const void* src, size_t bytes) override {
    // Synchronous with respect to the host buffer (it may be reused right after the call).
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "copy to device");
    check(cudaStreamSynchronize(stream_), "copy to device");
  }
  void to_host(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "copy to host");
    check(cudaStreamSynchronize(stream_), "copy to host");
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "device copy");
  }

  void embed(const int32_t* tokens, int32_t n, const float* table, int32_t dim, float* out) override {
    if (n == 0) return;
    embed_kernel<<<unsigned(n), 128, 0, stream_>>>(tokens, dim, table, out);
    check(cudaGetLastError(), "embed kernel");
  }
  void rmsnorm(const float* x, const float* w, int32_t n, int32_t dim, float eps, float* out) override {
    if (n == 0) return;
    rmsnorm_kernel<<<unsigned(n), 256, 0, stream_>>>(x, w, dim, eps, out);
    check(cudaGetLastError(), "rmsnorm kernel");
  }
  void matmul(const float* x, int32_t n, int32_t in, const float* w, int32_t out_dim, const float* bias, float* y,
              bool accumulate) override {
    if (n == 0) return;
    // Column-major view: Y^T [out, n] = W [in, out]^T · X^T [in, n].
    const float alpha = 1.f, beta = accumulate ? 1.f : 0.f;
    check(cublasSgemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out_dim, n, in, &alpha, w, in, x, in, &beta, y, out_dim),
          "cublasSgemm");
    if (bias) {
      const int64_t count = int64_t(n) * out_dim;
      bias_kernel<<<blocks(count, 256), 256, 0, stream_>>>(y, bias, out_dim, count);
      check(cudaGetLastError(), "bias kernel");
    }
  }
  void rope(float* x, int32_t n, int32_t n_heads, int32_t head_dim, const int32_t* positions, float theta) override {
    const int64_t pairs = int64_t(n) * n_heads * (head_dim / 2);
    if (pairs == 0) return;
    rope_kernel<<<blocks(pairs, 256), 256, 0, stream_>>>(x, pairs, n_heads, head_dim, positions, theta);
    check(cudaGetLastError(), "rope kernel");
  }
  void swiglu(float* gate, const float* up, int64_t count) override {
    if (count == 0) return;
    swiglu_kernel<<<blocks(count, 256), 256, 0, stream_>>>(gate, up, count);
    check(cudaGetLastError(), "swiglu kernel");
  }
  void gather_rows(const float* x, const int32_t* rows, int32_t m, int32_t dim, float* out) override {
    if (m == 0) return;
    gather_kernel<<<unsigned(m), 128, 0, stream_>>>(x, rows, dim, out);
    check(cudaGetLastError(), "gather kernel");
  }

 private:
  cudaStream_t stream_;
  cublasHandle_t handle_ = nullptr;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(DLDevice device, void* stream) {
  return std::make_unique<CudaOps>(device, stream);
}

}  // namespace sieve::model::detail
