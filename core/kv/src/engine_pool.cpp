// The engine-pool store's C table: descriptor, parameter schema, validate and bind_pages on top
// of the entries every core store has (paged_store_api.hpp).
#include "sieve/kv/engine_pool.hpp"

#include "sieve/kv/engine_pool_base.hpp"
#include "sieve/kv/paged_store_api.hpp"
#include "sieve/policy.h"
#include "sieve/util/tensor.hpp"

namespace sieve::kv {
namespace {

EnginePoolBase* make_engine_pool(const sieve_host_services* services, const sieve_kv_config& config) {
  switch (config.geometry.device.device_type) {
    case kDLCPU: return make_engine_pool_cpu(services, config);
    case kDLCUDA: return make_engine_pool_cuda(services, config);
    default:
      fail(SIEVE_ERR_INVALID_ARGUMENT,
           "engine_pool store: geometry.device must be cpu or cuda, got " + device_name(config.geometry.device));
  }
}

const sieve_param_spec kParams[] = {
    {SIEVE_HEADER_INIT(sieve_param_spec), "layout", SIEVE_PARAM_ENUM, "hnd", 0, 0,
     "hnd|nhd|combined|combined_hnd",
     "the engine's pool: [pages, heads, page, dim] (hnd), [pages, page, heads, dim] (nhd), or one "
     "[pages, 2, ...] K/V tensor with nhd (combined, vLLM FlashInfer) or hnd halves"},
};

const sieve_kv_store_descriptor kDescriptor = {
    SIEVE_HEADER_INIT(sieve_kv_store_descriptor),
    "engine_pool",
    "sieve",
    1, 0, 0,
    "the engine's own paged K/V pool and page tables, borrowed per call; Sieve keeps sidecars",
    SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA,
    SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
    nullptr, 0,
    SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
    SIEVE_KV_FEATURE_ENGINE_PAGES | SIEVE_KV_FEATURE_SIDECARS | SIEVE_KV_FEATURE_EVICTION |
        SIEVE_KV_FEATURE_PRE_ROPE_K,
};

sieve_status validate(const sieve_kv_config* c, sieve_reason_sink reasons) noexcept {
  if (!c) return detail::report(reasons, "engine_pool store: config is null"), SIEVE_ERR_INVALID_ARGUMENT;
  std::string p = config_problem(*c);
  if (p.empty() && c->geometry.device.device_type != kDLCPU && c->geometry.device.device_type != kDLCUDA)
    p = "geometry.device must be cpu or cuda, got " + device_name(c->geometry.device);
  if (p.empty()) return SIEVE_OK;
  detail::report(reasons, ("engine_pool store: " + p).c_str());
  return SIEVE_ERR_INVALID_ARGUMENT;
}

}  // namespace

const sieve_kv_store_api* engine_pool_store_api() {
  static const sieve_kv_store_api api = [] {
    sieve_kv_store_api t = store_table<EnginePoolBase, &make_engine_pool>("engine_pool");
    t.descriptor = &kDescriptor;
    t.params = kParams;
    t.n_params = uint32_t(std::size(kParams));
    t.validate = validate;
    t.bind_pages = [](sieve_kv_store* s, const sieve_kv_pages* p) noexcept {
      return detail::guarded(detail::self<EnginePoolBase>(s), [&] {
        require(p != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: pages is null");
        detail::self<EnginePoolBase>(s)->bind_pages(*p);
      });
    };
    return t;
  }();
  return &api;
}

}  // namespace sieve::kv
