// Delta-KV on the CPU, one (sequence, KV head) at a time over an f32 copy of its keys: stage 1
// (keep mask) and stage 2 (anchors and their reach) from core/packing; stage 3 is the core
// kernel's attention variant (deltakv_math.hpp's variant_spans). The plugin's CPU path and the
// tests use these; the CUDA kernels follow the same formulas.
#pragma once
#include <cstdint>

#include "deltakv_math.hpp"
#include "sieve/packing/pack_cpu.hpp"

namespace sieve::deltakv {

// Stages 1-2 (keep mask, pack) are the shared CPU packing of core/packing.
using packing::keep_mask;
using packing::pack;

// What stage 3 needs besides the packed lists (the variant's rows and spans).
struct AttendRule {
  int32_t q_block;      // query block of the safe-anchor test (positions from 0)
  int32_t phase2;       // Phase2
  bool count_weighting; // add ln(count) to each anchor's logit
  float scale;          // logit scale
};

}  // namespace sieve::deltakv
