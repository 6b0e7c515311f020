#include "sieve/cli/probe_copy.hpp"

#include "sieve/util/error.hpp"

namespace sieve::cli {

void probe_cache_to_host(const model::LayerProbe& p, const std::string& who, runtime::HostPagedView* out) {
  sieve_paged_kv view{};
  if (sieve_status st = p.kv_api->view(p.kv, p.layer, p.seq_ids, p.batch, &view); st != SIEVE_OK)
    fail(st, who + ": KV view of layer " + std::to_string(p.layer) + ": " + p.kv_api->last_error(p.kv));
  runtime::copy_view_to_host(*p.services, view, out);
}

}  // namespace sieve::cli
