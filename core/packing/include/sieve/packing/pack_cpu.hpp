// Delta-KV's stages 1-2 on the CPU over one head's contiguous f32 keys: the keep mask (which keys
// are anchors) and the packed list (each anchor's position and the last position its run
// covers). The deltakv plugin packs whole sequences in chunks of 512; dpxa's mode=deltax packs
// per key block (chunk = block), so every tile has its own independent packed keys.
#pragma once
#include <algorithm>
#include <cstdint>

#include "sieve/packing/keep_rule.hpp"

namespace sieve::packing {

// Stage 1: keep[i] = 1 for the anchors among keys k[0..n) ([n][d] f32). Chunks of r.chunk keys
// are independent (each starts with an anchor), which is what lets a CUDA kernel give each
// chunk its own warp. k may be null for the non-delta packings.
inline void keep_mask(const KeepRule& r, int32_t layer, int32_t kvh, const float* k, int32_t n,
                      int32_t d, uint8_t* keep) {
  for (int32_t c0 = 0; c0 < n; c0 += r.chunk) {
    const int32_t c1 = std::min(n, c0 + r.chunk);
    keep[c0] = 1;
    int32_t anchor = c0;
    for (int32_t i = c0 + 1; i < c1; ++i) {
      const bool kept = r.packing == kDelta
                            ? delta_keeps(r, key_sums(k + int64_t(i) * d, k + int64_t(anchor) * d, d))
                            : fixed_keeps(r, layer, kvh, i);
      keep[i] = kept ? 1 : 0;
      if (kept) anchor = i;
    }
  }
}

// Stage 2: the anchors' positions and reach (last position each covers: the next anchor's
// position - 1, or n - 1); counts are reach - anchor + 1. Returns m, the number of anchors.
inline int32_t pack(const uint8_t* keep, int32_t n, int32_t* anchor, int32_t* reach) {
  int32_t m = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (!keep[i]) continue;
    if (m > 0) reach[m - 1] = i - 1;
    anchor[m++] = i;
  }
  if (m > 0) reach[m - 1] = n - 1;
  return m;
}

}  // namespace sieve::packing
