// seer's CUDA path on the host side: the device copies of the gate weights and the decode scratch
// (allocated once, when the instance is created), the K-compression cache fill, and the decode
// selection (gate scores, then the threshold rule or core/selection's top-k), all launched on the
// host's stream. seer.cpp keeps the checks the CPU path shares and calls these on a CUDA geometry.
#pragma once
#include <sieve/plugin/policy_base.hpp>
#include <sieve/sieve.h>

#include <cstdint>
#include <functional>

#include "gate/gate_file.hpp"
#include "cuda/seer_cuda.hpp"

namespace sieve::seer {

// The instance's settings the launches need.
struct CudaGateConfig {
  int32_t block = 0, gate_dim = 0, top_k = 0;
  bool rmsnorm = false;
  bool fused = false;      // the cache catch-up and block offsets ride on the gate query kernel
  bool threshold = false;  // mode=threshold (else the top-k budget)
  float threshold_value = 0.f;
  float rope_theta = 0.f;  // 0: no rotation (a built-in gate)
};

class SeerCuda {
 public:
  using Allocate = std::function<plugin::HostBuffer(size_t bytes)>;

  // Uploads the gate weights and allocates the scratch for `max_blocks` blocks per sequence.
  SeerCuda(const sieve_geometry& g, const GateWeights& weights, const CudaGateConfig& cfg, int32_t max_blocks,
           const Allocate& allocate);

  // Fills the cache entries (sidecar `side` of the call's layer) of every complete block not
  // filled yet.
  void fill_cache(const sieve_layer_call& call, const DLTensor& side, void* stream) const;

  // The decode selection into `selection` (n_rows = batch x n_kv_heads rows). block_indptr: the
  // host's CSR of blocks per sequence; topk_capacity: the entries the top-k may write.
  void select(const sieve_layer_call& call, const DLTensor& side, const int32_t* block_indptr,
              int64_t topk_capacity, sieve_selection& selection, int64_t n_rows, void* stream) const;

 private:
  SeerCudaCommon common(const sieve_layer_call& call, const DLTensor& side, void* stream) const;

  sieve_geometry g_;
  GateShape shape_;
  CudaGateConfig cfg_;
  plugin::HostBuffer wq_, wk_, scores_, block_indptr_, topk_scratch_, q_raw_, last_score_;
};

}  // namespace sieve::seer
