// DeltaXAttention on CUDA, the host side: the scratch select and attend share (allocated once,
// when the instance is created) and, per sequence, core/packing's block walk then
// cuda/deltax_attend.cu over the selection with the exact bits the select left.
#include <sieve/packing/block_pack_cuda.hpp>
#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/tensor.hpp>

#include <initializer_list>
#include <string>

#include "cuda/deltax_attend.hpp"
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
}

DeviceShares DeltaXAttention::device_shares() const {
  return {shares_d_.get<float>(), exact_bits_d_.get<uint32_t>(), exact_words_, exact_top_};
}

void DeltaXAttention::attend_cuda(const sieve_layer_call& call, const sieve_selection& sel, DLTensor& out,
                                  void* stream) {
  const sieve_geometry& g = g_;
  const DLDevice dev = g.device;
  const sieve_paged_kv& view = *call.kv_view;
  const int32_t B = cfg_.block, H = per_kv_head_ ? g.n_kv_heads : g.n_q_heads;
  const int64_t n_q = call.batch > 0 ? call.qo_indptr_host[call.batch] : 0;
  auto tensor = [&](const DLTensor* t, const char* what, std::initializer_list<int64_t> shape) {
    const bool pages = shape.size() == 4;  // K/V pages: any layout (strides below)
    std::string e = sieve::check_tensor(t, what, int32_t(shape.size()), shape);
    if (e.empty() && (!t->data || t->device.device_type != dev.device_type || t->device.device_id != dev.device_id ||
                      (!pages && !sieve::is_contiguous(*t))))
      e = std::string(what) + (pages ? " must be on " : " must be a contiguous tensor on ") + sieve::device_name(dev);
    if (!e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    return sieve::require_storage(t->dtype, what);
  };
  const int32_t d = g.head_dim;
  DeltaxLaunch a{};
  a.q_dtype = tensor(call.q, "q", {n_q, g.n_q_heads, d});
  a.out_dtype = tensor(&out, "out", {n_q, g.n_q_heads, d});
  a.kv_dtype = tensor(&view.k_pages, "k_pages", {-1, g.n_kv_heads, g.page_size, d});
  if (tensor(&view.v_pages, "v_pages", {-1, g.n_kv_heads, g.page_size, d}) != a.kv_dtype)
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "k_pages and v_pages differ in dtype");
  a.kv_strides = view_strides(view);
  if (call.batch > 0 && (!view.indices.data || !view.indptr_host))
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the view's page table is NULL");
  a.B = B;
  a.d = d;
  a.hq = g.n_q_heads;
  a.hkv = g.n_kv_heads;
  a.page_size = g.page_size;
  a.H = H;
  a.rows_per_kv_head = per_kv_head_;
  a.scale = cfg_.scale;
  a.q = sieve::data_ptr<const void>(*call.q);
  a.k_pages = sieve::data_ptr<const void>(view.k_pages);
  a.v_pages = sieve::data_ptr<const void>(view.v_pages);
  a.out = sieve::data_ptr<void>(out);
  a.sel_indptr = sieve::data_ptr<const int32_t>(sel.indptr);
  a.sel_indices = sieve::data_ptr<const int32_t>(sel.indices);
  a.exact_words = exact_words_;
  a.anchor_off = anchor_off_d_.get<uint8_t>();
  a.n_anchors = n_anchors_d_.get<int32_t>();
  a.stream = stream;
  packing::BlockPackLaunch pk{};
  pk.k_pages = a.k_pages;
  pk.k_strides = a.kv_strides;
  pk.kv_dtype = a.kv_dtype;
  pk.hkv = g.n_kv_heads;
  pk.d = d;
  pk.page_size = g.page_size;
  pk.B = B;
  pk.threshold = pack_threshold_;
  pk.keep = nullptr;
  pk.anchor_off = anchor_off_d_.get<uint8_t>();
  pk.n_anchors = n_anchors_d_.get<int32_t>();
  pk.stream = a.stream;
  int64_t blocks0 = 0;  // query blocks of the earlier sequences
  for (int32_t b = 0; b < call.batch; ++b) {
    a.q_token0 = call.qo_indptr_host[b];
    a.n_new = int64_t(call.qo_indptr_host[b + 1]) - a.q_token0;
    a.kv_len = call.kv_len_host[b];
    a.QB = int32_t((a.n_new + B - 1) / B);
    a.KB = int32_t((a.kv_len + B - 1) / B);
    a.sel_row0 = blocks0 * H;
    a.exact_bits = exact_bits_d_.get<uint32_t>() + blocks0 * g.n_q_heads * exact_words_;
    blocks0 += a.QB;
    if (a.QB == 0) continue;
    a.pages = sieve::data_ptr<const int32_t>(view.indices) + view.indptr_host[b];
    pk.pages = a.pages;
    pk.n = a.kv_len;
    // The next sequence's packing reuses the scratch after this attention (one stream).
    if (const char* e = packing::launch_block_pack(pk))
      sp::fail(SIEVE_ERR_DEVICE, "dpxa deltax packing failed to launch: ", e);
    if (const char* e = launch_deltax_attend(a)) sp::fail(SIEVE_ERR_DEVICE, "dpxa deltax attention failed to launch: ", e);
  }
}

}  // namespace sieve::dpxa
