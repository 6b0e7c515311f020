// dpxa's select on CUDA, the host side: the scratch of one sequence's launches (allocated once,
// when the instance is created) and, per sequence of the call, cuda/dpxa_select.cu's kernels
// (anchors, tile scores, per-row greedy cover, CSR) on the host's stream.
#pragma once
#include <sieve/plugin/policy_base.hpp>
#include <sieve/sieve.h>

#include <cstdint>

#include "call_data.hpp"

namespace sieve::dpxa {

// DeltaX's device hand-over (mode=deltax): the select also leaves each candidate's share and
// ranks the exact tiles (cuda/dpxa_select.hpp's SequenceLaunch says how).
struct DeviceShares {
  float* shares = nullptr;
  uint32_t* exact_bits = nullptr;
  int32_t exact_words = 0;
  float exact_top = 0.f;
};

class CudaSelect {
 public:
  CudaSelect(const sieve_geometry& g, int32_t block, const Allocate& allocate);
  // The call's selection into `selection` (its storage already checked for the worst case).
  void run(const sieve_geometry& g, const SelectConfig& c, const sieve_layer_call& call, const sieve_paged_kv& view,
           sieve_selection& selection, void* stream, const DeviceShares* deltax) const;

 private:
  plugin::HostBuffer q_anchors_, q_counts_, k_anchors_, k_counts_, tiles_, keep_, row_counts_;
};

}  // namespace sieve::dpxa
