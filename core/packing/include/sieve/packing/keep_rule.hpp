// Delta-KV's keep rule (paper 001 §4.1.1), shared by the CPU paths and the CUDA kernels (host +
// device) so every path makes bit-identical keep decisions:
//  - key dot products accumulate in a fixed order: "lane" l (0..31) sums dimensions l, l + 32, ...
//    with fused multiply-adds, then the 32 partial sums meet in an xor butterfly (the order a warp
//    reduction uses; a + b == b + a in IEEE, so every lane ends with the same value);
//  - the keep rule of each packing (delta: cosine / Euclidean against the run's anchor;
//    periodic; random by a hash of (seed, layer, KV head, position)).
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SIEVE_PACK_HD __host__ __device__ __forceinline__
#else
#define SIEVE_PACK_HD inline
#endif

namespace sieve::packing {

enum Metric : int32_t { kCos = 0, kL2 = 1 };
enum Packing : int32_t { kDelta = 0, kPeriodic = 1, kRandom = 2 };

constexpr int kLanes = 32;

// What the keep walk needs (plain values: passed to kernels by value).
struct KeepRule {
  int32_t packing;   // Packing
  int32_t metric;    // Metric (delta)
  float threshold;   // delta: cos keeps when cos < threshold, l2 when distance > threshold
  double keep;       // periodic / random: kept fraction = 1 - reduction
  uint64_t seed;     // random
  int32_t chunk;     // tokens per chunk; the first key of every chunk is an anchor
};

// The three sums a delta decision needs, for key a (the candidate) and key b (the anchor).
struct Sums {
  float dot, aa, bb, diff2;  // a·b, a·a, b·b, |a - b|²
};

// The xor butterfly over 32 partial sums, as __shfl_xor_sync(…, 16, 8, 4, 2, 1) computes it
// (host only: the kernels shuffle).
inline float butterfly32(float* p) {
  for (int o = 16; o > 0; o >>= 1) {
    float next[kLanes];
    for (int l = 0; l < kLanes; ++l) next[l] = p[l] + p[l ^ o];
    for (int l = 0; l < kLanes; ++l) p[l] = next[l];
  }
  return p[0];
}

// Host order of the sums (the CUDA keep kernel computes the same with one lane per slot).
inline Sums key_sums(const float* a, const float* b, int32_t d) {
  float dot[kLanes], aa[kLanes], bb[kLanes], df[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    dot[l] = aa[l] = bb[l] = df[l] = 0.f;
    for (int32_t i = l; i < d; i += kLanes) {
      const float x = a[i], y = b[i], z = x - y;
      dot[l] = std::fma(x, y, dot[l]);
      aa[l] = std::fma(x, x, aa[l]);
      bb[l] = std::fma(y, y, bb[l]);
      df[l] = std::fma(z, z, df[l]);
    }
  }
  return {butterfly32(dot), butterfly32(aa), butterfly32(bb), butterfly32(df)};
}

// Delta rule: is candidate key a different enough from the anchor b to become an anchor itself?
SIEVE_PACK_HD bool delta_keeps(const KeepRule& r, const Sums& s) {
  if (r.metric == kL2) return sqrtf(s.diff2) > r.threshold;
  const float denom = sqrtf(s.aa * s.bb);
  // Zero vectors: two zeros are the same key (cos 1), a zero and a non-zero are unrelated (cos 0).
  const float cosine = denom > 0.f ? s.dot / denom : (s.aa == 0.f && s.bb == 0.f ? 1.f : 0.f);
  return cosine < r.threshold;
}

// splitmix64: the random packing's keep decision for (layer, KV head, position).
SIEVE_PACK_HD uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Non-adaptive packings: does key `pos` (not the first of its chunk) start a new run?
//  periodic: keeps the keys where floor(i · keep) steps up (i = offset in the chunk), i.e. one key
//            in 1/keep, evenly spaced (keep = 0.5: every other key);
//  random:   keeps each key with probability `keep`, independently (a hash, reproducible).
SIEVE_PACK_HD bool fixed_keeps(const KeepRule& r, int32_t layer, int32_t kvh, int64_t pos) {
  const int64_t i = pos % r.chunk;
  if (r.packing == kPeriodic) return floor(double(i) * r.keep) > floor(double(i - 1) * r.keep);
  const uint64_t h = mix64(r.seed ^ mix64((uint64_t(uint32_t(layer)) << 40) ^
                                          (uint64_t(uint32_t(kvh)) << 32) ^ uint64_t(pos)));
  return double(h >> 11) * (1.0 / 9007199254740992.0) < r.keep;
}

}  // namespace sieve::packing
