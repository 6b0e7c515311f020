// What the studies that recompute a layer's attention from the engine's probe share (sieve
// calibrate delta / dpxa, sieve delta-diag): the probed layer's cache on the host.
#pragma once
#include <string>

#include "sieve/model/engine.hpp"
#include "sieve/runtime/host_copy.hpp"

namespace sieve::cli {

// The probed layer's cache of the probe's sequences, copied to the host. Throws sieve::Error
// "<who>: KV view of layer L: <the store's reason>" when the store refuses the view.
void probe_cache_to_host(const model::LayerProbe& p, const std::string& who, runtime::HostPagedView* out);

}  // namespace sieve::cli
