// A prefill scenario for the deltakv tests (CPU and CUDA): a ragged random paged workload (whole
// prompts, a chunked prefill whose queries start mid-sequence, a sequence with no queries) whose
// keys come in runs of near-copies (cosine ~0.99 to the run's first key, unrelated between runs),
// so the delta rule has something to merge and every decision is far from the threshold; and the
// method written out plainly in f64 — keep walk, anchors/reach, and for each query the dense
// softmax over the *expanded* key list (each safe anchor repeated `count` times, then the exact
// keys) — the oracle the plugin's output is compared with. Also what the CPU and CUDA test
// binaries share: the plugin's single load and the options as the plugin's stage 1-2 rule.
#pragma once
#include <gtest/gtest.h>
#include <sieve/sieve.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "cpu/deltakv_cpu.hpp"
#include "sieve/reference/workload.hpp"
#include "sieve/util/tensor.hpp"
#include "support/plugin_library.hpp"
#include "support/workload_call.hpp"

namespace sieve::testing {

// The plugin's parameters (schema order below).
struct DkvOpts {
  double threshold = 0.83;
  bool l2 = false;
  int64_t chunk = 512, q_block = 64;
  bool count_weighting = true;
  int phase2 = 0;   // on | off | only
  int packing = 0;  // delta | periodic | random
  double reduction = 0.5;
  int64_t seed = 0;
  int report = 0;   // auto | on | off
};

struct DkvValues {
  explicit DkvValues(const DkvOpts& o) {
    static const char* kPhase2[] = {"on", "off", "only"};
    static const char* kPacking[] = {"delta", "periodic", "random"};
    static const char* kReport[] = {"auto", "on", "off"};
    v[0] = {SIEVE_PARAM_FLOAT, 0, o.threshold, nullptr, nullptr, 0};
    v[1] = {SIEVE_PARAM_ENUM, o.l2 ? 1 : 0, 0, o.l2 ? "l2" : "cos", nullptr, 0};
    v[2] = {SIEVE_PARAM_INT, o.chunk, 0, nullptr, nullptr, 0};
    v[3] = {SIEVE_PARAM_INT, o.q_block, 0, nullptr, nullptr, 0};
    v[4] = {SIEVE_PARAM_BOOL, o.count_weighting ? 1 : 0, 0, nullptr, nullptr, 0};
    v[5] = {SIEVE_PARAM_ENUM, o.phase2, 0, kPhase2[o.phase2], nullptr, 0};
    v[6] = {SIEVE_PARAM_ENUM, o.packing, 0, kPacking[o.packing], nullptr, 0};
    v[7] = {SIEVE_PARAM_FLOAT, 0, o.reduction, nullptr, nullptr, 0};
    v[8] = {SIEVE_PARAM_INT, o.seed, 0, nullptr, nullptr, 0};
    v[9] = {SIEVE_PARAM_ENUM, o.report, 0, kReport[o.report], nullptr, 0};
  }
  static constexpr uint32_t kN = 10;
  sieve_param_value v[kN];
};

// Anchors and reach of one (sequence, KV head).
struct PlainPack {
  std::vector<int32_t> anchor, reach;
};

struct DkvScenario {
  explicit DkvScenario(DLDataType dtype = kF32, int32_t head_dim = 16,
                       std::vector<int32_t> kv_lens = {300, 77, 200, 9, 131},
                       std::vector<int32_t> n_new = {300, 77, 150, 0, 131}, uint64_t seed = 7,
                       int32_t page_size = 8, int32_t hq = 4, int32_t hkv = 2)
      : w(prefill_spec(dtype, hq, hkv, head_dim, page_size, kv_lens, n_new, seed)) {
    geometry = workload_geometry(w);
    // Keys in runs: a run's first key is a fresh normal vector, the others add 5% noise to it.
    std::mt19937 rng(unsigned(seed) * 31u + 5u);
    std::normal_distribution<float> normal(0.f, 1.f);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    const int32_t d = head_dim;
    std::vector<float> base(size_t(d), 0.f);
    for (int32_t b = 0; b < w.batch; ++b)
      for (int32_t kvh = 0; kvh < hkv; ++kvh)
        for (int32_t pos = 0; pos < w.kv_len[size_t(b)]; ++pos) {
          const bool fresh = pos == 0 || u(rng) < 0.3f;
          if (fresh)
            for (auto& x : base) x = normal(rng);
          const int64_t off = key_offset(b, kvh, pos);
          for (int32_t i = 0; i < d; ++i)
            w.k_pages.set(off + i, base[size_t(i)] + (fresh ? 0.f : 0.05f * normal(rng)));
        }
  }

  int64_t key_offset(int32_t b, int32_t kvh, int32_t pos) const {
    const int32_t P = w.spec.page_size;
    const int32_t phys = w.kv_indices.data<int32_t>()[w.kv_indptr.data<int32_t>()[b] + pos / P];
    return ((int64_t(phys) * w.spec.n_kv_heads + kvh) * P + pos % P) * w.spec.head_dim;
  }
  std::vector<double> key(int32_t b, int32_t kvh, int32_t pos) const {
    std::vector<double> k(static_cast<size_t>(w.spec.head_dim));
    const int64_t off = key_offset(b, kvh, pos);
    for (int32_t i = 0; i < w.spec.head_dim; ++i) k[size_t(i)] = w.k_pages.get(off + i);
    return k;
  }
  // The keys of (b, kvh) as f32 [n][d], as the plugin reads them.
  std::vector<float> keys_f32(int32_t b, int32_t kvh) const {
    std::vector<float> k;
    for (int32_t pos = 0; pos < w.kv_len[size_t(b)]; ++pos)
      for (double x : key(b, kvh, pos)) k.push_back(float(x));
    return k;
  }
  std::vector<double> value(int32_t b, int32_t kvh, int32_t pos) const {
    std::vector<double> v(static_cast<size_t>(w.spec.head_dim));
    const int64_t off = key_offset(b, kvh, pos);
    for (int32_t i = 0; i < w.spec.head_dim; ++i) v[size_t(i)] = w.v_pages.get(off + i);
    return v;
  }

  // Stages 1-2 spelled out in f64: walk each chunk, compare with the anchor, start a run or join.
  PlainPack plain_pack(const DkvOpts& o, int32_t b, int32_t kvh) const {
    const int32_t n = w.kv_len[size_t(b)];
    std::vector<uint8_t> keep(size_t(n), 0);
    for (int32_t c0 = 0; c0 < n; c0 += int32_t(o.chunk)) {
      keep[size_t(c0)] = 1;
      std::vector<double> anchor = key(b, kvh, c0);
      for (int32_t i = c0 + 1; i < std::min<int64_t>(n, c0 + o.chunk); ++i) {
        bool kept;
        if (o.packing == 1) {  // periodic: one key in 1/keep (tests use keep = 1/2, 1/4)
          const int64_t period = std::llround(1.0 / (1.0 - o.reduction));
          kept = (i - c0) % period == 0;
        } else {
          const std::vector<double> k = key(b, kvh, i);
          double dot = 0, aa = 0, bb = 0, df = 0;
          for (size_t j = 0; j < k.size(); ++j) {
            dot += k[j] * anchor[j];
            aa += k[j] * k[j];
            bb += anchor[j] * anchor[j];
            df += (k[j] - anchor[j]) * (k[j] - anchor[j]);
          }
          kept = o.l2 ? std::sqrt(df) > o.threshold : dot / std::sqrt(aa * bb) < o.threshold;
          if (kept) anchor = k;
        }
        keep[size_t(i)] = kept;
      }
    }
    PlainPack p;
    for (int32_t i = 0; i < n; ++i)
      if (keep[size_t(i)]) p.anchor.push_back(i);
    for (size_t j = 0; j < p.anchor.size(); ++j)
      p.reach.push_back(j + 1 < p.anchor.size() ? p.anchor[j + 1] - 1 : n - 1);
    return p;
  }

  // The output the method defines, from given packs ([b][kvh]), as dense f64 attention over the
  // expanded key list of every query row.
  std::vector<double> expected(const DkvOpts& o, const std::vector<std::vector<PlainPack>>& packs) const {
    const int32_t hq = w.spec.n_q_heads, d = w.spec.head_dim, group = hq / w.spec.n_kv_heads;
    const double scale = 1.0 / std::sqrt(double(d));
    std::vector<double> out(size_t(w.out.numel()), 0.0);
    const int32_t* qo = w.qo_indptr.data<int32_t>();
    for (int32_t b = 0; b < w.batch; ++b) {
      const int32_t n = w.kv_len[size_t(b)], n_new = qo[b + 1] - qo[b];
      for (int32_t h = 0; h < hq; ++h) {
        const int32_t kvh = h / group;
        const PlainPack& p = packs[size_t(b)][size_t(kvh)];
        for (int32_t t = 0; t < n_new; ++t) {
          const int32_t pos = n - n_new + t, qs = pos - pos % int32_t(o.q_block);
          std::vector<int32_t> keys;  // the expanded list: positions whose K/V enter the softmax
          auto add_anchor = [&](size_t j, int32_t count) {
            for (int32_t c = 0; c < (o.count_weighting ? count : 1); ++c) keys.push_back(p.anchor[j]);
          };
          int32_t exact_begin = pos + 1;
          if (o.phase2 == 1) {
            for (size_t j = 0; j < p.anchor.size() && p.anchor[j] <= pos; ++j)
              add_anchor(j, std::min(p.reach[j], pos) - p.anchor[j] + 1);
          } else {
            size_t safe = 0;
            while (safe < p.anchor.size() && p.reach[safe] < qs) ++safe;
            exact_begin = safe > 0 ? p.reach[safe - 1] + 1 : 0;
            if (o.phase2 == 0)
              for (size_t j = 0; j < safe; ++j) add_anchor(j, p.reach[j] - p.anchor[j] + 1);
          }
          for (int32_t i = exact_begin; i <= pos; ++i) keys.push_back(i);
          const int32_t tok = qo[b] + t;
          std::vector<double> q(static_cast<size_t>(d));
          for (int32_t i = 0; i < d; ++i) q[size_t(i)] = w.q.get((int64_t(tok) * hq + h) * d + i);
          std::vector<double> z;
          double mx = -INFINITY;
          for (int32_t k : keys) {
            const std::vector<double> kv = key(b, kvh, k);
            double s = 0;
            for (int32_t i = 0; i < d; ++i) s += q[size_t(i)] * kv[size_t(i)];
            z.push_back(s * scale);
            mx = std::max(mx, z.back());
          }
          double sum = 0;
          std::vector<double> acc(static_cast<size_t>(d), 0.0);
          for (size_t e = 0; e < keys.size(); ++e) {
            const double wgt = std::exp(z[e] - mx);
            sum += wgt;
            const std::vector<double> v = value(b, kvh, keys[e]);
            for (int32_t i = 0; i < d; ++i) acc[size_t(i)] += wgt * v[size_t(i)];
          }
          for (int32_t i = 0; i < d; ++i)
            out[size_t((int64_t(tok) * hq + h) * d + i)] = sum > 0 ? acc[size_t(i)] / sum : 0.0;
        }
      }
    }
    return out;
  }
  std::vector<std::vector<PlainPack>> plain_packs(const DkvOpts& o) const {
    std::vector<std::vector<PlainPack>> packs(size_t(w.batch));
    for (int32_t b = 0; b < w.batch; ++b)
      for (int32_t kvh = 0; kvh < w.spec.n_kv_heads; ++kvh) packs[size_t(b)].push_back(plain_pack(o, b, kvh));
    return packs;
  }

  // The layer call the attend hook gets (host tensors).
  sieve_layer_call call(uint32_t phase = SIEVE_PHASE_PREFILL) {
    return workload_call(w, geometry, phase, 0, &seq_ids);
  }

  std::vector<double> output() const { return workload_output(w); }
  static std::string worst(const std::vector<double>& got, const std::vector<double>& want, double* err) {
    return worst_element(got, want, err);
  }

  reference::Workload w;
  sieve_geometry geometry{};
  std::vector<int32_t> seq_ids;
};

// The plugin, loaded once for the whole test binary: dlclose/dlopen cycles of a plugin with CUDA
// kernels left the CUDA runtime with a stale module on the GPU machine (a later launch failed with
// "named symbol not found" / "device kernel image is invalid"), so the library stays loaded until
// exit.
inline PluginLibrary& deltakv_library() {
  static PluginLibrary lib("deltakv");
  return lib;
}

// The options' stage 1-2 rule, for calling the plugin's own stage functions (cpu/deltakv_cpu.hpp).
inline deltakv::KeepRule keep_rule(const DkvOpts& o) {
  deltakv::KeepRule r{};
  r.packing = o.packing;
  r.metric = o.l2 ? deltakv::kL2 : deltakv::kCos;
  r.threshold = float(o.threshold);
  r.keep = 1.0 - o.reduction;
  r.seed = uint64_t(o.seed);
  r.chunk = int32_t(o.chunk);
  return r;
}

}  // namespace sieve::testing
