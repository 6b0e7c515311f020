// The core store "paged": one name for the CPU and the CUDA paged stores, chosen by the config's
// device. Both are PagedStoreBase behind the same C entries, so the table is the CPU store's with
// create dispatching and the ABI 1.1 fields (descriptor, validate) filled in.
#include "sieve/kv/paged_store.hpp"
#include "sieve/kv/store_checks.hpp"

#include <string>

#include "sieve/util/abi_v1_0.hpp"

namespace sieve::kv {

namespace {

const sieve_kv_store_api* for_device(DLDevice d) {
  return d.device_type == kDLCUDA ? paged_cuda_store_api() : d.device_type == kDLCPU ? paged_cpu_store_api() : nullptr;
}

void report(sieve_reason_sink sink, const std::string& msg) {
  if (sink.reason) sink.reason(sink.ctx, msg.c_str());
}

sieve_status validate(const sieve_kv_config* config, sieve_reason_sink reasons) {
  if (!config || config->hdr.struct_size < util::v1_0_size<sieve_kv_config>()) {
    report(reasons, "config is null or older than the v1.0 layout");
    return SIEVE_ERR_VERSION;
  }
  sieve_status st = SIEVE_OK;
  if (!for_device(config->geometry.device)) {
    report(reasons, config->geometry.device.device_type == kDLCUDA ? "this build has no CUDA paged store"
                                                                   : "the paged store runs on the CPU or CUDA");
    st = SIEVE_ERR_UNSUPPORTED;
  }
  if (std::string p = config_problem(*config); !p.empty()) {
    report(reasons, p);
    st = SIEVE_ERR_INVALID_ARGUMENT;
  }
  return st;
}

sieve_status create(const sieve_host_services* services, const sieve_kv_config* config, sieve_kv_store** out,
                    sieve_reason_sink err) {
  if (out) *out = nullptr;
  if (!config || config->hdr.struct_size < util::v1_0_size<sieve_kv_config>()) {
    report(err, "create: config is null or older than the v1.0 layout");
    return SIEVE_ERR_VERSION;
  }
  const sieve_kv_store_api* api = for_device(config->geometry.device);
  if (!api) return validate(config, err);  // says why (no CUDA store in this build, an odd device)
  return api->create(services, config, out, err);
}

const int32_t kPageSizes[] = {16, 32, 64};

}  // namespace

const sieve_kv_store_api* paged_store_api() {
  static const sieve_kv_store_descriptor descriptor = [] {
    sieve_kv_store_descriptor d{};
    d.hdr = SIEVE_HEADER_INIT(sieve_kv_store_descriptor);
    d.name = "paged";
    d.vendor = "sieve";
    d.version_major = 1;
    d.version_minor = 1;
    d.summary = "the core's paged K/V pools (host memory, or CUDA device memory), FlashInfer HND pages";
    d.devices = SIEVE_DEVICE_CPU | (paged_cuda_store_api() ? uint32_t(SIEVE_DEVICE_CUDA) : 0u);
    d.dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16;
    d.page_sizes = kPageSizes;
    d.n_page_sizes = 3;
    d.layouts = SIEVE_KV_LAYOUT_HND;
    d.features = SIEVE_KV_FEATURE_SIDECARS | SIEVE_KV_FEATURE_EVICTION | SIEVE_KV_FEATURE_PRE_ROPE_K;
    return d;
  }();
  static const sieve_kv_store_api api = [] {
    sieve_kv_store_api t = *paged_cpu_store_api();  // the entries past create act on PagedStoreBase
    t.hdr = SIEVE_HEADER_INIT(sieve_kv_store_api);
    t.name = "paged";
    t.create = create;
    t.descriptor = &descriptor;
    t.params = nullptr;
    t.n_params = 0;
    t.validate = validate;
    t.bind_pages = nullptr;
    return t;
  }();
  return &api;
}

}  // namespace sieve::kv
