// DeltaXAttention on CUDA, the host side: the scratch select and attend share (allocated once,
// when the instance is created); per sequence, core/packing's block walk then cuda/deltax_spans.cu
// (the packed keys and each row's spans, from the selection and the exact bits the select left);
// then one call of the host's core kernel with that attention variant for the whole batch.
#include <sieve/packing/block_pack_cuda.hpp>
#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/tensor.hpp>

#include <initializer_list>
#include <string>

#include "cuda/deltax_spans.hpp"
#include "cuda/dpxa_select.hpp"
#include "deltax_attention.hpp"

namespace sieve::dpxa {

namespace sp = sieve::plugin;

void DeltaXAttention::allocate_cuda(const Allocate& allocate) {
  const ScratchSizes z = scratch_sizes(g_.max_seq_len, cfg_.block, g_.n_q_heads, g_.n_kv_heads);
  // The shares of one sequence (ranked before the next sequence's select), the exact bits of the
  // whole batch, and one sequence's packing.
  const int64_t blocks = (int64_t(g_.max_seq_len) + cfg_.block - 1) / cfg_.block;
  exact_words_ = int32_t((blocks + 31) / 32);
  shares_d_ = allocate(z.tiles / 2);  // (m, s) pairs -> one float
  exact_bits_d_ = allocate(size_t(g_.max_batch) * size_t(blocks) * size_t(g_.n_q_heads) * size_t(exact_words_) * 4);
  anchor_off_d_ = allocate(size_t(g_.n_kv_heads) * size_t(blocks) * size_t(cfg_.block));
  n_anchors_d_ = allocate(size_t(g_.n_kv_heads) * size_t(blocks) * 4);
  // The variant of the whole batch: packed keys by (sequence, KV head, position), a row per
  // (query block, q head), a span per (kept tile, q head): at most the candidates of every row.
  const size_t packed = size_t(g_.max_batch) * size_t(g_.n_kv_heads) * size_t(g_.max_seq_len);
  packed_pos_d_ = allocate(packed * 4);
  packed_count_d_ = allocate(packed * 4);
  row_spans_d_ = allocate(size_t(g_.max_batch) * size_t(blocks) * size_t(g_.n_q_heads) * 2 * 4);
  spans_capacity_ = int64_t(g_.max_batch) * g_.n_q_heads * row_span_capacity(cfg_.block, g_.max_seq_len);
  spans_d_ = allocate(size_t(spans_capacity_) * 3 * 4);
}

DeviceShares DeltaXAttention::device_shares() const {
  return {shares_d_.get<float>(), exact_bits_d_.get<uint32_t>(), exact_words_, exact_top_};
}

void DeltaXAttention::attend_cuda(const sieve_layer_call& call, const sieve_selection& sel, DLTensor& out,
                                  const sieve_host_services& services, void* stream) {
  const sieve_geometry& g = g_;
  const DLDevice dev = g.device;
  const sieve_paged_kv& view = *call.kv_view;
  const int32_t B = cfg_.block, H = per_kv_head_ ? g.n_kv_heads : g.n_q_heads;
  auto tensor = [&](const DLTensor* t, const char* what, std::initializer_list<int64_t> shape) {
    std::string e = sieve::check_tensor(t, what, int32_t(shape.size()), shape);
    if (e.empty() && (!t->data || t->device.device_type != dev.device_type || t->device.device_id != dev.device_id))
      e = std::string(what) + " must be on " + sieve::device_name(dev);
    if (!e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    return sieve::require_storage(t->dtype, what);
  };
  const int32_t d = g.head_dim;
  packing::BlockPackLaunch pk{};
  pk.k_pages = sieve::data_ptr<const void>(view.k_pages);
  pk.k_strides = view_strides(view);
  pk.kv_dtype = tensor(&view.k_pages, "k_pages", {-1, g.n_kv_heads, g.page_size, d});
  pk.hkv = g.n_kv_heads;
  pk.d = d;
  pk.page_size = g.page_size;
  pk.B = B;
  pk.threshold = pack_threshold_;
  pk.keep = nullptr;
  pk.anchor_off = anchor_off_d_.get<uint8_t>();
  pk.n_anchors = n_anchors_d_.get<int32_t>();
  pk.stream = stream;
  if (call.batch > 0 && (!view.indices.data || !view.indptr_host))
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the view's page table is NULL");
  DeltaxLaunch a{};
  a.B = B;
  a.hq = g.n_q_heads;
  a.hkv = g.n_kv_heads;
  a.max_seq_len = g.max_seq_len;
  a.H = H;
  a.rows_per_kv_head = per_kv_head_;
  a.sel_indptr = sieve::data_ptr<const int32_t>(sel.indptr);
  a.sel_indices = sieve::data_ptr<const int32_t>(sel.indices);
  a.exact_words = exact_words_;
  a.anchor_off = anchor_off_d_.get<uint8_t>();
  a.n_anchors = n_anchors_d_.get<int32_t>();
  a.packed_pos = packed_pos_d_.get<int32_t>();
  a.packed_count = packed_count_d_.get<int32_t>();
  a.row_spans = row_spans_d_.get<int32_t>();
  a.span_stride = row_span_capacity(B, g.max_seq_len);
  a.spans = spans_d_.get<int32_t>();
  a.stream = stream;
  int64_t blocks0 = 0;  // query blocks of the earlier sequences
  for (int32_t b = 0; b < call.batch; ++b) {
    a.n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
    a.kv_len = call.kv_len_host[b];
    a.QB = int32_t((a.n_new + B - 1) / B);
    a.KB = int32_t((a.kv_len + B - 1) / B);
    a.sel_row0 = blocks0 * H;
    a.var_row0 = blocks0 * g.n_q_heads;
    a.exact_bits = exact_bits_d_.get<uint32_t>() + blocks0 * g.n_q_heads * exact_words_;
    a.packed_base = int64_t(b) * g.n_kv_heads * g.max_seq_len;
    a.span_base = int64_t(b) * g.n_q_heads * a.span_stride;
    blocks0 += a.QB;
    if (a.QB == 0) continue;
    pk.pages = sieve::data_ptr<const int32_t>(view.indices) + view.indptr_host[b];
    pk.n = a.kv_len;
    // The next sequence's packing reuses the scratch after this sequence's spans (one stream).
    if (const char* e = packing::launch_block_pack(pk))
      sp::fail(SIEVE_ERR_DEVICE, "dpxa deltax packing failed to launch: ", e);
    if (const char* e = launch_deltax_spans(a)) sp::fail(SIEVE_ERR_DEVICE, "dpxa deltax spans failed to launch: ", e);
  }
  if (blocks0 == 0) return;
  // DeltaX's arithmetic is f32 throughout (its CPU path's, docs/methods/dpxa.md): no 16-bit weights.
  const sp::AttentionVariant v(dev, SIEVE_SEL_PER_Q_HEAD, B, int32_t(blocks0 * g.n_q_heads), row_spans_d_.get<int32_t>(),
                               spans_capacity_, spans_d_.get<int32_t>(),
                               int64_t(g.max_batch) * g.n_kv_heads * g.max_seq_len, packed_pos_d_.get<int32_t>(),
                               packed_count_d_.get<int32_t>(), SIEVE_VARIANT_F32_WEIGHTS);
  sp::host_kernel_attend(services, v.args(call, out, g, cfg_.scale), "dpxa deltax (the core kernel's attention variant)");
}

}  // namespace sieve::dpxa
