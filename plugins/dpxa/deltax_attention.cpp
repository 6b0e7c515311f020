#include "deltax_attention.hpp"

#include <sieve/plugin/policy_api.hpp>

namespace sieve::dpxa {

namespace sp = sieve::plugin;

DeltaXAttention::DeltaXAttention(const sieve_geometry& g, const Config& cfg, bool per_kv_head, float exact_top,
                                 float pack_threshold, const Allocate& allocate)
    : g_(g), cfg_(cfg), per_kv_head_(per_kv_head), exact_top_(exact_top), pack_threshold_(pack_threshold) {
#if SIEVE_WITH_CUDA
  if (g.device.device_type == kDLCUDA) allocate_cuda(allocate);
#else
  (void)allocate;
#endif
}

void DeltaXAttention::attend(const sieve_layer_call& call, const sieve_selection& sel, DLTensor& out,
                             const sieve_host_services& services, void* stream) {
  check_call(call, sel);
  if (g_.device.device_type == kDLCPU) return attend_cpu(call, sel, out, services);
#if SIEVE_WITH_CUDA
  attend_cuda(call, sel, out, services, stream);
#else
  (void)stream;
  sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of dpxa has no CUDA code");
#endif
}

// Both devices: the selection must be this instance's own of this layer call.
void DeltaXAttention::check_call(const sieve_layer_call& call, const sieve_selection& sel) const {
  const int32_t B = cfg_.block;
  if (call.phase != SIEVE_PHASE_PREFILL)
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "dpxa attends prefill only, phase is ", call.phase);
  sp::require_struct(call.kv_view, "KV view");
  if (call.layer != selected_layer_)
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "dpxa: mode=deltax attends the tiles its own select "
             "chose for this layer, but the last select was for layer ", selected_layer_,
             " (this is layer ", call.layer, ")");
  if (sel.kind != SIEVE_SEL_BLOCKS || sel.q_block != B || sel.k_block_pages != B / g_.page_size ||
      sel.heads != uint32_t(per_kv_head_ ? SIEVE_SEL_PER_KV_HEAD : SIEVE_SEL_PER_Q_HEAD) ||
      sel.n_rows != selected_rows_)
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "dpxa: mode=deltax needs its own block selection "
             "(q_block ", B, ", ", selected_rows_, " rows); the chain's has kind ", sel.kind,
             ", q_block ", sel.q_block, ", ", sel.n_rows, " rows");
}

}  // namespace sieve::dpxa
