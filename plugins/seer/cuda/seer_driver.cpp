#include "cuda/seer_driver.hpp"

#include <sieve/plugin/policy_api.hpp>
#include <sieve/selection/top_k_cuda.hpp>
#include <sieve/util/page_layout.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <string>
#include <utility>

namespace sieve::seer {
namespace {

namespace sp = sieve::plugin;
namespace sel = sieve::selection;

const int32_t* device_ints(const DLTensor& t, const char* what, int64_t n, DLDevice dev) {
  if (!t.data || !sieve::same_dtype(t.dtype, sieve::kI32) || t.ndim != 1 || t.shape[0] < n || !sieve::is_contiguous(t) ||
      t.device.device_type != dev.device_type || t.device.device_id != dev.device_id)
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, what, " must be a contiguous int32 [", n, "] tensor on ", sieve::device_name(dev));
  return sieve::data_ptr<const int32_t>(t);
}

// Where a pre-RoPE key row lives: the view's strides and byte_offset in any layout kv_store.h
// allows (seer declares them all), one line otherwise.
PageStrides k_pre_strides(const sieve_paged_kv& view) {
  PageStrides at;
  if (std::string e = page_strides(view.k_pre_rope_pages, "the pre-RoPE key pages", &at); !e.empty())
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
  return at;
}

}  // namespace

SeerCuda::SeerCuda(const sieve_geometry& g, const GateWeights& weights, const CudaGateConfig& cfg, int32_t max_blocks,
                   const Allocate& allocate)
    : g_(g), shape_(weights.shape), cfg_(cfg) {
  wq_ = allocate(weights.wq.size() * sizeof(float));
  wk_ = allocate(weights.wk.size() * sizeof(float));
  for (auto [dst, src] : {std::pair{&wq_, &weights.wq}, std::pair{&wk_, &weights.wk}})
    if (const char* e = copy_to_device(dst->get(), src->data(), src->size() * sizeof(float)))
      sp::fail(SIEVE_ERR_DEVICE, "uploading the gate weights: ", e);
  const int64_t rows = int64_t(g.max_batch) * g.n_kv_heads;
  block_indptr_ = allocate(sizeof(int32_t) * (size_t(g.max_batch) + 1));
  scores_ = allocate(sizeof(float) * size_t(rows) * size_t(max_blocks));
  topk_scratch_ = allocate(std::max<size_t>(sel::top_k_cuda_scratch_bytes(rows), 16));
  q_raw_ = allocate(sizeof(float) * size_t(rows) * size_t(cfg.gate_dim));
  last_score_ = allocate(sizeof(float) * size_t(rows));
}

SeerCudaCommon SeerCuda::common(const sieve_layer_call& call, const DLTensor& side, void* stream) const {
  const sieve_paged_kv& view = *call.kv_view;
  SeerCudaCommon c{};
  c.kv_indptr = device_ints(view.indptr, "the KV view's indptr", call.batch + 1, g_.device);
  c.kv_pages = device_ints(view.indices, "the KV view's indices", view.indptr_host[call.batch], g_.device);
  c.last_page_len = device_ints(view.last_page_len, "the KV view's last_page_len", call.batch, g_.device);
  c.batch = call.batch;
  c.n_q_heads = g_.n_q_heads;
  c.n_kv_heads = g_.n_kv_heads;
  c.head_dim = g_.head_dim;
  c.page_size = g_.page_size;
  c.block = cfg_.block;
  c.gate_dim = cfg_.gate_dim;
  c.rmsnorm = cfg_.rmsnorm;
  c.rope_theta = cfg_.rope_theta;
  c.cache = sieve::data_ptr<float>(side);
  c.stream = stream;
  return c;
}

void SeerCuda::fill_cache(const sieve_layer_call& call, const DLTensor& side, void* stream) const {
  const sieve_paged_kv& view = *call.kv_view;
  FillCacheLaunch a{};
  a.c = common(call, side, stream);
  a.k_pre = sieve::data_ptr<const void>(view.k_pre_rope_pages);
  a.k_elem = sieve::require_storage(view.k_pre_rope_pages.dtype, "the pre-RoPE key pages");
  a.c.k_pre_strides = k_pre_strides(view);
  a.wk = wk_.get<const float>() + int64_t(call.layer) * g_.n_kv_heads * shape_.wk_head_elems();
  a.max_complete = 0;
  for (int32_t b = 0; b < call.batch; ++b) a.max_complete = std::max(a.max_complete, int32_t(call.kv_len_host[b] / cfg_.block));
  if (const char* e = launch_fill_cache(a)) sp::fail(SIEVE_ERR_DEVICE, "K-compression cache kernel: ", e);
}

void SeerCuda::select(const sieve_layer_call& call, const DLTensor& side, const int32_t* block_indptr,
                      int64_t topk_capacity, sieve_selection& selection, int64_t n_rows, void* stream) const {
  const DLTensor& q = *call.q_pre_rope;
  if (q.device.device_type != kDLCUDA || !sieve::is_contiguous(q))
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "q_pre_rope must be a contiguous tensor on ", sieve::device_name(g_.device));
  GateScoresLaunch a{};
  a.c = common(call, side, stream);
  a.q_pre = sieve::data_ptr<const void>(q);
  a.q_elem = sieve::require_storage(q.dtype, "q_pre_rope");
  a.wq = wq_.get<const float>() + int64_t(call.layer) * g_.n_kv_heads * shape_.wq_head_elems();
  a.block_indptr = block_indptr_.get<int32_t>();
  a.scores = scores_.get<float>();
  a.q_raw = q_raw_.get<float>();
  a.last_score = last_score_.get<float>();
  a.max_blocks = 0;
  for (int32_t b = 0; b < call.batch; ++b) a.max_blocks = std::max(a.max_blocks, block_indptr[b + 1] - block_indptr[b]);
  a.softmax = cfg_.threshold;
  if (cfg_.fused) {  // the cache catch-up and the block offsets ride on the gate query kernel
    const sieve_paged_kv& view = *call.kv_view;
    if (!view.k_pre_rope_pages.data)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV store keeps no pre-RoPE keys (seer declares SIEVE_NEEDS_PRE_ROPE_K)");
    a.fold_offsets = true;
    a.catch_up = true;
    a.k_pre = sieve::data_ptr<const void>(view.k_pre_rope_pages);
    a.k_elem = sieve::require_storage(view.k_pre_rope_pages.dtype, "the pre-RoPE key pages");
    a.c.k_pre_strides = k_pre_strides(view);
    a.wk = wk_.get<const float>() + int64_t(call.layer) * g_.n_kv_heads * shape_.wk_head_elems();
  }
  auto* indptr = sieve::data_ptr<int32_t>(selection.indptr);
  auto* indices = sieve::data_ptr<int32_t>(selection.indices);
  // Threshold: the bound is every block of every row.
  sp::check_selection_storage(selection, n_rows,
                              cfg_.threshold ? int64_t(block_indptr[call.batch]) * g_.n_kv_heads : topk_capacity,
                              g_.device);
  if (const char* e = launch_gate_scores(a)) sp::fail(SIEVE_ERR_DEVICE, "gate score kernel: ", e);
  if (cfg_.threshold) {
    ThresholdLaunch t{};
    t.block_indptr = a.block_indptr;
    t.scores = a.scores;
    t.batch = call.batch;
    t.n_kv_heads = g_.n_kv_heads;
    t.threshold = cfg_.threshold_value;
    t.sel_indptr = indptr;
    t.sel_indices = indices;
    t.capacity = selection.capacity;
    t.stream = stream;
    if (const char* e = launch_threshold_select(t)) sp::fail(SIEVE_ERR_DEVICE, "threshold selection kernel: ", e);
    return;
  }
  sel::TopKCudaLaunch t{};
  t.scores = a.scores;
  t.layout = {g_.n_kv_heads, 1};
  t.seg_indptr = a.block_indptr;
  t.n_segments = call.batch;
  t.rows_per_segment = g_.n_kv_heads;
  t.head = 0;
  t.tail = 1;
  t.k = cfg_.top_k;
  t.scratch = topk_scratch_.get();
  t.sel_indptr = indptr;
  t.sel_indices = indices;
  t.capacity = selection.capacity;
  t.stream = stream;
  if (const char* e = sel::launch_top_k_cuda(t)) sp::fail(SIEVE_ERR_DEVICE, "top-k kernel: ", e);
}

}  // namespace sieve::seer
