// DeltaXAttention's CPU arithmetic (see deltax.hpp).
#include "cpu/deltax.hpp"

#include <algorithm>
#include <cmath>

#include "sieve/packing/pack_cpu.hpp"

namespace sieve::dpxa::deltax {

int32_t exact_tiles(const int32_t* kept, int32_t n_kept, int32_t diag_first, const float* shares,
                    float exact_top, uint8_t* exact, std::vector<int32_t>& scratch) {
  scratch.clear();  // indices into kept[] of the rankable (off-diagonal, non-sink) blocks
  for (int32_t i = 0; i < n_kept; ++i) {
    const int32_t j = kept[i];
    exact[i] = j == 0 || j >= diag_first;
    if (!exact[i]) scratch.push_back(i);
  }
  const int32_t n = int32_t(scratch.size());
  // ceil, so any exact_top > 0 keeps at least one; the 1e-6 absorbs float products like 0.3·10.
  const int32_t top = std::min(n, int32_t(std::ceil(double(exact_top) * n - 1e-6)));
  std::stable_sort(scratch.begin(), scratch.end(), [&](int32_t a, int32_t b) {
    return shares[kept[a]] > shares[kept[b]];  // stable: equal shares keep the lower block first
  });
  for (int32_t r = 0; r < top; ++r) exact[scratch[size_t(r)]] = 1;
  return n - top;
}

void pack_tiles(const float* k, int32_t n, int32_t d, int32_t B, float pack_threshold,
                TilePack& out) {
  const packing::KeepRule rule{packing::kDelta, packing::kCos, pack_threshold, 1.0, 0, B};
  out.keep.resize(size_t(n));
  out.anchor.resize(size_t(n));
  out.reach.resize(size_t(n));
  packing::keep_mask(rule, 0, 0, k, n, d, out.keep.data());
  const int32_t m = packing::pack(out.keep.data(), n, out.anchor.data(), out.reach.data());
  // Chunks are the key blocks, so block j's anchors are those at positions [jB, (j+1)B).
  const int32_t blocks = (n + B - 1) / B;
  out.first.assign(size_t(blocks) + 1, m);
  for (int32_t a = m - 1; a >= 0; --a) out.first[size_t(out.anchor[size_t(a)] / B)] = a;
}

}  // namespace sieve::dpxa::deltax
