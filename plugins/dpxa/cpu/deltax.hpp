// DeltaXAttention (paper 001 §4.2) on the CPU, its two decisions: which kept tiles are exact and
// each key block's Delta-KV packing. DeltaX attends DPXA's kept tiles, the diagonal tiles, the
// sink tile and the highest-scoring `exact_top` share of the others exactly and every other kept
// tile through its packed keys/values (each key block packed on its own, core/packing) with
// ln(count) added to a packed logit, one softmax per query row: the core kernel's attention
// variant computes that (cpu/deltax_attend_cpu.cpp describes it).
#pragma once
#include <cstdint>
#include <vector>

namespace sieve::dpxa::deltax {

// Which of a row's kept key blocks are computed exactly: the diagonal ones (j >= diag_first), the
// sink (j = 0), and the ceil(exact_top · n) of the other n kept blocks with the largest share
// (ties: lower j first). kept[0..n_kept) ascending; shares indexed by key block. exact[i] is for
// kept[i]. Returns the number of packed (not exact) blocks.
int32_t exact_tiles(const int32_t* kept, int32_t n_kept, int32_t diag_first, const float* shares,
                    float exact_top, uint8_t* exact, std::vector<int32_t>& scratch);

// The packed keys of one (sequence, KV head): Delta-KV's keep walk with chunk = B, so every key
// block starts with an anchor and no run crosses a block; anchors of key block j are
// [first[j], first[j + 1]) in `anchor` (positions), each standing for reach - anchor + 1 keys.
struct TilePack {
  std::vector<uint8_t> keep;
  std::vector<int32_t> anchor, reach, first;
};
void pack_tiles(const float* k, int32_t n, int32_t d, int32_t B, float pack_threshold,
                TilePack& out);

}  // namespace sieve::dpxa::deltax
