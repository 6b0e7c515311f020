// DeltaXAttention on the CPU: per (sequence, KV head) pack every key block, then describe each q
// head's rows over the selection's kept tiles as the core kernel's attention variant (an exact
// tile: a KEYS span; a packed one: a PACKED span over its anchors, counts reach - anchor + 1) and
// let the host's kernel attend them.
#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <string>
#include <utility>

#include "deltax_attention.hpp"

namespace sieve::dpxa {

namespace sp = sieve::plugin;

void DeltaXAttention::attend_cpu(const sieve_layer_call& call, const sieve_selection& sel, DLTensor& out,
                                 const sieve_host_services& services) {
  const sieve_geometry& g = g_;
  const int32_t B = cfg_.block, d = g.head_dim, group = g.n_q_heads / g.n_kv_heads;
  const int32_t H = per_kv_head_ ? g.n_kv_heads : g.n_q_heads;
  const sieve_paged_kv& view = *call.kv_view;
  check_cpu_tensors(g, call, view);
  const int64_t n_q = call.qo_indptr_host[call.batch];
  for (const auto& [t, what] : {std::pair<const DLTensor*, const char*>{&out, "out"}, {&view.v_pages, "v_pages"}}) {
    std::string e = t == &out ? sieve::check_tensor(t, what, 3, {n_q, g.n_q_heads, d})
                              : sieve::check_tensor(t, what, 4, {-1, g.n_kv_heads, g.page_size, d});
    if (e.empty() && (!sieve::is_float_storage(t->dtype) || (t == &out && !sieve::is_contiguous(*t))))
      e = std::string(what) + (t == &out ? " must be a contiguous f32/f16/bf16 tensor" : " must be f32/f16/bf16");
    if (!e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
  }
  variant_.clear();
  const int32_t* indptr = sieve::data_ptr<const int32_t>(sel.indptr);
  const int32_t* indices = sieve::data_ptr<const int32_t>(sel.indices);
  // KV loads per q head, for the kv reduction: block-sparse (every kept key) and saved.
  std::vector<double>& full = load_full_;
  std::vector<double>& saved = load_saved_;
  full.assign(size_t(g.n_q_heads), 0.0);
  saved.assign(size_t(g.n_q_heads), 0.0);
  int64_t tiles = 0, packed = 0;
  int32_t row0 = 0;
  variant_.row_spans.assign(size_t(call.qo_indptr_host[call.batch] + int64_t(call.batch) * B) / size_t(B) * 2 *
                                size_t(g.n_q_heads) + 2,
                            0);
  for (int32_t b = 0; b < call.batch; ++b) {
    const int32_t n = call.kv_len_host[b], q0 = call.qo_indptr_host[b];
    const int32_t n_new = call.qo_indptr_host[b + 1] - q0, blocks = (n_new + B - 1) / B;
    for (int32_t kvh = 0; kvh < g.n_kv_heads; ++kvh) {
      gather_pages(g, view, view.k_pages, b, kvh, n, k_);
      deltax::pack_tiles(k_.data(), n, d, B, pack_threshold_, pack_);
      const int32_t base = int32_t(variant_.packed_pos.size());  // this head's anchors in the variant
      const int32_t m = pack_.first.empty() ? 0 : pack_.first.back();
      for (int32_t a = 0; a < m; ++a) {
        variant_.packed_pos.push_back(pack_.anchor[size_t(a)]);
        variant_.packed_count.push_back(pack_.reach[size_t(a)] - pack_.anchor[size_t(a)] + 1);
      }
      for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        for (int32_t t = 0; t < blocks; ++t) {
          const RowSpan span = row_span(n, n_new, B, t);
          const int64_t r = int64_t(row0 + t) * H + (per_kv_head_ ? kvh : h);
          const int32_t* kept = indices + indptr[r];
          const int32_t n_kept = indptr[r + 1] - indptr[r];
          for (int32_t i = 0; i < n_kept; ++i)
            if (kept[i] < 0 || kept[i] >= span.n_candidates || (i > 0 && kept[i] <= kept[i - 1]))
              sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "selection row ", r, " entry ", i, " = ", kept[i],
                       ": not an ascending key block in [0, ", span.n_candidates, ")");
          exact_.resize(size_t(n_kept));
          const float* shares = shares_.row(row0 + t, h, g.n_q_heads);
          packed += deltax::exact_tiles(kept, n_kept, span.diag_first, shares, exact_top_, exact_.data(), rank_);
          tiles += n_kept;
          for (int32_t i = 0; i < n_kept; ++i) {
            const int32_t j = kept[i], keys = std::min(B, n - j * B);
            full[size_t(h)] += keys;
            if (!exact_[size_t(i)]) saved[size_t(h)] += keys - (pack_.first[size_t(j) + 1] - pack_.first[size_t(j)]);
          }
          // The variant row of (query block t, q head h): its kept tiles in ascending order.
          const int64_t vrow = int64_t(row0 + t) * g.n_q_heads + h;
          variant_.row_spans[size_t(2 * vrow)] = int32_t(variant_.spans.size() / 3);
          for (int32_t i = 0; i < n_kept; ++i) {
            const int32_t j = kept[i];
            if (exact_[size_t(i)])
              variant_.spans.insert(variant_.spans.end(), {SIEVE_SPAN_KEYS, j * B, std::min((j + 1) * B, n)});
            else
              variant_.spans.insert(variant_.spans.end(), {SIEVE_SPAN_PACKED, base + pack_.first[size_t(j)],
                                                           base + pack_.first[size_t(j) + 1]});
          }
          variant_.row_spans[size_t(2 * vrow + 1)] = int32_t(variant_.spans.size() / 3);
        }
      }
    }
    row0 += blocks;
  }
  // DeltaX's arithmetic is f32 throughout (docs/methods/dpxa.md): no 16-bit weights on any device.
  const sp::AttentionVariant v = variant_.variant(B, row0 * g.n_q_heads, SIEVE_VARIANT_F32_WEIGHTS);
  sp::host_kernel_attend(services, v.args(call, out, g, cfg_.scale), "dpxa deltax (the core kernel's attention variant)");
  // KV reduction relative to the block-sparse kernel (the paper's f·(1 - p)), per q head.
  double all_full = 0, all_saved = 0;
  for (int32_t h = 0; h < g.n_q_heads; ++h) {
    if (full[size_t(h)] > 0) metric(services, "deltax_kv_reduction", call.layer, saved[size_t(h)] / full[size_t(h)], h);
    all_full += full[size_t(h)];
    all_saved += saved[size_t(h)];
  }
  if (all_full > 0) metric(services, "deltax_kv_reduction", call.layer, all_saved / all_full);
  if (tiles > 0) metric(services, "deltax_packed", call.layer, double(packed) / double(tiles));
}

}  // namespace sieve::dpxa
