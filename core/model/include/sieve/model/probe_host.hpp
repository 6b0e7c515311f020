// A layer probe's call copied to the host, for the studies that recompute a layer's attention
// from it (sieve eval's fidelity, sieve calibrate delta / dpxa, sieve delta-diag).
#pragma once
#include <string>

#include "sieve/model/engine.hpp"
#include "sieve/runtime/host_copy.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::model {

// The probed layer's cache of the probe's sequences, copied to the host. Throws sieve::Error
// "<who>: KV view of layer L: <the store's reason>" when the store refuses the view.
void probe_cache_to_host(const LayerProbe& p, const std::string& who, runtime::HostPagedView* out);

// The probe's q and out ([n_q_tokens, n_heads, head_dim], f32), qo_indptr (int32 [batch + 1],
// from its host mirror) and cache (probe_cache_to_host) on the host.
struct ProbeOnHost {
  HostTensor q, out, qo;
  runtime::HostPagedView cache;
};
void probe_to_host(const LayerProbe& p, const ModelConfig& c, const std::string& who, ProbeOnHost* out);

}  // namespace sieve::model
