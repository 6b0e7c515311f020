// The CPU backend: OpenBLAS for the projections, plain loops (vectorisable) for the rest.
#include <cblas.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ops.hpp"
#include "sieve/util/error.hpp"

namespace sieve::model::detail {

namespace {

class CpuOps final : public Ops {
 public:
  void* alloc(size_t bytes) override {
    void* p = std::aligned_alloc(64, (std::max<size_t>(bytes, 1) + 63) / 64 * 64);
    require(p != nullptr, SIEVE_ERR_OUT_OF_MEMORY, "model: cannot allocate " + std::to_string(bytes) + " bytes");
    return p;
  }
  void free(void* p) override { std::free(p); }
  void to_device(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void to_host(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }

  void embed(const int32_t* tokens, int32_t n, const float* table, int32_t dim, float* out) override {
    for (int32_t t = 0; t < n; ++t)
      std::memcpy(out + int64_t(t) * dim, table + int64_t(tokens[t]) * dim, size_t(dim) * 4);
  }

  void rmsnorm(const float* x, const float* w, int32_t n, int32_t dim, float eps, float* out) override {
    for (int32_t t = 0; t < n; ++t) {
      const float* xr = x + int64_t(t) * dim;
      float* o = out + int64_t(t) * dim;
      float ss = 0.f;
      for (int32_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
      const float inv = 1.f / std::sqrt(ss / float(dim) + eps);
      for (int32_t i = 0; i < dim; ++i) o[i] = w[i] * (inv * xr[i]);
    }
  }

  void matmul(const float* x, int32_t n, int32_t in, const float* w, int32_t out_dim, const float* bias, float* y,
              bool accumulate) override {
    const float beta = accumulate ? 1.f : 0.f;
    if (n == 1)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, out_dim, in, 1.f, w, in, x, 1, beta, y, 1);
    else
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out_dim, in, 1.f, x, in, w, in, beta, y, out_dim);
    if (bias)
      for (int32_t t = 0; t < n; ++t)
        for (int32_t o = 0; o < out_dim; ++o) y[int64_t(t) * out_dim + o] += bias[o];
  }

  void rope(float* x, int32_t n, int32_t n_heads, int32_t head_dim, const int32_t* positions,
            float theta) override {
    for (int32_t t = 0; t < n; ++t) {
      const float pos = float(positions[t]);
      for (int32_t h = 0; h < n_heads; ++h) {
        float* v = x + (int64_t(t) * n_heads + h) * head_dim;
        for (int32_t i = 0; i < head_dim; i += 2) {
          const float freq = 1.f / std::pow(theta, float(i) / float(head_dim));
          const float a = pos * freq, c = std::cos(a), s = std::sin(a);
          const float v0 = v[i], v1 = v[i + 1];
          v[i] = v0 * c - v1 * s;
          v[i + 1] = v0 * s + v1 * c;
        }
      }
    }
  }

  void swiglu(float* gate, const float* up, int64_t count) override {
    for (int64_t i = 0; i < count; ++i) {
      const float g = gate[i];
      gate[i] = g / (1.f + std::exp(-g)) * up[i];
    }
  }

  void gather_rows(const float* x, const int32_t* rows, int32_t m, int32_t dim, float* out) override {
    for (int32_t r = 0; r < m; ++r)
      std::memcpy(out + int64_t(r) * dim, x + int64_t(rows[r]) * dim, size_t(dim) * 4);
  }
};

}  // namespace

std::unique_ptr<Ops> make_cpu_ops() { return std::make_unique<CpuOps>(); }

}  // namespace sieve::model::detail
