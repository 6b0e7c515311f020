// SeerAttention-R AttnGate arithmetic (paper 002 §2.2, eq. 1), shared verbatim by the CPU plugin,
// the CUDA kernels (host/device inline), the distillation tool and the tests:
//   K branch: concat[max, min, mean] of a block's pre-RoPE keys (3d) -> W_k (d_gate x 3d)
//             -> optional RMSNorm -> RoPE at the block's first token position
//   Q branch: the GQA group's g pre-RoPE query heads, concatenated (g*d) -> W_q (d_gate x g*d)
//             -> optional RMSNorm -> RoPE at the query's position
//   score    = q_gate . k_gate / sqrt(d_gate)
// RoPE is the model's convention (consecutive channel pairs (2i, 2i+1), frequency
// theta^(-2i/d_gate)), applied over the d_gate channels with the model's theta.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SIEVE_SEER_HD __host__ __device__ __forceinline__
#else
#define SIEVE_SEER_HD inline
#endif

namespace sieve::seer {

inline constexpr float kRmsEps = 1e-6f;

// Rotation angle of channel pair (i, i+1) (i even) of an n-channel vector at `pos`: the model's
// formula (core/model cpu_ops rope), in f32.
SIEVE_SEER_HD float rope_angle(int64_t pos, int32_t i, int32_t n, float theta) {
  if (theta <= 0.f) return 0.f;  // theta 0: no rotation (the built-in gates, builtin_gate.hpp)
  const float freq = 1.f / powf(theta, float(i) / float(n));
  return float(pos) * freq;
}

// Rotate x[0..n) in place by RoPE at `pos`; `inverse` rotates back (the transpose, used by the
// distillation's backward pass).
SIEVE_SEER_HD void rope_rotate(float* x, int32_t n, int64_t pos, float theta, bool inverse = false) {
  for (int32_t i = 0; i + 1 < n; i += 2) {
    const float a = rope_angle(pos, i, n, theta);
    const float c = cosf(a), s = inverse ? -sinf(a) : sinf(a);
    const float v0 = x[i], v1 = x[i + 1];
    x[i] = v0 * c - v1 * s;
    x[i + 1] = v0 * s + v1 * c;
  }
}

// Parameter-free RMSNorm: x / sqrt(mean(x^2) + eps). Returns the factor applied.
SIEVE_SEER_HD float rms_normalize(float* x, int32_t n) {
  float ss = 0.f;
  for (int32_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const float r = 1.f / sqrtf(ss / float(n) + kRmsEps);
  for (int32_t i = 0; i < n; ++i) x[i] *= r;
  return r;
}

// y[r] = sum_c W[r * cols + c] * x[c] for r < rows.
SIEVE_SEER_HD void project(const float* W, const float* x, int32_t rows, int32_t cols, float* y) {
  for (int32_t r = 0; r < rows; ++r) {
    float acc = 0.f;
    const float* w = W + int64_t(r) * cols;
    for (int32_t c = 0; c < cols; ++c) acc += w[c] * x[c];
    y[r] = acc;
  }
}

// Pool n_tokens keys of d channels (key(t, c) -> float) into out[3d] = [max | min | mean].
template <class KeyFn>
SIEVE_SEER_HD void pool_block(KeyFn key, int32_t n_tokens, int32_t d, float* out) {
  for (int32_t c = 0; c < d; ++c) {
    float mx = -INFINITY, mn = INFINITY, sum = 0.f;
    for (int32_t t = 0; t < n_tokens; ++t) {
      const float v = key(t, c);
      mx = v > mx ? v : mx;
      mn = v < mn ? v : mn;
      sum += v;
    }
    out[c] = mx;
    out[d + c] = mn;
    out[2 * d + c] = sum / float(n_tokens);
  }
}

// A block's gate key from its pooled keys: W_k x -> (RMSNorm) -> RoPE at first_pos.
// `out` has gate_dim entries.
SIEVE_SEER_HD void gate_key(const float* Wk, const float* pooled, int32_t d, int32_t gate_dim, bool rmsnorm,
                            int64_t first_pos, float theta, float* out) {
  project(Wk, pooled, gate_dim, 3 * d, out);
  if (rmsnorm) rms_normalize(out, gate_dim);
  rope_rotate(out, gate_dim, first_pos, theta);
}

// A query's gate vector from the group's concatenated pre-RoPE query heads (g*d values).
SIEVE_SEER_HD void gate_query(const float* Wq, const float* q_group, int32_t group_dim, int32_t gate_dim,
                              bool rmsnorm, int64_t pos, float theta, float* out) {
  project(Wq, q_group, gate_dim, group_dim, out);
  if (rmsnorm) rms_normalize(out, gate_dim);
  rope_rotate(out, gate_dim, pos, theta);
}

SIEVE_SEER_HD float gate_score(const float* q_gate, const float* k_gate, int32_t gate_dim) {
  float acc = 0.f;
  for (int32_t i = 0; i < gate_dim; ++i) acc += q_gate[i] * k_gate[i];
  return acc / sqrtf(float(gate_dim));
}

}  // namespace sieve::seer
