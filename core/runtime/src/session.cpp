// Session: the store choice and the fit check, the store's creation (or the check of a borrowed
// one), then the LayerRunner; session.hpp says what and in which order.
#include "sieve/runtime/session.hpp"
#include "sieve/runtime/kv_layouts.hpp"

#include <cstring>

#include "sieve/kv/paged_store.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/status.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::runtime {

namespace {

std::string join(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& l : lines) out += (out.empty() ? "" : "; ") + l;
  return out;
}

void keep_reason(void* ctx, const char* m) {
  auto* s = static_cast<std::string*>(ctx);
  if (!s->empty()) *s += "; ";
  *s += m ? m : "";
}

int32_t default_pages(const sieve_geometry& g) {
  const int64_t pages = int64_t(g.max_batch) * ((int64_t(g.max_seq_len) + g.page_size - 1) / g.page_size);
  require(pages <= INT32_MAX, SIEVE_ERR_CAPACITY,
          std::to_string(g.max_batch) + " sequences of " + std::to_string(g.max_seq_len) + " tokens need " +
              std::to_string(pages) + " KV pages per layer, more than int32 page ids can name");
  return int32_t(pages);
}

// A borrowed instance must hold this geometry: its empty view of the last layer shows the pool's
// shape, dtype and device, and a layer past the last must not exist. (An ENGINE_PAGES store has
// no pool of its own before bind_pages; its pages are checked there.)
std::string borrowed_problem(const sieve_kv_store_api& api, sieve_kv_store* kv, const sieve_geometry& g) {
  sieve_paged_kv v{};
  v.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
  if (api.view(kv, g.n_layers - 1, nullptr, 0, &v) != SIEVE_OK)
    return "it has no layer " + std::to_string(g.n_layers - 1) + " (" + api.last_error(kv) + ")";
  sieve_paged_kv past{};
  past.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
  if (api.view(kv, g.n_layers, nullptr, 0, &past) == SIEVE_OK)
    return "it has more than the geometry's " + std::to_string(g.n_layers) + " layers";
  const DLTensor& k = v.k_pages;
  if (v.page_size != g.page_size || k.ndim != 4 || !k.shape || k.shape[1] != g.n_kv_heads ||
      k.shape[2] != g.page_size || k.shape[3] != g.head_dim)
    return "its pages are not [pages, " + std::to_string(g.n_kv_heads) + " kv heads, " + std::to_string(g.page_size) +
           " tokens, " + std::to_string(g.head_dim) + " dims]";
  if (k.dtype.code != g.kv_dtype.code || k.dtype.bits != g.kv_dtype.bits || k.dtype.lanes != g.kv_dtype.lanes)
    return "it stores " + dtype_name(k.dtype) + ", the geometry's KV dtype is " + dtype_name(g.kv_dtype);
  if (k.device.device_type != g.device.device_type || k.device.device_id != g.device.device_id)
    return "it lives on " + device_name(k.device) + ", the session runs on " + device_name(g.device);
  return {};
}

}  // namespace

uint32_t store_layouts_in_use(const StoreEntry& store, const ParamValues& values) {
  const ParamSchema schema = store.params();
  const int i = schema.find("layout");
  if (i < 0 || uint32_t(i) >= values.size() || schema[uint32_t(i)].type != SIEVE_PARAM_ENUM)
    return store.descriptor.layouts;
  const std::string& v = values.text(uint32_t(i));
  if (v == "hnd") return SIEVE_KV_LAYOUT_HND;
  if (v == "nhd") return SIEVE_KV_LAYOUT_NHD;
  if (v.rfind("combined", 0) == 0) return SIEVE_KV_LAYOUT_COMBINED;
  return store.descriptor.layouts;
}

std::vector<std::string> store_fit_problems(const ResolvedChains& chains, const StoreEntry& store,
                                            const ParamValues& store_values) {
  std::vector<std::string> out;
  const sieve_kv_store_descriptor& d = store.descriptor;
  for (const ResolvedInstance& inst : chains.instances) {
    const sieve_policy_descriptor& p = inst.descriptor();
    auto lacks = [&](const std::string& what) {
      out.push_back("policy '" + std::string(inst.plugin.name()) + "' (instance " + inst.label + ") needs " + what +
                    ", which KV store '" + store.name + "' lacks");
    };
    if ((p.needs & SIEVE_NEEDS_SIDECARS) && !(d.features & SIEVE_KV_FEATURE_SIDECARS)) lacks("SIDECARS");
    if (p.evicts_kv && !(d.features & SIEVE_KV_FEATURE_EVICTION)) lacks("EVICTION");
    if ((p.needs & SIEVE_NEEDS_PRE_ROPE_K) && !(d.features & SIEVE_KV_FEATURE_PRE_ROPE_K)) lacks("PRE_ROPE_K");
  }
  // Layouts: what this instance of the store hands out, against every plugin and the core kernel.
  const uint32_t in_use = store_layouts_in_use(store, store_values);
  for (uint32_t bit = SIEVE_KV_LAYOUT_NHD; bit <= SIEVE_KV_LAYOUT_COMBINED; bit <<= 1)
    if (in_use & bit)
      for (std::string& line : kv_layout_refusals(chains, bit, store.name)) out.push_back(std::move(line));
  return out;
}

Session::Session(HostServices& services, const sieve_geometry& geometry, ResolvedChains chains, Options options)
    : services_(services), geometry_(geometry) {
  geometry_.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  for (const auto& inst : chains.instances) plugins_.push_back(inst.plugin);

  // 1. Which store.
  if (options.store_api) {
    if (std::vector<std::string> p = check_kv_store_api(options.store_api); !p.empty())
      fail(SIEVE_ERR_INVALID_ARGUMENT, "the host's KV store table: " + join(p));
    const char* n = options.store_api->name;
    store_ = describe_store(options.store_api, n && *n ? n : "host", "the host");
  } else {
    require(options.store_instance == nullptr, SIEVE_ERR_INVALID_ARGUMENT,
            "a KV store instance was given without its table (store_api)");
    if (chains.store.entry.api) {
      store_ = chains.store.entry;
      store_params_ = chains.store.values;
    } else {
      store_ = describe_store(kv::paged_store_api(), "paged", "built-in");
    }
  }
  if (store_.plugin.table) plugins_.push_back(store_.plugin);
  if (std::vector<std::string> p = store_fit_problems(chains, store_, store_params_); !p.empty()) fail(SIEVE_ERR_UNSUPPORTED, join(p));
  if ((store_.descriptor.features & SIEVE_KV_FEATURE_ENGINE_PAGES) && !options.binds_pages)
    fail(SIEVE_ERR_UNSUPPORTED, "KV store '" + store_.name +
                                    "' runs over pages the host owns and binds per call (ENGINE_PAGES); this host "
                                    "binds none: use a store that owns its pages (paged), or a host that binds its "
                                    "own (host API sieve_session_bind_pages, sieve_bench --policy)");

  // 2. Its configuration.
  config_.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
  config_.geometry = geometry_;
  config_.pages_per_layer = options.pages_per_layer > 0 ? options.pages_per_layer : default_pages(geometry_);
  config_.keep_pre_rope_k = (chains.needs & SIEVE_NEEDS_PRE_ROPE_K) ? 1 : 0;
  config_.geometry_ref = &geometry_;
  config_.params = store_params_.size() ? store_params_.data() : nullptr;
  config_.n_params = store_params_.size();
  config_.release = options.release;

  // 3. The store: borrowed (checked against the geometry) or created.
  const sieve_kv_store_api& api = *store_.api;
  const std::string who = "KV store '" + store_.name + "'";
  if (options.store_instance) {
    owns_kv_ = false;
    kv_ = options.store_instance;
    if (!(store_.descriptor.features & SIEVE_KV_FEATURE_ENGINE_PAGES))
      if (std::string p = borrowed_problem(api, kv_, geometry_); !p.empty())
        fail(SIEVE_ERR_INVALID_ARGUMENT, "the host's " + who + " instance does not match the geometry: " + p);
  } else {
    std::string reason;
    const sieve_reason_sink sink{&reason, keep_reason};
    sieve_status st = SIEVE_OK;
    if (SIEVE_HAS_FIELD(&api, sieve_kv_store_api, validate) && api.validate) st = api.validate(&config_, sink);
    if (st == SIEVE_OK) st = api.create(services_.table(), &config_, &kv_, sink);
    if (st != SIEVE_OK || !kv_)
      fail(st != SIEVE_OK ? st : SIEVE_ERR_INTERNAL, who + ": " + (reason.empty() ? status_name(st) : reason));
  }

  // 4. The policy instances on it.
  try {
    runner_ = std::make_unique<LayerRunner>(services_, geometry_, kv_, store_.api, std::move(chains), options.runner);
  } catch (...) {
    if (owns_kv_) api.destroy(kv_);
    kv_ = nullptr;
    throw;
  }
}

Session::~Session() {
  runner_.reset();  // instances first: they registered sidecars in the store
  if (kv_ && owns_kv_) store_.api->destroy(kv_);
  // plugins_ and store_ (the plugins' library handles) go last, with the members.
}

void Session::store_failed(sieve_status st, const char* call) const {
  fail(st, "KV store '" + store_.name + "', " + call + ": " + status_name(st) + ": " + store_.api->last_error(kv_));
}

int32_t Session::add_sequence() {
  int32_t id = -1;
  if (sieve_status st = store_.api->add_sequence(kv_, &id); st != SIEVE_OK) store_failed(st, "add_sequence");
  return id;
}

void Session::remove_sequence(int32_t seq_id) {
  if (sieve_status st = store_.api->remove_sequence(kv_, seq_id); st != SIEVE_OK) store_failed(st, "remove_sequence");
}

int32_t Session::seq_len(int32_t layer, int32_t seq_id) const {
  int32_t len = 0;
  if (sieve_status st = store_.api->seq_len(kv_, layer, seq_id, &len); st != SIEVE_OK) store_failed(st, "seq_len");
  return len;
}

uint64_t Session::bytes_in_use() const {
  uint64_t bytes = 0;
  if (sieve_status st = store_.api->bytes_in_use(kv_, &bytes); st != SIEVE_OK) store_failed(st, "bytes_in_use");
  return bytes;
}

sieve_paged_kv Session::view(int32_t layer, const int32_t* seq_ids, int32_t batch) {
  sieve_paged_kv v{};
  if (sieve_status st = store_.api->view(kv_, layer, seq_ids, batch, &v); st != SIEVE_OK) store_failed(st, "view");
  return v;
}

void Session::bind_pages(const sieve_kv_pages& pages) {
  const sieve_kv_store_api& api = *store_.api;
  if (!SIEVE_HAS_FIELD(&api, sieve_kv_store_api, bind_pages) || !api.bind_pages)
    fail(SIEVE_ERR_UNSUPPORTED, "KV store '" + store_.name +
                                    "' owns its pages (no bind_pages): the host cannot bind its own to it");
  if (sieve_status st = api.bind_pages(kv_, &pages); st != SIEVE_OK) store_failed(st, "bind_pages");
}

}  // namespace sieve::runtime
