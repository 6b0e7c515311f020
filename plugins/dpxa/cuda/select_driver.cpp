#include "cuda/select_driver.hpp"

#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/tensor.hpp>

#include <string>

#include "cuda/dpxa_select.hpp"

namespace sieve::dpxa {

namespace sp = sieve::plugin;

CudaSelect::CudaSelect(const sieve_geometry& g, int32_t block, const Allocate& allocate) {
  const ScratchSizes z = scratch_sizes(g.max_seq_len, block, g.n_q_heads, g.n_kv_heads);
  q_anchors_ = allocate(z.q_anchors);
  q_counts_ = allocate(z.q_counts);
  k_anchors_ = allocate(z.k_anchors);
  k_counts_ = allocate(z.k_counts);
  tiles_ = allocate(z.tiles);
  keep_ = allocate(z.keep);
  row_counts_ = allocate(z.row_counts);
}

// One launch sequence per sequence of the batch (scratch is sized for one sequence).
void CudaSelect::run(const sieve_geometry& g, const SelectConfig& c, const sieve_layer_call& call,
                     const sieve_paged_kv& view, sieve_selection& selection, void* stream,
                     const DeviceShares* deltax) const {
  const DLDevice dev = g.device;
  auto on_device = [&](const DLTensor& t, const char* what, bool compact = true) {
    if (!t.data || t.device.device_type != dev.device_type || t.device.device_id != dev.device_id ||
        (compact && !sieve::is_contiguous(t)))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, what, compact ? " must be a contiguous tensor on " : " must be on ",
               sieve::device_name(dev));
  };
  const int64_t n_q = call.qo_indptr_host[call.batch];
  if (std::string e = sieve::check_tensor(call.q, "q", 3, {n_q, g.n_q_heads, g.head_dim}); !e.empty())
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
  on_device(*call.q, "q");
  on_device(view.k_pages, "k_pages", false);  // any layout: strides below
  on_device(view.indices, "the view's page indices");
  if (g.n_q_heads > kCudaMaxQHeads) sp::fail(SIEVE_ERR_UNSUPPORTED, "n_q_heads = ", g.n_q_heads, " > ", kCudaMaxQHeads);
  SequenceLaunch a{};
  a.estimator = c.cfg.estimator;
  a.B = c.cfg.block;
  a.S = c.cfg.stride;
  a.d = g.head_dim;
  a.hq = g.n_q_heads;
  a.hkv = g.n_kv_heads;
  a.page_size = g.page_size;
  a.q_threshold = c.cfg.q_threshold;
  a.k_threshold = c.cfg.k_threshold;
  a.scale = c.cfg.scale;
  a.scale_over_s = c.cfg.scale / float(c.cfg.stride);
  a.rows_per_kv_head = c.per_kv_head;
  for (int32_t h = 0; h < g.n_q_heads; ++h) a.tau[h] = c.thresholds->at(call.layer, h, c.tau);
  a.q = sieve::data_ptr<const void>(*call.q);
  a.q_dtype = sieve::require_storage(call.q->dtype, "q");
  a.kv_dtype = sieve::require_storage(view.k_pages.dtype, "k_pages");
  a.k_pages = sieve::data_ptr<const void>(view.k_pages);
  a.k_strides = page_strides_of(view.k_pages, "k_pages");
  a.q_anchors = q_anchors_.get<uint8_t>();
  a.q_counts = q_counts_.get<int32_t>();
  a.k_anchors = k_anchors_.get<uint8_t>();
  a.k_counts = k_counts_.get<int32_t>();
  a.tiles = tiles_.get<float>();
  a.keep = keep_.get<uint8_t>();
  a.row_counts = row_counts_.get<int32_t>();
  a.sel_indptr = sieve::data_ptr<int32_t>(selection.indptr);
  a.sel_indices = sieve::data_ptr<int32_t>(selection.indices);
  a.capacity = selection.capacity;
  a.stream = stream;
  a.shares = deltax ? deltax->shares : nullptr;
  a.exact_words = deltax ? deltax->exact_words : 0;
  a.exact_top = deltax ? deltax->exact_top : 0.f;
  const int32_t B = c.cfg.block, H = c.per_kv_head ? g.n_kv_heads : g.n_q_heads;
  int32_t row0 = 0;
  for (int32_t b = 0; b < call.batch; ++b) {
    if (call.kv_len_host[b] > g.max_seq_len)  // the scratch's sizing (scratch_sizes, max_row_tiles)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sequence ", b, " has kv_len ", call.kv_len_host[b], " > max_seq_len = ",
               g.max_seq_len);
    // deltax: this sequence's exact bits follow the earlier sequences' query blocks.
    a.exact_bits = deltax ? deltax->exact_bits + int64_t(row0 / H) * g.n_q_heads * deltax->exact_words : nullptr;
    a.q_token0 = call.qo_indptr_host[b];
    a.n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
    a.kv_len = call.kv_len_host[b];
    a.pages = sieve::data_ptr<const int32_t>(view.indices) + view.indptr_host[b];
    a.QB = int32_t((a.n_new + B - 1) / B);
    a.KB = int32_t((a.kv_len + B - 1) / B);
    a.tiles_per_head = 0;
    for (int32_t t = 0; t < a.QB; ++t) a.tiles_per_head += row_span(a.kv_len, a.n_new, B, t).n_candidates;
    a.row0 = row0;
    if (const char* e = launch_sequence(a)) sp::fail(SIEVE_ERR_DEVICE, "dpxa selection kernels failed to launch: ", e);
    row0 += a.QB * H;
  }
  if (row0 == 0) {  // no queries at all: the CSR still needs indptr[0] = 0
    SequenceLaunch empty = a;
    empty.QB = 0;
    if (const char* e = launch_empty(empty)) sp::fail(SIEVE_ERR_DEVICE, "dpxa selection kernels failed to launch: ", e);
  }
}

}  // namespace sieve::dpxa
