#include "call_data.hpp"

#include <sieve/plugin/policy_api.hpp>
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
      !e.empty() || !sieve::is_contiguous(view.k_pages))
    sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e.empty() ? "k_pages: not contiguous" : e);
  if (!view.indices.data) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the view's page indices are NULL");
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
  for (int64_t p = 0; p < kv_len; ++p) {
    const int64_t o = ((int64_t(pages[p / ps]) * g.n_kv_heads + kvh) * ps + p % ps) * d;
    for (int32_t x = 0; x < d; ++x) out[size_t(p * d + x)] = sieve::load_float(base, pages_t.dtype, o + x);
  }
}

int32_t dtype_code(DLDataType t, const char* what) {
  if (sieve::same_dtype(t, sieve::kF32)) return 0;
  if (sieve::same_dtype(t, sieve::kF16)) return 1;
  if (sieve::same_dtype(t, sieve::kBF16)) return 2;
  sp::fail(SIEVE_ERR_INVALID_ARGUMENT, what, " has dtype ", sieve::dtype_name(t), ", not f32/f16/bf16");
}

void metric(const sieve_host_services& s, const char* name, int32_t layer, double value, int32_t head) {
  if (s.metric) s.metric(s.host_ctx, name, layer, head, value);
}

}  // namespace sieve::dpxa
