// The f64 attention reference (see attention_ref.hpp): the definition, spelled out.
#include "sieve/reference/attention_ref.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::reference {
namespace {

using kernels::kv_len;
using kernels::kv_pages;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

void require_valid(const sieve_attention_args& a) {
  auto fail_if = [](const std::string& e) {
    if (!e.empty()) throw std::invalid_argument(e);
  };
  fail_if(kernels::check_attention_args(a));
  fail_if(kernels::unsupported_attention_request(a));  // v1 defines page statistics for decode only
  if (a.q->device.device_type != kDLCPU)
    throw std::invalid_argument("q: on " + device_name(a.q->device) +
                                ", the f64 reference reads host memory only");
  fail_if(kernels::check_page_table_contents(a, data_ptr<const int32_t>(a.kv->indices)));
  if (a.selection && a.selection->kind == SIEVE_SEL_BLOCKS)
    fail_if(kernels::check_selection_contents(a, data_ptr<const int32_t>(a.selection->indptr),
                                              data_ptr<const int32_t>(a.selection->indices)));
}

double resolved_scale(const sieve_attention_args& a) {
  return a.scale != 0.f ? double(a.scale) : 1.0 / std::sqrt(double(a.head_dim));
}

int32_t sequence_of(const sieve_attention_args& a, int32_t token) {
  const int32_t* qo = a.qo_indptr_host;
  return int32_t(std::upper_bound(qo, qo + a.kv->batch + 1, token) - qo) - 1;
}

// K or V of one sequence gathered in token order, as double: [kv_len, n_kv_heads, head_dim].
std::vector<double> gather(const sieve_attention_args& a, const DLTensor& pages, int32_t b) {
  const sieve_paged_kv& kv = *a.kv;
  const int32_t hkv = a.n_kv_heads, d = a.head_dim, ps = kv.page_size;
  const int32_t len = kv_len(kv, b);
  const int32_t* ids = data_ptr<const int32_t>(kv.indices) + kv.indptr_host[b];
  const void* base = data_ptr<const void>(pages);
  const PageStrides at = kernels::attention_shape(a).pages;  // checked by require_valid
  std::vector<double> x(size_t(len) * hkv * d);
  for (int32_t t = 0; t < len; ++t)
    for (int32_t g = 0; g < hkv; ++g)
      for (int32_t i = 0; i < d; ++i) {
        const int64_t src = at.row(ids[t / ps], g, t % ps) + i;
        x[(size_t(t) * hkv + g) * d + i] = load_float(base, pages.dtype, src);
      }
  return x;
}

// The mask of attended keys of query `token` (local index i in sequence b), head h.
std::vector<uint8_t> key_mask(const sieve_attention_args& a, bool use_selection, int32_t b,
                              int32_t i, int32_t h) {
  const sieve_paged_kv& kv = *a.kv;
  const int32_t len = kv_len(kv, b);
  const int32_t n_b = a.qo_indptr_host[b + 1] - a.qo_indptr_host[b];
  const int32_t pos = len - n_b + i;
  std::vector<uint8_t> mask(size_t(len), 0);
  const bool causal = a.phase == SIEVE_PHASE_PREFILL;
  auto allow_page = [&](int32_t p) {
    for (int32_t t = p * kv.page_size; t < std::min(len, (p + 1) * kv.page_size); ++t)
      if (!causal || t <= pos) mask[size_t(t)] = 1;
  };
  const sieve_selection* s = a.selection;
  if (!use_selection || !s || s->kind == SIEVE_SEL_ALL) {
    for (int32_t p = 0; p < kv_pages(kv, b); ++p) allow_page(p);
    return mask;
  }
  const int32_t H = kernels::selection_head_count(s->heads, a.n_q_heads, a.n_kv_heads);
  const int64_t c_b = kernels::query_block_offsets(a.qo_indptr_host, a.kv->batch, s->q_block)[size_t(b)];
  const int64_t row = kernels::selection_row(
      c_b, i / s->q_block, H,
      kernels::selection_head(s->heads, h, a.n_q_heads / a.n_kv_heads));
  const int32_t* indptr = data_ptr<const int32_t>(s->indptr);
  const int32_t* blocks = data_ptr<const int32_t>(s->indices);
  for (int32_t e = indptr[row]; e < indptr[row + 1]; ++e)
    for (int32_t p = blocks[e] * s->k_block_pages;
         p < std::min((blocks[e] + 1) * s->k_block_pages, kv_pages(kv, b)); ++p)
      allow_page(p);
  return mask;
}

}  // namespace

std::vector<uint8_t> attended_keys(const sieve_attention_args& a, int32_t token, int32_t head) {
  require_valid(a);
  if (token < 0 || token >= a.qo_indptr_host[a.kv->batch])
    throw std::invalid_argument("token: " + std::to_string(token) + " is not a query token");
  if (head < 0 || head >= a.n_q_heads)
    throw std::invalid_argument("head: " + std::to_string(head) + " is not a query head");
  const int32_t b = sequence_of(a, token);
  return key_mask(a, true, b, token - a.qo_indptr_host[b], head);
}

RefAttention attend_reference(const sieve_attention_args& a, const RefOptions& opt) {
  require_valid(a);
  const sieve_paged_kv& kv = *a.kv;
  const int32_t T = a.qo_indptr_host[kv.batch], hq = a.n_q_heads, hkv = a.n_kv_heads,
                d = a.head_dim, group = hq / hkv;
  const double scale = resolved_scale(a);

  RefAttention r;
  r.n_q_tokens = T;
  r.hq = hq;
  r.d = d;
  r.computed.assign(size_t(T), a.q_rows ? 0 : 1);
  if (a.q_rows) {
    const int32_t* rows = data_ptr<const int32_t>(*a.q_rows);
    for (int64_t i = 0; i < a.q_rows->shape[0]; ++i) r.computed[size_t(rows[i])] = 1;
  }
  r.out.assign(size_t(T) * hq * d, 0.0);
  r.lse.assign(size_t(T) * hq, kNegInf);
  r.stats_h = a.stats == SIEVE_STATS_PAGE_MASS_PER_KV_HEAD ? hkv
              : a.stats == SIEVE_STATS_PAGE_MASS_ALL_HEADS ? 1
                                                           : 0;
  const int64_t nnz = kv.indptr_host[kv.batch];
  if (r.stats_h) r.page_mass.assign(size_t(nnz) * r.stats_h, 0.0);
  if (opt.keep_probs) {
    r.probs_indptr.assign(size_t(T) * hq + 1, 0);
    for (int32_t t = 0; t < T; ++t)
      for (int32_t h = 0; h < hq; ++h) {
        const int64_t i = int64_t(t) * hq + h;
        r.probs_indptr[i + 1] =
            r.probs_indptr[i] + (r.computed[t] ? kv_len(kv, sequence_of(a, t)) : 0);
      }
    r.probs.assign(size_t(r.probs_indptr.back()), 0.0);
    r.attended.assign(size_t(r.probs_indptr.back()), 0);
  }

  const void* q = data_ptr<const void>(*a.q);
  for (int32_t b = 0; b < kv.batch; ++b) {
    const int32_t len = kv_len(kv, b);
    const std::vector<double> K = gather(a, kv.k_pages, b);
    const std::vector<double> V = gather(a, kv.v_pages, b);
    // p_h(t) of the sequence's (decode: single) query, per head, for the page statistics.
    std::vector<double> probs_of_heads(r.stats_h ? size_t(hq) * len : 0, 0.0);

    for (int32_t i = 0; i < a.qo_indptr_host[b + 1] - a.qo_indptr_host[b]; ++i) {
      const int32_t token = a.qo_indptr_host[b] + i;
      if (!r.computed[token]) continue;
      for (int32_t h = 0; h < hq; ++h) {
        const int32_t g = h / group;
        const std::vector<uint8_t> mask = key_mask(a, !opt.ignore_selection, b, i, h);
        std::vector<double> qrow(static_cast<size_t>(d));
        for (int32_t c = 0; c < d; ++c)
          qrow[size_t(c)] = load_float(q, a.q->dtype, (int64_t(token) * hq + h) * d + c);
        if (opt.keep_probs)
          std::copy(mask.begin(), mask.end(),
                    r.attended.begin() + r.probs_indptr[size_t(token) * hq + h]);
        std::vector<double> logit(size_t(len), kNegInf);
        double mx = kNegInf;
        for (int32_t t = 0; t < len; ++t) {
          if (!mask[t]) continue;
          double s = 0;
          for (int32_t c = 0; c < d; ++c) s += qrow[size_t(c)] * K[(size_t(t) * hkv + g) * d + c];
          logit[t] = s * scale;
          mx = std::max(mx, logit[t]);
        }
        if (mx == kNegInf) continue;  // attends nothing: out 0, lse -inf
        double sum = 0;
        for (int32_t t = 0; t < len; ++t)
          if (mask[t]) sum += std::exp(logit[t] - mx);
        const double lse = mx + std::log(sum);
        r.lse[size_t(token) * hq + h] = lse;
        double* o = r.out.data() + (size_t(token) * hq + h) * d;
        for (int32_t t = 0; t < len; ++t) {
          if (!mask[t]) continue;
          const double p = std::exp(logit[t] - lse);
          for (int32_t c = 0; c < d; ++c) o[c] += p * V[(size_t(t) * hkv + g) * d + c];
          if (opt.keep_probs) r.probs[size_t(r.probs_indptr[size_t(token) * hq + h] + t)] = p;
          if (r.stats_h) probs_of_heads[size_t(h) * len + t] = p;
        }
      }
    }

    // Page statistics (decode): Σ over the page's tokens of the max over the column's heads.
    if (r.stats_h) {
      for (int32_t col = 0; col < r.stats_h; ++col) {
        const int32_t h_begin = r.stats_h == 1 ? 0 : col * group;
        const int32_t h_end = r.stats_h == 1 ? hq : (col + 1) * group;
        for (int32_t t = 0; t < len; ++t) {
          double best = 0;
          for (int32_t h = h_begin; h < h_end; ++h)
            best = std::max(best, probs_of_heads[size_t(h) * len + t]);
          r.page_mass[size_t(kv.indptr_host[b] + t / kv.page_size) * r.stats_h + col] += best;
        }
      }
    }
  }
  return r;
}

}  // namespace sieve::reference
