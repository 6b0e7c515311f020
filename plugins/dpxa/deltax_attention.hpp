// DeltaXAttention (paper 001 §4.2), dpxa's mode=deltax: the tiles dpxa's select keeps, computed by
// the core kernel's attention variant (sieve_attention_variant) instead of plain attention. The diagonal tiles, the sink and the `exact_top`
// highest-share other kept tiles are exact; every other kept tile attends over its Delta-KV
// packed keys (per key block, cosine `pack_threshold`; core/packing) with ln(count) added to the
// logit, all in one softmax per query row. The select hands over each candidate's share (CPU:
// TileShares; CUDA: the shares and the exact bits on the device) and attend checks that the
// selection is that select's. CPU: cpu/deltax_attend_cpu.cpp (cpu/deltax.cpp packs and ranks);
// CUDA: cuda/deltax_driver.cpp over cuda/deltax_spans.cu; both hand the spans to kernels->attend. Metrics (CPU): deltax_kv_reduction per q head
// and layer, deltax_packed per layer.
#pragma once
#include <sieve/plugin/attention_variant.hpp>
#include <sieve/plugin/policy_base.hpp>
#include <sieve/sieve.h>

#include <cstdint>
#include <vector>

#include "call_data.hpp"
#include "cpu/deltax.hpp"
#include "cpu/tile_shares.hpp"
#include "math/dpxa_math.hpp"
#if SIEVE_WITH_CUDA
#include "cuda/select_driver.hpp"
#endif

namespace sieve::dpxa {

class DeltaXAttention {
 public:
  DeltaXAttention(const sieve_geometry& g, const Config& cfg, bool per_kv_head, float exact_top,
                  float pack_threshold, const Allocate& allocate);

  // select's hand-over: the shares it fills (CPU), then the layer and row count it selected.
  TileShares& cpu_shares() { return shares_; }
  void selected(int32_t layer, int32_t n_rows) {
    selected_layer_ = layer;
    selected_rows_ = n_rows;
  }
#if SIEVE_WITH_CUDA
  // What CUDA's select writes for attend.
  DeviceShares device_shares() const;
#endif

  // The attention of the call over `sel` (this instance's select of this layer) into `out`.
  void attend(const sieve_layer_call& call, const sieve_selection& sel, DLTensor& out,
              const sieve_host_services& services, void* stream);

 private:
  void check_call(const sieve_layer_call& call, const sieve_selection& sel) const;
  void attend_cpu(const sieve_layer_call& call, const sieve_selection& sel, DLTensor& out,
                  const sieve_host_services& services);
#if SIEVE_WITH_CUDA
  void allocate_cuda(const Allocate& allocate);
  void attend_cuda(const sieve_layer_call& call, const sieve_selection& sel, DLTensor& out,
                   const sieve_host_services& services, void* stream);
#endif

  sieve_geometry g_;
  Config cfg_;
  bool per_kv_head_;
  float exact_top_, pack_threshold_;
  int32_t selected_layer_ = -1, selected_rows_ = -1;
  TileShares shares_;
  // CPU scratch (grown on the first calls, like the selection's): one head's keys in f32, and the
  // attention variant the core kernel attends.
  std::vector<float> k_;
  plugin::HostVariant variant_;
  std::vector<uint8_t> exact_;
  std::vector<int32_t> rank_;
  std::vector<double> load_full_, load_saved_;
  deltax::TilePack pack_;
#if SIEVE_WITH_CUDA
  // select -> attend hand-over, attend's packing scratch and the variant it hands the core kernel.
  plugin::HostBuffer shares_d_, exact_bits_d_, anchor_off_d_, n_anchors_d_;
  plugin::HostBuffer packed_pos_d_, packed_count_d_, row_spans_d_, spans_d_;
  int64_t spans_capacity_ = 0;
  int32_t exact_words_ = 0;
#endif
};

}  // namespace sieve::dpxa
