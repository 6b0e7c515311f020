#include "call_data.hpp"

#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/page_layout.hpp>
#include <sieve/util/tensor.hpp>

#include <string>

namespace sieve::dpxa {

namespace sp = sieve::plugin;

void check_cpu_tensors(const sieve_geometry& g, const sieve_layer_call& call, const sieve_paged_kv& view) {
  const int64_t n_q = call.qo_indptr_host[call.batch];
  if (std::string e = sieve::check_tensor(call.q, "q", 3, {n_q, g.n_q_heads, g.head_dim});
      !e.empty() || !sieve::is_float_storage(call.q->dtype) || !sieve::is_contiguous(*call.q))
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e.empty() ? "q: not a contiguous f32/f16/bf16 tensor" : e);
  if (std::string e = sieve::check_tensor(&view.k_pages, "k_pages", 4, {-1, g.n_kv_heads, g.page_size, g.head_dim});
      !e.empty())
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
  page_strides_of(view.k_pages, "k_pages");
  if (!view.indices.data) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the view's page indices are NULL");
}

PageStrides page_strides_of(const DLTensor& pages, const char* what) {
  PageStrides at;
  if (std::string e = sieve::page_strides(pages, what, &at); !e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
  return at;
}

PageStrides view_strides(const sieve_paged_kv& view) {
  PageStrides at;
  if (std::string e = sieve::view_page_strides(view, &at); !e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
  return at;
}

void gather_q(const sieve_geometry& g, const sieve_layer_call& call, int32_t b, int32_t h, std::vector<float>& out) {
  const DLTensor& q = *call.q;
  const int64_t q0 = call.qo_indptr_host[b], n = call.qo_indptr_host[b + 1] - q0;
  const int32_t d = g.head_dim;
  out.resize(size_t(n * d));
  const void* base = sieve::data_ptr<const void>(q);
  for (int64_t i = 0; i < n; ++i)
    for (int32_t x = 0; x < d; ++x)
      out[size_t(i * d + x)] = sieve::load_float(base, q.dtype, ((q0 + i) * g.n_q_heads + h) * d + x);
}

void gather_pages(const sieve_geometry& g, const sieve_paged_kv& view, const DLTensor& pages_t, int32_t b, int32_t kvh,
                  int64_t kv_len, std::vector<float>& out) {
  const int32_t d = g.head_dim, ps = g.page_size;
  out.resize(size_t(kv_len * d));
  const int32_t* pages = sieve::data_ptr<const int32_t>(view.indices) + view.indptr_host[b];
  const void* base = sieve::data_ptr<const void>(pages_t);
  const PageStrides at = page_strides_of(pages_t, &pages_t == &view.v_pages ? "v_pages" : "k_pages");
  for (int64_t p = 0; p < kv_len; ++p) {
    const int64_t o = at.row(pages[p / ps], kvh, p % ps);
    for (int32_t x = 0; x < d; ++x) out[size_t(p * d + x)] = sieve::load_float(base, pages_t.dtype, o + x);
  }
}

void metric(const sieve_host_services& s, const char* name, int32_t layer, double value, int32_t head) {
  if (s.metric) s.metric(s.host_ctx, name, layer, head, value);
}

}  // namespace sieve::dpxa
