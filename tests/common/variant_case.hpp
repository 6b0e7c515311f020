// A random attention variant (sieve_attention_variant) over a reference Workload, and its f64
// reference: what the core kernels' extension point must compute, written out plainly. Rows get
// KEYS spans reaching past the causal limit and the sequence's end, PACKED spans over per-(sequence,
// KV head) lists of packed keys with counts (some larger than the keys a query may see: the
// causal clip) and logit biases, shared spans, and empty rows (output 0).
#pragma once
#include <algorithm>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/attention_tolerance.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve::variant_test {

struct VariantCase {
  HostTensor row_spans, spans, packed_pos, packed_count, packed_bias;
  sieve_attention_variant v{};
  int32_t max_count = 1;
  double max_bias = 0;
  int64_t max_keys = 0;  // keys of the longest row (for the error bound)

  // Installs itself as w.args.variant. `counts` / `biases`: fill packed_count / packed_bias.
  VariantCase(reference::Workload& w, uint32_t heads, int32_t q_block, uint64_t seed, bool counts = true,
              bool biases = true) {
    std::mt19937 rng{uint32_t(seed)};
    const sieve_attention_args& a = w.args;
    const int32_t hkv = a.n_kv_heads, group = a.n_q_heads / hkv;
    const int32_t H = kernels::selection_head_count(heads, a.n_q_heads, hkv);
    // Packed keys per (sequence, KV head): a random subset of the positions, ascending.
    std::vector<int32_t> pos, cnt;
    std::vector<float> bias;
    std::vector<int32_t> list0;  // first packed key of (b, kvh)
    std::normal_distribution<float> normal(0.f, 0.7f);
    for (int32_t b = 0; b < w.batch; ++b)
      for (int32_t g = 0; g < hkv; ++g) {
        list0.push_back(int32_t(pos.size()));
        for (int32_t p = 0; p < w.kv_len[size_t(b)]; ++p)
          if (rng() % 3 == 0) {
            pos.push_back(p);
            cnt.push_back(1 + int32_t(rng() % 9));
            bias.push_back(normal(rng));
          }
      }
    list0.push_back(int32_t(pos.size()));
    std::vector<int32_t> rs, sp;
    const std::vector<int64_t> c_b = kernels::query_block_offsets(w.args.qo_indptr_host, w.batch, q_block);
    for (int32_t b = 0; b < w.batch; ++b) {
      const int32_t len = w.kv_len[size_t(b)];
      for (int64_t r = c_b[size_t(b)] * H; r < c_b[size_t(b) + 1] * H; ++r) {
        const int32_t rh = int32_t(r % H);
        const int32_t kvh = heads == SIEVE_SEL_PER_Q_HEAD ? rh / group : heads == SIEVE_SEL_PER_KV_HEAD ? rh : 0;
        const int32_t first = int32_t(sp.size() / 3);
        const uint32_t shape = rng() % 8;
        // Share the previous row's spans, only within the sequence: another sequence's packed keys
        // may lie past this one's keys, which every kernel refuses (the CUDA check caught it).
        if (shape == 0 && r > c_b[size_t(b)] * H) {
          rs.push_back(rs[rs.size() - 2]);
          rs.push_back(rs[rs.size() - 2]);
          continue;
        }
        if (shape != 1) {  // shape 1: an empty row
          const int32_t l0 = list0[size_t(b) * hkv + kvh], l1 = list0[size_t(b) * hkv + kvh + 1];
          const int32_t lo = l0 + int32_t(rng() % uint32_t(l1 - l0 + 1));
          const int32_t hi = lo + int32_t(rng() % uint32_t(l1 - lo + 1));
          sp.insert(sp.end(), {SIEVE_SPAN_PACKED, lo, hi});
          const int32_t k0 = int32_t(rng() % uint32_t(len + 1));
          const int32_t k1 = k0 + int32_t(rng() % uint32_t(len + 8));  // may pass the causal limit and len
          sp.insert(sp.end(), {SIEVE_SPAN_KEYS, k0, k1});
          if (shape == 2) sp.insert(sp.end(), {SIEVE_SPAN_PACKED, l0, l1});  // the whole list, unordered w.r.t. the rest
        }
        rs.push_back(first);
        rs.push_back(int32_t(sp.size() / 3));
      }
    }
    auto i32 = [](const std::vector<int32_t>& x, std::vector<int64_t> shape) {
      HostTensor t(shape, kI32);
      std::copy(x.begin(), x.end(), t.data<int32_t>());
      return t;
    };
    row_spans = i32(rs, {int64_t(rs.size() / 2), 2});
    spans = i32(sp, {int64_t(sp.size() / 3), 3});
    packed_pos = i32(pos, {int64_t(pos.size())});
    packed_count = i32(cnt, {int64_t(cnt.size())});
    packed_bias = HostTensor({int64_t(bias.size())}, kF32);
    std::copy(bias.begin(), bias.end(), packed_bias.data<float>());
    for (int32_t c : cnt) max_count = std::max(max_count, c);
    for (float x : bias) max_bias = std::max(max_bias, double(std::abs(x)));
    v.hdr = SIEVE_HEADER_INIT(sieve_attention_variant);
    v.heads = heads;
    v.q_block = q_block;
    v.n_rows = int32_t(rs.size() / 2);
    v.row_spans = row_spans.dl();
    v.spans = spans.dl();
    v.packed_pos = packed_pos.dl();
    if (counts) v.packed_count = packed_count.dl();
    else max_count = 1;
    if (biases) v.packed_bias = packed_bias.dl();
    else max_bias = 0;
    for (int64_t r = 0; r < v.n_rows; ++r) {
      int64_t keys = 0;
      for (int32_t i = rs[size_t(2 * r)]; i < rs[size_t(2 * r + 1)]; ++i) keys += sp[size_t(3 * i + 2)] - sp[size_t(3 * i + 1)];
      max_keys = std::max(max_keys, keys);
    }
    w.args.variant = &v;
  }
};

// The f64 reference of every (token, head) row of w's call with its variant: out [n_q_tokens *
// n_q_heads * head_dim] and lse [n_q_tokens * n_q_heads].
struct VariantReference {
  std::vector<double> out, lse;
};
inline VariantReference variant_reference(const reference::Workload& w) {
  const sieve_attention_args& a = w.args;
  const sieve_attention_variant& v = *a.variant;
  const int32_t d = a.head_dim, hq = a.n_q_heads, hkv = a.n_kv_heads, group = hq / hkv, P = a.kv->page_size;
  const int32_t H = kernels::selection_head_count(v.heads, hq, hkv);
  const double scale = a.scale != 0.f ? a.scale : 1.0 / std::sqrt(double(d));
  const int32_t* rs = static_cast<const int32_t*>(v.row_spans.data);
  const int32_t* sp = static_cast<const int32_t*>(v.spans.data);
  const int32_t* pos = static_cast<const int32_t*>(v.packed_pos.data);
  const int32_t* cnt = static_cast<const int32_t*>(v.packed_count.data);
  const float* bias = static_cast<const float*>(v.packed_bias.data);
  const int32_t* ids = static_cast<const int32_t*>(a.kv->indices.data);
  const std::vector<int64_t> c_b = kernels::query_block_offsets(a.qo_indptr_host, w.batch, v.q_block);
  VariantReference ref;
  ref.out.assign(size_t(w.n_q_tokens) * hq * d, 0.0);
  ref.lse.assign(size_t(w.n_q_tokens) * hq, -std::numeric_limits<double>::infinity());
  for (int32_t b = 0; b < w.batch; ++b) {
    const int32_t q0 = a.qo_indptr_host[b], n_q = a.qo_indptr_host[b + 1] - q0, len = w.kv_len[size_t(b)];
    for (int32_t i = 0; i < n_q; ++i)
      for (int32_t h = 0; h < hq; ++h) {
        const int32_t p = len - n_q + i, g = h / group;
        const int64_t r = (c_b[size_t(b)] + i / v.q_block) * H + kernels::selection_head(v.heads, h, group);
        std::vector<std::pair<int32_t, double>> keys;  // position, log bias
        for (int32_t s = rs[2 * r]; s < rs[2 * r + 1]; ++s) {
          if (sp[3 * s] == SIEVE_SPAN_KEYS) {
            for (int32_t k = sp[3 * s + 1]; k < std::min(sp[3 * s + 2], p + 1); ++k) keys.push_back({k, 0.0});
          } else {
            for (int32_t e = sp[3 * s + 1]; e < sp[3 * s + 2]; ++e) {
              if (pos[e] > p) continue;
              double lb = bias ? double(bias[e]) : 0.0;
              if (cnt) lb += std::log(double(std::min(cnt[e], p - pos[e] + 1)));
              keys.push_back({pos[e], lb});
            }
          }
        }
        if (keys.empty()) continue;
        auto row = [&](int32_t k) {
          const int64_t page = ids[a.kv->indptr_host[b] + k / P];
          return ((page * hkv + g) * P + k % P) * d;
        };
        const int64_t qrow = (int64_t(q0 + i) * hq + h) * d;
        std::vector<double> z(keys.size());
        double mx = -std::numeric_limits<double>::infinity();
        for (size_t j = 0; j < keys.size(); ++j) {
          double dot = 0;
          for (int32_t x = 0; x < d; ++x)
            dot += double(load_float(a.q->data, a.q->dtype, qrow + x)) *
                   double(load_float(a.kv->k_pages.data, a.kv->k_pages.dtype, row(keys[j].first) + x));
          z[j] = dot * scale + keys[j].second;
          mx = std::max(mx, z[j]);
        }
        double sum = 0;
        for (size_t j = 0; j < keys.size(); ++j) {
          const double e = std::exp(z[j] - mx);
          sum += e;
          for (int32_t x = 0; x < d; ++x)
            ref.out[size_t(qrow + x)] += e * double(load_float(a.kv->v_pages.data, a.kv->v_pages.dtype, row(keys[j].first) + x));
        }
        for (int32_t x = 0; x < d; ++x) ref.out[size_t(qrow + x)] /= sum;
        ref.lse[size_t(int64_t(q0 + i) * hq + h)] = mx + std::log(sum);
      }
  }
  return ref;
}

// The bound of attention_tolerance.hpp with the variant's logits: each carries up to
// ln(max count) + max |bias| more than scale·q·k (rounded with it), over the longest row's keys.
inline tolerance::AttentionBound variant_bound(const reference::Workload& w, const VariantCase& c,
                                               double u = tolerance::kF32, double u_weights = 0) {
  const tolerance::Magnitudes m = tolerance::magnitudes(w.args);
  const double logit = m.logit + std::log(double(c.max_count)) + c.max_bias;
  const int64_t keys = std::max<int64_t>(c.max_keys, 1);
  const double u_out = tolerance::unit_roundoff(w.args.out->dtype) > u ? tolerance::unit_roundoff(w.args.out->dtype) : 0;
  const double e = tolerance::softmax_sum(keys, m.head_dim, logit, u, u_weights, u_out);
  return {e, e * m.value, e * m.value_row, tolerance::log_sum_exp(keys, m.head_dim, logit, u)};
}

// GQA prefill over ragged sequences: a whole prefill, one token, a chunk, a sequence without queries.
inline reference::WorkloadSpec ragged_prefill(DLDataType kv, int32_t d) {
  reference::WorkloadSpec s;
  s.phase = SIEVE_PHASE_PREFILL;
  s.n_q_heads = 8;
  s.n_kv_heads = 2;
  s.head_dim = d;
  s.page_size = 16;
  s.kv_dtype = s.q_dtype = s.out_dtype = kv;
  s.kv_lens = {75, 1, 130, 33};
  s.n_new = {75, 1, 40, 0};  // a whole prefill, one token, a chunk, a sequence without queries
  return s;
}

// Compares every element of w.out and w.lse (written over NaN-poisoned outputs) with the
// reference, within the variant's bound; `u_weights`: the softmax weights' rounding before P.V.
inline void expect_matches_reference(reference::Workload& w, const VariantCase& c, double u_weights = 0) {
  const variant_test::VariantReference ref = variant_test::variant_reference(w);
  const tolerance::AttentionBound bound = variant_test::variant_bound(w, c, tolerance::kF32, u_weights);
  for (size_t i = 0; i < ref.out.size(); ++i) {
    const double got = w.out.get(int64_t(i));
    ASSERT_FALSE(std::isnan(got)) << "out[" << i << "] was not written";
    ASSERT_NEAR(got, ref.out[i], bound.element) << "out[" << i << "]";
  }
  for (size_t i = 0; i < ref.lse.size(); ++i) {
    const double got = w.lse.get(int64_t(i));
    if (std::isinf(ref.lse[i])) {
      EXPECT_TRUE(std::isinf(got) && got < 0) << "lse[" << i << "] of an empty row: " << got;
    } else {
      ASSERT_NEAR(got, ref.lse[i], bound.lse) << "lse[" << i << "]";
    }
  }
}

}  // namespace sieve::variant_test
