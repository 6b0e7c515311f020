// attend_variant_cpu: one (query token, query head) at a time, the row's spans walked in order.
// Logits in f32 (scale·q·k, plus ln of the causally clipped count and the bias of a packed key),
// the softmax's normaliser in f64, the weighted sum of V in f32.
#include "attention_variant_cpu.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kernels {
namespace {

struct VariantCall {
  const sieve_attention_args* a;
  AttentionShape s;
  const int32_t* row_spans;
  const int32_t* spans;
  const int32_t* packed_pos;
  const int32_t* packed_count;  // nullptr: counts 1
  const float* packed_bias;     // nullptr: 0
  const int32_t* kv_indices;
  const void* q;
  void* out;
  float* lse;
  const void* k;
  const void* v;
  std::vector<int64_t> c_b;     // query blocks before each sequence (the variant's q_block)
};

// Per thread: one row's keys (position, log-domain bias), their logits, q and the output in f32.
struct RowScratch {
  std::vector<int32_t> key;
  std::vector<float> bias, q, o;
};

// Element offset of the K/V row of position k of sequence b, KV head kvh.
int64_t kv_row(const VariantCall& c, int32_t b, int32_t kvh, int32_t k) {
  const int32_t P = c.s.page_size;
  const int32_t phys = c.kv_indices[c.a->kv->indptr_host[b] + k / P];
  return c.s.pages.row(phys, kvh, k % P);
}

void attend_row(const VariantCall& c, int32_t b, int32_t tok, int32_t h, RowScratch& w) {
  const sieve_attention_args& a = *c.a;
  const AttentionShape& s = c.s;
  const int32_t q0 = a.qo_indptr_host[b], n_q = a.qo_indptr_host[b + 1] - q0, local = tok - q0;
  const int32_t len = kv_len(*a.kv, b), pos = len - n_q + local, d = s.d, kvh = h / s.group;
  const int64_t row = (c.c_b[size_t(b)] + local / s.var_q_block) * s.var_h +
                      selection_head(s.var_heads, h, s.group);
  w.key.clear();
  w.bias.clear();
  for (int32_t i = c.row_spans[2 * row]; i < c.row_spans[2 * row + 1]; ++i) {
    const int32_t kind = c.spans[3 * i], begin = c.spans[3 * i + 1], end = c.spans[3 * i + 2];
    if (kind == SIEVE_SPAN_KEYS) {
      for (int32_t k = begin; k < std::min(end, pos + 1); ++k) {
        w.key.push_back(k);
        w.bias.push_back(0.f);
      }
      continue;
    }
    for (int32_t e = begin; e < end; ++e) {
      const int32_t k = c.packed_pos[e];
      if (k > pos) continue;  // causal
      float bias = c.packed_bias ? c.packed_bias[e] : 0.f;
      if (c.packed_count) bias += std::log(float(std::min(c.packed_count[e], pos - k + 1)));
      w.key.push_back(k);
      w.bias.push_back(bias);
    }
  }
  const int64_t qrow = (int64_t(tok) * s.hq + h) * d;
  for (int32_t x = 0; x < d; ++x) w.q[size_t(x)] = load_float(c.q, a.q->dtype, qrow + x);
  const DLDataType kv_dt = a.kv->k_pages.dtype;
  float mx = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < w.key.size(); ++j) {  // logits in place of the biases
    const int64_t at = kv_row(c, b, kvh, w.key[j]);
    float dot = 0.f;
    for (int32_t x = 0; x < d; ++x) dot += w.q[size_t(x)] * load_float(c.k, kv_dt, at + x);
    w.bias[j] += dot * s.scale;
    mx = std::max(mx, w.bias[j]);
  }
  std::fill(w.o.begin(), w.o.end(), 0.f);
  double sum = 0;
  for (size_t j = 0; j < w.key.size(); ++j) {
    const float p = std::exp(w.bias[j] - mx);
    sum += p;
    const int64_t at = kv_row(c, b, kvh, w.key[j]);
    for (int32_t x = 0; x < d; ++x) w.o[size_t(x)] += p * load_float(c.v, kv_dt, at + x);
  }
  const float inv = sum > 0 ? float(1.0 / sum) : 0.f;  // nothing visible: 0
  for (int32_t x = 0; x < d; ++x) store_float(c.out, a.out->dtype, qrow + x, w.o[size_t(x)] * inv);
  if (c.lse)
    c.lse[int64_t(tok) * s.hq + h] =
        sum > 0 ? float(double(mx) + std::log(sum)) : -std::numeric_limits<float>::infinity();
}

}  // namespace

sieve_status attend_variant_cpu(const sieve_attention_args& a, int threads, std::string* error) {
  const sieve_attention_variant& v = *attention_variant(a);
  VariantCall c;
  c.a = &a;
  c.s = attention_shape(a);
  c.row_spans = data_ptr<const int32_t>(v.row_spans);
  c.spans = data_ptr<const int32_t>(v.spans);
  c.packed_pos = data_ptr<const int32_t>(v.packed_pos);
  c.packed_count = v.packed_count.data ? data_ptr<const int32_t>(v.packed_count) : nullptr;
  c.packed_bias = v.packed_bias.data ? data_ptr<const float>(v.packed_bias) : nullptr;
  if (std::string e = check_variant_contents(a, c.row_spans, c.spans, c.packed_pos, c.packed_count); !e.empty()) {
    if (error) *error = e;
    return SIEVE_ERR_INVALID_ARGUMENT;
  }
  c.kv_indices = data_ptr<const int32_t>(a.kv->indices);
  c.q = data_ptr<const void>(*a.q);
  c.out = data_ptr<void>(*a.out);
  c.lse = a.lse ? data_ptr<float>(*a.lse) : nullptr;
  c.k = data_ptr<const void>(a.kv->k_pages);
  c.v = data_ptr<const void>(a.kv->v_pages);
  c.c_b = query_block_offsets(a.qo_indptr_host, c.s.batch, c.s.var_q_block);
  // Work item = (query token, query head); each thread keeps its own row scratch.
  const int64_t n = int64_t(c.s.n_q_tokens) * c.s.hq;
  std::vector<int32_t> seq(size_t(c.s.n_q_tokens));
  for (int32_t b = 0; b < c.s.batch; ++b)
    for (int32_t t = a.qo_indptr_host[b]; t < a.qo_indptr_host[b + 1]; ++t) seq[size_t(t)] = b;
#pragma omp parallel num_threads(threads > 0 ? threads : 1)
  {
    RowScratch w;
    w.q.resize(size_t(c.s.d));
    w.o.resize(size_t(c.s.d));
#pragma omp for schedule(dynamic, 16)
    for (int64_t i = 0; i < n; ++i) {
      const int32_t tok = int32_t(i / c.s.hq), h = int32_t(i % c.s.hq);
      attend_row(c, seq[size_t(tok)], tok, h, w);
    }
  }
  return SIEVE_OK;
}

}  // namespace sieve::kernels
