// A DPXA test scenario: a prefill layer call over a reference::Workload whose K/V and queries come
// from the long-context generator (realistic adjacent similarity), plus the plugin's parameter
// values and a plain f64 recomputation of the anchors and tile shares to check selections with.
#pragma once
#include <gtest/gtest.h>
#include <sieve/sieve.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/attention_tolerance.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/reference/long_context.hpp"
#include "sieve/reference/workload.hpp"
#include "support/layer_call.hpp"
#include "support/plugin_library.hpp"
#include "support/workload_call.hpp"

namespace sieve::testing {

struct DpxaArgs {
  std::string estimator = "dpxa";
  int64_t block = 32;
  double threshold = 0.75;
  int64_t stride = 0;
  double tau = 0.9;
  std::string thresholds;
  std::string rows = "q_head";
  std::string mode = "select";
  double exact_top = 0.1;
  double pack_threshold = 0.83;
};

// Schema order: estimator, block, threshold, stride, tau, thresholds, rows, mode, exact_top,
// pack_threshold.
struct DpxaValues {
  explicit DpxaValues(const DpxaArgs& a) : args(a) {
    const int64_t est = a.estimator == "dpxa" ? 0 : a.estimator == "xattn" ? 1 : 2;
    v[0] = {SIEVE_PARAM_ENUM, est, 0, args.estimator.c_str(), nullptr, 0};
    v[1] = {SIEVE_PARAM_INT, a.block, 0, nullptr, nullptr, 0};
    v[2] = {SIEVE_PARAM_FLOAT, 0, a.threshold, nullptr, nullptr, 0};
    v[3] = {SIEVE_PARAM_INT, a.stride, 0, nullptr, nullptr, 0};
    v[4] = {SIEVE_PARAM_FLOAT, 0, a.tau, nullptr, nullptr, 0};
    v[5] = {SIEVE_PARAM_STRING, 0, 0, args.thresholds.c_str(), nullptr, 0};
    v[6] = {SIEVE_PARAM_ENUM, a.rows == "kv_head" ? 1 : 0, 0, args.rows.c_str(), nullptr, 0};
    v[7] = {SIEVE_PARAM_ENUM, a.mode == "deltax" ? 1 : 0, 0, args.mode.c_str(), nullptr, 0};
    v[8] = {SIEVE_PARAM_FLOAT, 0, a.exact_top, nullptr, nullptr, 0};
    v[9] = {SIEVE_PARAM_FLOAT, 0, a.pack_threshold, nullptr, nullptr, 0};
  }
  static constexpr uint32_t kCount = 10;
  DpxaArgs args;
  sieve_param_value v[kCount];
};

struct DpxaScenario {
  DpxaScenario(std::vector<int32_t> kv_lens, std::vector<int32_t> n_new, int32_t page_size,
               int32_t hq = 4, int32_t hkv = 2, int32_t d = 32, uint64_t seed = 7,
               DLDataType dtype = kF32, DLDataType out_dtype = kF32)
      : w(spec(kv_lens, n_new, page_size, hq, hkv, d, seed, dtype, out_dtype)) {
    reference::LongContextSpec lc;
    lc.seed = seed;
    reference::fill_workload(w, lc);
    g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
    g.n_layers = 3;
    g.n_q_heads = hq;
    g.n_kv_heads = hkv;
    g.head_dim = d;
    g.page_size = page_size;
    g.max_batch = 8;
    g.max_seq_len = 4096;
    g.kv_dtype = dtype;
    g.device = kCpu;
    g.rope_theta = 10000.f;
    g.rope_dim = d;
    call = workload_call(w, g, SIEVE_PHASE_PREFILL, 1, &seq_ids);
  }
  static reference::WorkloadSpec spec(std::vector<int32_t> kv_lens, std::vector<int32_t> n_new,
                                      int32_t ps, int32_t hq, int32_t hkv, int32_t d,
                                      uint64_t seed, DLDataType dtype, DLDataType out_dtype = kF32) {
    reference::WorkloadSpec s;
    s.n_q_heads = hq;
    s.n_kv_heads = hkv;
    s.head_dim = d;
    s.page_size = ps;
    s.phase = SIEVE_PHASE_PREFILL;
    s.kv_lens = std::move(kv_lens);
    s.n_new = std::move(n_new);
    s.seed = seed;
    s.kv_dtype = dtype;
    s.q_dtype = dtype;
    s.out_dtype = out_dtype;
    return s;
  }

  // Head h's queries of sequence b / KV head g's keys, as f64 rows.
  std::vector<std::vector<double>> queries(int32_t b, int32_t h) const {
    const int32_t q0 = w.qo_indptr.data<int32_t>()[b], n = w.n_new[size_t(b)];
    std::vector<std::vector<double>> out(size_t(n), std::vector<double>(size_t(g.head_dim)));
    for (int32_t i = 0; i < n; ++i)
      for (int32_t x = 0; x < g.head_dim; ++x)
        out[size_t(i)][size_t(x)] = w.q.get((int64_t(q0 + i) * g.n_q_heads + h) * g.head_dim + x);
    return out;
  }
  std::vector<std::vector<double>> keys(int32_t b, int32_t kvh) const {
    const int32_t n = w.kv_len[size_t(b)], ps = g.page_size;
    const int32_t* pages = w.kv_indices.data<int32_t>() + w.kv_indptr.data<int32_t>()[b];
    std::vector<std::vector<double>> out(size_t(n), std::vector<double>(size_t(g.head_dim)));
    for (int32_t p = 0; p < n; ++p)
      for (int32_t x = 0; x < g.head_dim; ++x)
        out[size_t(p)][size_t(x)] = w.k_pages.get(
            ((int64_t(pages[p / ps]) * g.n_kv_heads + kvh) * ps + p % ps) * g.head_dim + x);
    return out;
  }
  int32_t query_blocks(int32_t b, int32_t B) const { return (w.n_new[size_t(b)] + B - 1) / B; }
  int32_t rows(int32_t B, int32_t H) const {
    int32_t r = 0;
    for (int32_t b = 0; b < w.batch; ++b) r += query_blocks(b, B) * H;
    return r;
  }

  reference::Workload w;
  sieve_geometry g{};
  std::vector<int32_t> seq_ids;
  sieve_layer_call call{};
};

// ---- Plain f64 recomputation ------------------------------------------------------------------
inline double dot64(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Anchor offsets of the block [from, from + n) of x.
inline std::vector<int32_t> plain_anchors(const std::vector<std::vector<double>>& x, int64_t from,
                                          int32_t n, double threshold) {
  std::vector<int32_t> out;
  int64_t anchor = from;
  for (int32_t i = 0; i < n; ++i) {
    const auto& v = x[size_t(from + i)];
    const auto& a = x[size_t(anchor)];
    const double c = dot64(v, a) / std::sqrt(dot64(v, v) * dot64(a, a));
    if (i == 0 || c < threshold) {
      out.push_back(i);
      anchor = from + i;
    }
  }
  return out;
}

// The estimator's normalised share of every candidate key block of query block t (f64).
inline std::vector<double> plain_shares(const std::string& est, const std::vector<std::vector<double>>& q,
                                        const std::vector<std::vector<double>>& k, int32_t B,
                                        int32_t t, int32_t S, double threshold) {
  const int64_t n_new = int64_t(q.size()), kv_len = int64_t(k.size()), base = kv_len - n_new;
  const int64_t q0 = int64_t(t) * B, nq = std::min<int64_t>(B, n_new - q0);
  const int64_t last = base + q0 + nq - 1;
  const int32_t nc = int32_t(last / B) + 1;
  const double scale = 1.0 / std::sqrt(double(q[0].size()));
  std::vector<std::vector<double>> logits(static_cast<size_t>(nc));
  std::vector<int32_t> qa;
  if (est == "dpxa") {
    std::vector<std::vector<double>> qb(q.begin() + q0, q.begin() + q0 + nq);
    qa = plain_anchors(qb, 0, int32_t(nq), threshold);
  }
  for (int32_t j = 0; j < nc; ++j) {
    const int64_t k0 = int64_t(j) * B, nk = std::min<int64_t>(B, kv_len - k0);
    if (est == "dpxa") {
      for (int32_t b : plain_anchors(k, k0, int32_t(nk), threshold))
        for (int32_t a : qa)
          if (k0 + b <= base + q0 + a) logits[j].push_back(dot64(q[q0 + a], k[k0 + b]) * scale);
    } else if (est == "xattn") {
      for (int64_t gk = 0; gk * S < nk; ++gk)
        for (int64_t gq = 0; gq * S < nq; ++gq) {
          if (k0 + gk * S > base + q0 + std::min<int64_t>(gq * S + S - 1, nq - 1)) continue;
          double s = 0;
          for (int32_t x = 0; x < S; ++x) {
            const int64_t qi = gq * S + x, ki = gk * S + S - 1 - x;
            if (qi < nq && ki < nk) s += dot64(q[q0 + qi], k[k0 + ki]);
          }
          logits[j].push_back(s * scale / S);
        }
    } else {
      for (int64_t kb = 0; kb < nk; kb += S)
        for (int64_t qa2 = 0; qa2 < nq; qa2 += S)
          if (k0 + kb <= base + q0 + qa2) logits[j].push_back(dot64(q[q0 + qa2], k[k0 + kb]) * scale);
    }
  }
  double mx = -INFINITY;
  for (const auto& l : logits)
    for (double x : l) mx = std::max(mx, x);
  std::vector<double> w(size_t(nc), 0.0);
  double z = 0;
  for (int32_t j = 0; j < nc; ++j) {
    for (double x : logits[j]) w[j] += std::exp(x - mx);
    z += w[j];
  }
  for (double& x : w) x /= z;
  return w;
}

// The relative error bound of the plugin's f32 share of a tile (CPU or CUDA, any order): the
// estimator's logits are head_dim-term dot products (xattn: S of them summed), pushed into the
// tile's log-sum-exp (at most block x block of them), then summed over the row's candidates (at
// most kv_len): tolerance::softmax_sum with those lengths, logits bounded by the workload's norms.
inline double share_error(const DpxaScenario& sc, const DpxaArgs& a) {
  const auto m = tolerance::magnitudes(sc.w);
  const int64_t S = a.stride ? a.stride : a.estimator == "xattn" ? 8 : 4;
  const int64_t dot = a.estimator == "xattn" ? S * m.head_dim : m.head_dim;
  return tolerance::softmax_sum(a.block * a.block + m.keys, dot, m.logit, tolerance::kF32);
}

// A selection row against the f64 shares w: every forced block kept, and, to the plugin's
// rounding of the shares (share_error; twice: the shares, and its f32 running sum of them), the
// kept mass covers tau, the set is minimal and a top set (no dropped block outweighs a kept one).
// Returns whether the row dropped a block.
inline bool expect_greedy_cover(const std::vector<double>& w, const std::set<int32_t>& kept,
                                const std::function<bool(int32_t)>& forced, double tau,
                                double share_error, int32_t row) {
  const double margin = 2 * share_error;
  double mass = 0, min_kept = 2, max_dropped = -1;
  for (int32_t j = 0; j < int32_t(w.size()); ++j) {
    if (kept.count(j)) mass += w[size_t(j)];
    if (forced(j)) {
      EXPECT_TRUE(kept.count(j)) << "forced block " << j << " row " << row;
      continue;
    }
    if (kept.count(j)) min_kept = std::min(min_kept, w[size_t(j)]);
    else max_dropped = std::max(max_dropped, w[size_t(j)]);
  }
  EXPECT_GE(mass, std::min(tau, 1.0) - margin) << "row " << row;
  if (min_kept <= 1) {
    EXPECT_LT(mass - min_kept, tau + margin) << "not minimal, row " << row;
    EXPECT_LE(max_dropped, min_kept + margin) << "not a top set, row " << row;
  }
  return max_dropped >= 0;
}

// The worst |got - want| / (1 + |want|) over two outputs (a non-finite value counts as infinite).
inline double worst_rel(const std::vector<double>& got, const std::vector<double>& want) {
  double e = 0;
  EXPECT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size() && i < got.size(); ++i)
    e = std::max(e, std::isfinite(got[i]) ? std::abs(got[i] - want[i]) / (1 + std::abs(want[i]))
                                          : INFINITY);
  return e;
}

// What a host does with one instance after its select (ABI 1.1): the instance's attend when its
// hooks name it (mode=deltax), else the core kernel of `services` on its selection (mode=select).
inline sieve_status attend_as_host(const sieve_policy_api* api, sieve_policy* p, const sieve_layer_call& call,
                                   const sieve_selection* sel, DLTensor* out, const sieve_host_services* services) {
  if (api->instance_hooks(p) & SIEVE_HOOK_ATTEND) return api->attend(p, &call, sel, out);
  const sieve_geometry& g = *call.geometry;
  sieve_attention_args a = kernels::make_attention_args(call.phase, g.n_q_heads, g.n_kv_heads, g.head_dim, call.q,
                                                        out, call.qo_indptr, call.qo_indptr_host, call.kv_view);
  a.selection = sel;
  return services->kernels->attend(services->host_ctx, &a);
}

// The dpxa CPU tests' fixture: the plugin, a host (Host: the mock services, or the runtime's real
// ones where the core kernel or metrics are needed) and create(), whose policies TearDown destroys.
template <class Host>
class DpxaTest : public ::testing::Test {
 protected:
  template <class... HostArgs>
  explicit DpxaTest(HostArgs&&... host_args) : host_(std::forward<HostArgs>(host_args)...) {}
  void SetUp() override {
    api_ = lib_.policy();
    ASSERT_NE(api_, nullptr);
  }
  void TearDown() override {
    for (sieve_policy* p : policies_) api_->destroy(p);
    policies_.clear();
  }
  // Without `error` a refusal is a test failure; with it, a refusal's reason goes to *error.
  sieve_policy* create(const sieve_geometry& g, const DpxaArgs& a, std::string* error = nullptr) {
    DpxaValues v(a);
    sieve_policy* p = nullptr;
    if (!error) {
      p = create_or_fail(api_, host_.table(), g, v.v, DpxaValues::kCount);
    } else {
      ReasonLog err;
      if (api_->create(host_.table(), &g, v.v, DpxaValues::kCount, nullptr, nullptr, &p, err.sink()) != SIEVE_OK)
        p = nullptr;
      *error = err.all();
    }
    if (p) policies_.push_back(p);
    return p;
  }

  Host host_;
  PluginLibrary lib_{"dpxa"};
  const sieve_policy_api* api_ = nullptr;
  std::vector<sieve_policy*> policies_;
};

}  // namespace sieve::testing
