// Numeric bounds for tests, derived from the arithmetic instead of observed on one machine
// (docs/testing.md). A bound is: unit roundoff of the precision the code computes in x the number
// of roundings the result goes through x the magnitude of what is summed, times kSafety.
//
// The sums use Higham's worst case gamma_n = n u / (1 - n u) (Accuracy and Stability of Numerical
// Algorithms, 2nd ed., Lemma 3.1 and §3.1): an n-term sum or dot product rounded in precision u is
// off by at most gamma_n * sum |terms| in ANY order of additions. That is what makes a bound hold
// for every BLAS kernel (AVX2, AVX-512, Zen), SIMD width, FMA contraction, thread split and GPU
// reduction tree: it does not assume the order, so no CPU can exceed it. Typical errors are
// ~sqrt(n) u (random rounding), so these bounds sit 10-5000x above what a run shows, still far
// below what a real bug gives (a dropped key, a wrong normaliser): docs/testing.md, step 4.
#pragma once
#include <dlpack/dlpack.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace sieve::tolerance {

// Unit roundoff u = 2^-p, p the significand bits with the implicit one: the largest relative
// error of one round-to-nearest.
inline constexpr double kF64 = 0x1p-53;
inline constexpr double kF32 = 0x1p-24;
inline constexpr double kF16 = 0x1p-11;
inline constexpr double kBf16 = 0x1p-8;

inline double unit_roundoff(DLDataType t) {
  if (t.code == kDLBfloat && t.bits == 16) return kBf16;
  if (t.code == kDLFloat && t.bits == 16) return kF16;
  if (t.code == kDLFloat && t.bits == 32) return kF32;
  if (t.code == kDLFloat && t.bits == 64) return kF64;
  throw std::invalid_argument("unit_roundoff: not a float dtype");
}

// The largest 2-norm of the rows of a row-major [rows, d] f32 array: the magnitude that bounds a
// dot product with, or a weighted average of, those rows.
inline double max_row_norm(const float* x, int64_t rows, int64_t d) {
  double m = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double n = 0;
    for (int64_t i = 0; i < d; ++i) n += double(x[r * d + i]) * x[r * d + i];
    m = std::max(m, std::sqrt(n));
  }
  return m;
}

// The margin on every bound below, for what the model leaves out: second-order terms, libm and
// CUDA exp/exp2f/log being up to 2 ulp rather than 0.5, the log2(e) pre-scaling of exp2f kernels,
// tensor-core f32 accumulation that truncates (up to 2u per addition rather than u).
inline constexpr double kSafety = 2;

// Worst-case relative error of an n-term sum (or dot product) in precision u, any order:
// |fl(sum) - sum| <= gamma(n, u) * sum |terms|.
inline double gamma(int64_t n, double u) {
  const double nu = double(n) * u;
  if (nu >= 1) throw std::invalid_argument("gamma: n u >= 1, no error bound");
  return nu / (1 - nu);
}

// One softmax-weighted sum o = sum_k p_k v_k with p = softmax(scale q.k) over `keys` keys of
// `head_dim`-term logits (an attention output row, any kernel shape: two-pass, online/tiled,
// split and merged), rounded in precision u, against exact arithmetic on the same stored inputs.
// Returns e with |o_x - o*_x| <= e * max_k |v_k,x| for every element (and the row's 2-norm error
// <= e * max_k ||v_k||: the same bound elementwise). `logit_scale` bounds scale * sum_i |q_i k_i|
// (Cauchy-Schwarz: scale * max ||q|| * max ||k||). Terms:
//   - each logit is a head_dim-term dot product, plus the scale multiply (twice for a pre-scaled
//     q) and the shift s - max: gamma(head_dim + 3) * logit_scale absolute, which moves its
//     weight exp(s - max) by that relatively, and every weight again through the normaliser: x2;
//   - exp itself: u per weight, again x2 through the normaliser;
//   - the normaliser and the numerator are keys-term sums, each partial sum also rescaled at most
//     once per key by an online softmax: gamma(2 keys) each; the final division: u;
//   - `u_weights`: the weights rounded before P.V (16-bit MMA operands), 0 when they stay in u;
//   - `u_out`: the output stored in a narrower dtype than u (|o_x| <= max |v_k,x|), 0 otherwise.
inline double softmax_sum(int64_t keys, int64_t head_dim, double logit_scale, double u,
                          double u_weights = 0, double u_out = 0) {
  const double logits = 2 * gamma(head_dim + 3, u) * logit_scale;
  const double sums = 2 * gamma(2 * keys, u) + 3 * u;
  return kSafety * (logits + sums + u_weights) + u_out;
}

// The log-sum-exp of the same row, lse = max + log(sum_k exp(s_k - max)): absolute error. The
// max is one logit (gamma(head_dim + 3) * logit_scale off); the sum is off by the relative error
// of softmax_sum's normaliser, which log turns into an absolute one; log and the final add round
// once each, relative to |lse| <= logit_scale + log(keys).
inline double log_sum_exp(int64_t keys, int64_t head_dim, double logit_scale, double u) {
  const double sum = gamma(2 * keys, u) + 2 * u;
  const double lse = logit_scale + std::log(double(std::max<int64_t>(keys, 1)));
  return kSafety * (gamma(head_dim + 3, u) * logit_scale + sum + 2 * u * lse);
}

}  // namespace sieve::tolerance
