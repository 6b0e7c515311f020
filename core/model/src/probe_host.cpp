#include "sieve/model/probe_host.hpp"

#include <cstring>

#include "sieve/util/error.hpp"

namespace sieve::model {

void probe_cache_to_host(const LayerProbe& p, const std::string& who, runtime::HostPagedView* out) {
  sieve_paged_kv view{};
  if (sieve_status st = p.kv_api->view(p.kv, p.layer, p.seq_ids, p.batch, &view); st != SIEVE_OK)
    fail(st, who + ": KV view of layer " + std::to_string(p.layer) + ": " + p.kv_api->last_error(p.kv));
  runtime::copy_view_to_host(*p.services, view, out);
}

void probe_to_host(const LayerProbe& p, const ModelConfig& c, const std::string& who, ProbeOnHost* out) {
  const int32_t n = p.qo_indptr_host[p.batch];
  out->q = HostTensor({n, c.n_heads, c.head_dim()}, kF32);
  out->out = HostTensor({n, c.n_heads, c.head_dim()}, kF32);
  out->qo = HostTensor({p.batch + 1}, kI32);
  runtime::copy_to_host(*p.services, out->q.dl().data, *p.q, out->q.nbytes());
  runtime::copy_to_host(*p.services, out->out.dl().data, *p.out, out->out.nbytes());
  std::memcpy(out->qo.data<int32_t>(), p.qo_indptr_host, size_t(p.batch + 1) * 4);
  probe_cache_to_host(p, who, &out->cache);
}

}  // namespace sieve::model
