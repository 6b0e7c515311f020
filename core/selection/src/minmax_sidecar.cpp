#include "sieve/selection/minmax_sidecar.hpp"

#include <sieve/util/error.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>

#include "sieve/selection/page_bound.hpp"
#if SIEVE_SELECTION_CUDA
#include "sieve/selection/page_bound_cuda.hpp"
#endif

namespace sieve::selection {

MinMaxSidecar::MinMaxSidecar(sieve_kv_store* kv, const sieve_kv_store_api* kv_api,
                             const sieve_geometry& g, const char* base_name)
    : geometry_(g) {
  require(kv && kv_api && kv_api->register_sidecar && kv_api->sidecar, SIEVE_ERR_UNSUPPORTED,
          std::string("the page min/max sidecar needs a KV store with sidecars at create (got ") +
              (kv ? "a store without sidecar support" : "none") + ")");
  sieve_sidecar_desc desc{};
  desc.hdr = SIEVE_HEADER_INIT(sieve_sidecar_desc);
  desc.dtype = g.kv_dtype;
  desc.elems_per_head = 2 * g.head_dim;
  // A second instance of the policy on the same store gets its own slot (it serves other layers).
  sieve_status st = SIEVE_ERR_INTERNAL;
  for (int i = 0; i < 16 && st != SIEVE_OK; ++i) {
    name_ = i == 0 ? std::string(base_name) : std::string(base_name) + "." + std::to_string(i);
    desc.name = name_.c_str();
    st = kv_api->register_sidecar(kv, &desc, &slot_);
    if (st != SIEVE_OK && st != SIEVE_ERR_INVALID_ARGUMENT) break;  // not a name clash
  }
  require(st == SIEVE_OK, st,
          std::string("register_sidecar '") + base_name + "': " +
              (kv_api->last_error ? kv_api->last_error(kv) : "refused"));
  folded_.assign(size_t(std::max(g.n_layers, 1)), std::vector<int32_t>(size_t(std::max(g.max_batch, 1)), -1));
  new_tokens_.assign(size_t(std::max(g.max_batch, 0)) + 1, 0);
}

DLTensor MinMaxSidecar::tensor(const sieve_layer_call& call) const {
  DLTensor t{};
  require(call.kv && call.kv_api && call.kv_api->sidecar, SIEVE_ERR_INVALID_ARGUMENT,
          "the layer call has no KV store");
  const sieve_status st = call.kv_api->sidecar(call.kv, call.layer, slot_, &t);
  require(st == SIEVE_OK, st,
          "sidecar '" + name_ + "' of layer " + std::to_string(call.layer) + ": " +
              (call.kv_api->last_error ? call.kv_api->last_error(call.kv) : "refused"));
  require(t.data && t.ndim == 3 && t.shape[1] == geometry_.n_kv_heads &&
              t.shape[2] == 2 * geometry_.head_dim && same_dtype(t.dtype, geometry_.kv_dtype),
          SIEVE_ERR_INVALID_ARGUMENT, "sidecar '" + name_ + "' has an unexpected shape or dtype");
  return t;
}

int32_t MinMaxSidecar::folded(int32_t layer, int32_t seq_id) const {
  if (layer < 0 || size_t(layer) >= folded_.size()) return -1;
  const auto& f = folded_[size_t(layer)];
  return seq_id >= 0 && size_t(seq_id) < f.size() ? f[size_t(seq_id)] : -1;
}

void MinMaxSidecar::evicted(int32_t layer, int32_t seq_id, int32_t tokens) {
  if (folded(layer, seq_id) >= 0) folded_[size_t(layer)][size_t(seq_id)] -= tokens;
}

bool MinMaxSidecar::on_append(const sieve_layer_call& call, void* stream) {
  require(call.kv_view && call.qo_indptr_host && (call.batch == 0 || call.seq_ids),
          SIEVE_ERR_INVALID_ARGUMENT, "on_append: the call has no view, qo_indptr_host or seq_ids");
  require(call.layer >= 0 && size_t(call.layer) < folded_.size(), SIEVE_ERR_INVALID_ARGUMENT,
          "on_append: layer " + std::to_string(call.layer) + " is outside the geometry");
  require(call.batch >= 0 && call.batch <= geometry_.max_batch, SIEVE_ERR_INVALID_ARGUMENT,
          "on_append: batch " + std::to_string(call.batch) + " exceeds max_batch " +
              std::to_string(geometry_.max_batch));
  const sieve_paged_kv& view = *call.kv_view;
  require(view.batch == call.batch && view.indptr_host && view.last_page_len_host,
          SIEVE_ERR_INVALID_ARGUMENT, "on_append: the view does not match the call");
  auto& folded = folded_[size_t(call.layer)];
  const int32_t ps = view.page_size;
  bool catch_up = false;
  int32_t max_touched = 0, max_pages = 0;
  for (int32_t b = 0; b < call.batch; ++b) {
    const int32_t pages = view.indptr_host[b + 1] - view.indptr_host[b];
    const int32_t len = pages == 0 ? 0 : (pages - 1) * ps + view.last_page_len_host[b];
    const int32_t n_new = call.qo_indptr_host[b + 1] - call.qo_indptr_host[b];
    require(n_new >= 0 && n_new <= len, SIEVE_ERR_INVALID_ARGUMENT,
            "on_append: sequence " + std::to_string(b) + " has " + std::to_string(n_new) +
                " new tokens but " + std::to_string(len) + " resident");
    const int32_t seq = call.seq_ids[b];
    require(seq >= 0, SIEVE_ERR_INVALID_ARGUMENT, "on_append: negative sequence id");
    if (size_t(seq) >= folded.size()) folded.resize(size_t(seq) + 1, -1);  // rare: ids beyond max_batch
    // A sequence whose earlier tokens are all folded, or a new one (nothing earlier), is fine.
    if (len - n_new != 0 && folded[size_t(seq)] != len - n_new) catch_up = true;
    max_pages = std::max(max_pages, pages);
    if (n_new > 0) max_touched = std::max(max_touched, (len - 1) / ps - (len - n_new) / ps + 1);
  }
  const DLTensor side = tensor(call);
  if (view.k_pages.device.device_type == kDLCPU) {
    const int32_t* new_tokens = call.qo_indptr_host;
    if (catch_up) {  // every resident token is new
      new_tokens_[0] = 0;
      for (int32_t b = 0; b < call.batch; ++b)
        new_tokens_[size_t(b) + 1] = new_tokens_[size_t(b)] + (view.indptr_host[b + 1] == view.indptr_host[b] ? 0 : (view.indptr_host[b + 1] - view.indptr_host[b] - 1) * ps + view.last_page_len_host[b]);
      new_tokens = new_tokens_.data();
    }
    minmax_on_append_cpu(view, new_tokens, side);
  } else {
#if SIEVE_SELECTION_CUDA
    MinMaxAppendLaunch a{};
    a.k_pages = data_ptr<const void>(view.k_pages);
    const std::string bad_strides = page_strides(view.k_pages, "on_append: kv.k_pages", &a.k_strides);
    require(bad_strides.empty(), SIEVE_ERR_INVALID_ARGUMENT, bad_strides);
    a.sidecar = data_ptr<void>(side);
    a.kv_dtype = require_storage(view.k_pages.dtype, "on_append: the key pages");
    require(same_dtype(view.k_pages.dtype, side.dtype), SIEVE_ERR_INVALID_ARGUMENT,
            "on_append: the sidecar's dtype " + dtype_name(side.dtype) + " is not the key pages' " +
                dtype_name(view.k_pages.dtype));
    a.n_kv_heads = int32_t(view.k_pages.shape[1]);
    a.page_size = ps;
    a.head_dim = int32_t(view.k_pages.shape[3]);
    a.kv_indptr = data_ptr<const int32_t>(view.indptr);
    a.kv_indices = data_ptr<const int32_t>(view.indices);
    a.last_page_len = data_ptr<const int32_t>(view.last_page_len);
    a.new_indptr = catch_up ? nullptr : data_ptr<const int32_t>(*call.qo_indptr);
    a.batch = call.batch;
    a.max_pages_touched = catch_up ? max_pages : max_touched;
    a.stream = stream;
    if (const char* e = launch_minmax_append(a))
      fail(SIEVE_ERR_DEVICE, std::string("min/max append kernel: ") + e);
#else
    (void)stream;
    fail(SIEVE_ERR_UNSUPPORTED, "this build has no CUDA min/max maintenance");
#endif
  }
  for (int32_t b = 0; b < call.batch; ++b) {
    const int32_t pages = view.indptr_host[b + 1] - view.indptr_host[b];
    folded[size_t(call.seq_ids[b])] = pages == 0 ? 0 : (pages - 1) * ps + view.last_page_len_host[b];
  }
  return catch_up;
}

}  // namespace sieve::selection
