// A prefill scenario for the delta_correction tests (CPU and CUDA): a ragged random paged
// workload (whole prompts, a chunked prefill whose queries start mid-sequence, a sequence with no
// queries), its f64 dense attention, a sparse first-stage output O* (the core kernel on a random
// block selection, as a sparse prefill would leave it) and the correction rule written out
// plainly, row by row, in f64 — the oracle the plugin's output is compared with.
#pragma once
#include <gtest/gtest.h>
#include <sieve/sieve.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/attention_tolerance.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/long_context.hpp"
#include "sieve/reference/workload.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/util/tensor.hpp"
#include "support/workload_call.hpp"

namespace sieve::testing {

struct DeltaRule {
  int64_t gamma = 8, tail = 16;
  bool recompute = false, interpolate = false;
  bool row_kernel = false;  // anchor_kernel=rows (CUDA only; the CPU always computes rows)
};

struct DeltaScenario {
  explicit DeltaScenario(DLDataType dtype = kF32, std::vector<int32_t> kv_lens = {300, 77, 200, 9, 131},
                         std::vector<int32_t> n_new = {300, 77, 150, 0, 131}, uint64_t seed = 7,
                         int32_t head_dim = 16, int32_t n_q_heads = 4, int32_t n_kv_heads = 2,
                         bool long_context = false)
      : w(prefill_spec(dtype, n_q_heads, n_kv_heads, head_dim, 8, kv_lens, n_new, seed)) {
    geometry = workload_geometry(w);
    if (long_context) {  // realistic adjacent-token similarity (reference/long_context.hpp)
      reference::LongContextSpec ls;
      ls.seed = seed;
      reference::fill_workload(w, ls);
    }
    dense = reference::attend_reference(w.args).out;
  }

  // O*: the core kernel over a random block selection (rows may be empty: output 0).
  void sparse_first_stage(runtime::HostServices& host, double keep = 0.4) {
    w.set_selection(SIEVE_SEL_PER_KV_HEAD, 4, 1,
                    w.random_selection_rows(SIEVE_SEL_PER_KV_HEAD, 4, 1, keep, 99));
    const sieve_host_services* s = host.table();
    ASSERT_EQ(s->kernels->attend(s->host_ctx, &w.args), SIEVE_OK) << s->kernels->last_error(s->host_ctx);
    w.clear_selection();
    o_star.assign(size_t(w.out.numel()), 0.0);
    for (int64_t i = 0; i < w.out.numel(); ++i) o_star[size_t(i)] = w.out.get(i);
  }
  // O*: a StreamingLLM-like sparse prefill (page 0 and the pages of the `window` tokens before
  // each block of 4 queries), the first stage of the paper's main setting.
  void window_first_stage(runtime::HostServices& host, int32_t window) {
    const int32_t P = w.spec.page_size, q_block = 4;
    reference::SelectionRows rows;
    const int32_t* qo = w.qo_indptr.data<int32_t>();
    for (int32_t b = 0; b < w.batch; ++b) {
      const int32_t n = qo[b + 1] - qo[b], base = w.kv_len[size_t(b)] - n;
      for (int32_t t = 0; t * q_block < n; ++t) {
        const int32_t first = base + t * q_block, last = base + std::min(n, (t + 1) * q_block) - 1;
        std::vector<int32_t> pages = {0};
        for (int32_t pg = std::max(1, std::max(0, first - window + 1) / P); pg <= last / P; ++pg) pages.push_back(pg);
        rows.push_back(pages);
      }
    }
    w.set_selection(SIEVE_SEL_PER_SEQUENCE, q_block, 1, rows);
    const sieve_host_services* s = host.table();
    ASSERT_EQ(s->kernels->attend(s->host_ctx, &w.args), SIEVE_OK) << s->kernels->last_error(s->host_ctx);
    w.clear_selection();
    o_star.assign(size_t(w.out.numel()), 0.0);
    for (int64_t i = 0; i < w.out.numel(); ++i) o_star[size_t(i)] = w.out.get(i);
  }
  // ‖o − dense‖ / ‖dense‖ over the rows [from, to) of every sequence's local query index
  // (to < 0: to the end), the error measure of `sieve attn`.
  double rel_err(const std::vector<double>& o, int64_t from = 0, int64_t to = -1) const {
    const int64_t E = int64_t(w.spec.n_q_heads) * w.spec.head_dim;
    const int32_t* qo = w.qo_indptr.data<int32_t>();
    double num = 0, den = 0;
    for (int32_t b = 0; b < w.batch; ++b)
      for (int64_t l = from; l < (to < 0 ? qo[b + 1] - qo[b] : std::min<int64_t>(to, qo[b + 1] - qo[b])); ++l)
        for (int64_t x = 0; x < E; ++x) {
          const size_t i = size_t((qo[b] + l) * E + x);
          num += (o[i] - dense[i]) * (o[i] - dense[i]);
          den += dense[i] * dense[i];
        }
    return std::sqrt(num / den);
  }
  // O* = the core's dense output (delta_correction after `dense`).
  void dense_first_stage(runtime::HostServices& host) {
    w.clear_selection();
    const sieve_host_services* s = host.table();
    ASSERT_EQ(s->kernels->attend(s->host_ctx, &w.args), SIEVE_OK) << s->kernels->last_error(s->host_ctx);
    o_star.assign(size_t(w.out.numel()), 0.0);
    for (int64_t i = 0; i < w.out.numel(); ++i) o_star[size_t(i)] = w.out.get(i);
  }

  // The layer call the correct hook gets (host tensors).
  sieve_layer_call call(uint32_t phase = SIEVE_PHASE_PREFILL) {
    return workload_call(w, geometry, phase, 0, &seq_ids);
  }

  // The rule, row by row, in f64 from O* and the dense reference (independent of correction_rows.hpp).
  std::vector<double> expected(const DeltaRule& r) const {
    const int64_t E = int64_t(w.spec.n_q_heads) * w.spec.head_dim;
    std::vector<double> e = o_star;
    const int32_t* qo = w.qo_indptr.data<int32_t>();
    for (int32_t b = 0; b < w.batch; ++b) {
      const int64_t s = qo[b + 1] - qo[b];
      const int64_t s_p = std::max<int64_t>(0, s - (s % r.gamma + std::max(r.tail, r.gamma)));
      for (int64_t l = 0; l < s; ++l) {
        const int64_t tok = qo[b] + l, a = l - l % r.gamma;
        for (int64_t x = 0; x < E; ++x) {
          const size_t i = size_t(tok * E + x);
          if (l >= s_p || l == a) { e[i] = dense[i]; continue; }
          if (r.recompute) continue;
          auto delta = [&](int64_t anchor) {
            const size_t j = size_t((qo[b] + anchor) * E + x);
            return dense[j] - o_star[j];
          };
          double d = delta(a);
          if (r.interpolate && a + r.gamma < s_p) {
            const double wgt = double(l - a) / double(r.gamma);
            d = (1 - wgt) * d + wgt * delta(a + r.gamma);
          }
          e[i] = o_star[i] + d;
        }
      }
    }
    return e;
  }

  static std::string worst(const std::vector<double>& got, const std::vector<double>& want, double* err) {
    return worst_element(got, want, err);
  }
  std::vector<double> output() const { return workload_output(w); }

  // The error bound of a corrected element against `expected`: the anchor rows' dense attention
  // is a core-kernel call (attention_bound: f32 sums; with 16-bit q and K/V the CUDA tensor cores
  // round the weights to that dtype, allowed for both backends); the rule then adds and subtracts
  // (interpolation: blends two anchors' deltas) outputs each at most max |v| in f32, at most 8
  // roundings of terms summing to <= 4 max |v|; the result, |o| <= 3 max |v|, is stored in the
  // output dtype.
  double rule_bound() const {
    const DLDataType kv = w.spec.kv_dtype;
    const double u16 = kv.bits == 16 ? tolerance::unit_roundoff(kv) : 0;
    const double v = tolerance::magnitudes(w).value;
    return tolerance::attention_bound(w, tolerance::kF32, u16).element +
           tolerance::gamma(8, tolerance::kF32) * 4 * v + tolerance::unit_roundoff(w.spec.out_dtype) * 3 * v;
  }

  reference::Workload w;
  sieve_geometry geometry{};
  std::vector<double> dense, o_star;
  std::vector<int32_t> seq_ids;
};

// Parameter values in the plugin's schema order: gamma, tail, mode, interpolate, anchor_kernel.
struct DeltaValues {
  explicit DeltaValues(const DeltaRule& r) {
    v[0] = {SIEVE_PARAM_INT, r.gamma, 0, nullptr, nullptr, 0};
    v[1] = {SIEVE_PARAM_INT, r.tail, 0, nullptr, nullptr, 0};
    v[2] = {SIEVE_PARAM_ENUM, r.recompute ? 1 : 0, 0, r.recompute ? "recompute" : "delta", nullptr, 0};
    v[3] = {SIEVE_PARAM_BOOL, r.interpolate ? 1 : 0, 0, nullptr, nullptr, 0};
    v[4] = {SIEVE_PARAM_ENUM, r.row_kernel ? 1 : 0, 0, r.row_kernel ? "rows" : "tiled", nullptr, 0};
  }
  static constexpr uint32_t kCount = 5;
  sieve_param_value v[kCount];
};

}  // namespace sieve::testing
