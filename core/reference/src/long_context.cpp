// Synthetic long contexts with realistic adjacent similarity (see long_context.hpp).
#include "sieve/reference/long_context.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>
#include <string>

#include "sieve/reference/cosine.hpp"
#include "sieve/reference/statistics.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve::reference {
namespace {

// A random unit vector; low_freq: only on the low-frequency half of the RoPE pairs (pairs
// (i, i + d/2) with i >= d/4), where LLaMA keys carry their large, stable channels.
std::vector<double> unit_vector(std::mt19937_64& rng, int32_t d, bool low_freq = false) {
  std::normal_distribution<double> normal;
  std::vector<double> u(static_cast<size_t>(d), 0.0);
  double n2 = 0;
  for (int32_t i = 0; i < d; ++i) {
    const double x = normal(rng);
    if (low_freq && i % (d / 2) < d / 4) continue;
    u[i] = x;
    n2 += x * x;
  }
  for (double& x : u) x /= std::sqrt(n2);
  return u;
}

void check_part(const char* what, double floor, double adjacent, double rho) {
  auto bad = [&](const std::string& why) {
    throw std::invalid_argument(std::string("LongContextSpec.") + what + ": " + why);
  };
  if (!(floor >= 0 && floor < 1)) bad("floor must be in [0, 1), got " + std::to_string(floor));
  if (!(rho > 0 && rho < 1)) bad("drift_rho must be in (0, 1), got " + std::to_string(rho));
  if (!(adjacent >= floor && adjacent < 1))
    bad("adjacent_cos must be in [floor, 1), got " + std::to_string(adjacent));
  if ((adjacent - floor) / rho > 1 - floor)
    bad("adjacent_cos " + std::to_string(adjacent) + " is unreachable with floor " +
        std::to_string(floor) + " and drift_rho " + std::to_string(rho) +
        " (needs adjacent <= floor + (1 - floor) * rho)");
}

// One head's pre-RoPE sequence: m·mean + drift + white, written token-major with `stride`.
struct Part {
  double floor, adjacent, rho;
};
void write_head(std::mt19937_64& rng, const Part& p, const std::vector<double>& mean,
                int32_t n, int32_t d, float* out, int64_t stride) {
  std::normal_distribution<double> normal;
  const double m = std::sqrt(p.floor * d);  // |m·mean|² = floor·d of a total ~d
  const double drift_share = (p.adjacent - p.floor) / p.rho;
  const double white = std::sqrt(std::max(0.0, 1.0 - p.floor - drift_share));
  const double drift = std::sqrt(drift_share), innov = std::sqrt(1 - p.rho * p.rho);
  std::vector<double> state(static_cast<size_t>(d));
  for (double& s : state) s = normal(rng);  // stationary start
  for (int32_t t = 0; t < n; ++t) {
    float* x = out + int64_t(t) * stride;
    for (int32_t i = 0; i < d; ++i) {
      state[i] = p.rho * state[i] + innov * normal(rng);
      x[i] = float(m * mean[i] + drift * state[i] + white * normal(rng));
    }
  }
}

// LLaMA-style RoPE: pair (i, i + d/2) rotated by pos·base^(-2i/d).
void apply_rope(float* x, int32_t d, int32_t pos, double base) {
  const int32_t h = d / 2;
  for (int32_t i = 0; i < h; ++i) {
    const double a = pos * std::pow(base, -2.0 * i / d);
    const double c = std::cos(a), s = std::sin(a), x0 = x[i], x1 = x[i + h];
    x[i] = float(x0 * c - x1 * s);
    x[i + h] = float(x0 * s + x1 * c);
  }
}

}  // namespace

LongContext make_long_context(const LongContextSpec& s) {
  const int32_t hq = s.n_q_heads, hkv = s.n_kv_heads, d = s.head_dim, n = s.n_tokens;
  if (hq < 1 || hkv < 1 || hq % hkv)
    throw std::invalid_argument("LongContextSpec: needs n_kv_heads >= 1 dividing n_q_heads >= 1");
  if (d < 2 || d % 2) throw std::invalid_argument("LongContextSpec.head_dim: needs an even value >= 2");
  if (n < 0) throw std::invalid_argument("LongContextSpec.n_tokens: negative");
  if (s.rope_base < 0) throw std::invalid_argument("LongContextSpec.rope_base: negative");
  if (!(s.heavy_fraction >= 0 && s.heavy_fraction < 1) || s.heavy_run < 1 ||
      s.heavy_directions < 0)
    throw std::invalid_argument("LongContextSpec.heavy_*: fraction in [0,1), run >= 1, "
                                "directions >= 0");
  if (!(s.value_drift >= 0 && s.value_drift <= 1))
    throw std::invalid_argument("LongContextSpec.value_drift: must be in [0, 1]");
  check_part("key", s.key_floor, s.key_adjacent_cos, s.key_drift_rho);
  check_part("query", s.query_floor, s.query_adjacent_cos, s.query_drift_rho);

  LongContext c;
  c.spec = s;
  c.q.assign(size_t(n) * hq * d, 0.f);
  c.k.assign(size_t(n) * hkv * d, 0.f);
  c.v.assign(size_t(n) * hkv * d, 0.f);
  std::mt19937_64 rng(s.seed * 0x9E3779B97F4A7C15ull + 17);
  std::normal_distribution<double> normal;
  std::uniform_real_distribution<double> uniform;
  const double sqrt_d = std::sqrt(double(d));
  const int32_t group = hq / hkv, n_dirs = s.heavy_directions;
  // Heads differ in how similar their neighbours are (a spread smooths the keep-vs-threshold
  // curve the way a real model's mix of heads does).
  auto jitter = [&](double adjacent, double floor, double rho) {
    const double hi = floor + (1 - floor) * rho - 1e-6;
    return std::clamp(adjacent + s.adjacent_spread * (2 * uniform(rng) - 1), floor, hi);
  };

  for (int32_t g = 0; g < hkv; ++g) {
    const auto key_mean = unit_vector(rng, d, true), sink = unit_vector(rng, d);
    std::vector<std::vector<double>> dirs(static_cast<size_t>(n_dirs));
    for (auto& u : dirs) u = unit_vector(rng, d);
    // A logit L between a key part of amplitude a and a query part of amplitude a needs
    // a²/√d = L at the 1/√d scale.
    const double sink_amp = std::sqrt(std::max(0.0, s.sink_logit) * sqrt_d);
    const double heavy_amp = std::sqrt(std::max(0.0, s.heavy_logit) * sqrt_d);

    // Keys: pre-RoPE parts, RoPE, then the sink and the heavy runs.
    write_head(rng, {s.key_floor, jitter(s.key_adjacent_cos, s.key_floor, s.key_drift_rho),
                     s.key_drift_rho}, key_mean, n, d,
               c.k.data() + int64_t(g) * d, int64_t(hkv) * d);
    int32_t run_left = 0, run_dir = 0;
    const double start_p = n_dirs ? s.heavy_fraction / s.heavy_run : 0.0;
    for (int32_t t = 0; t < n; ++t) {
      float* k = c.k.data() + (int64_t(t) * hkv + g) * d;
      if (s.rope_base > 0) apply_rope(k, d, t, s.rope_base);
      if (t == 0)
        for (int32_t i = 0; i < d; ++i) k[i] += float(sink_amp * sink[i]);
      if (run_left == 0 && t > 0 && uniform(rng) < start_p) {
        run_dir = int32_t(rng() % uint64_t(n_dirs));
        run_left = 1 + int32_t(std::floor(std::log(1 - uniform(rng)) /
                                          std::log(1 - 1 / s.heavy_run)));
      }
      if (run_left > 0) {
        --run_left;
        for (int32_t i = 0; i < d; ++i) k[i] += float(heavy_amp * dirs[size_t(run_dir)][i]);
      }
    }
    // Values: mostly independent (values show little adjacency), with a weak drift.
    {
      std::vector<double> state(static_cast<size_t>(d));
      for (double& x : state) x = normal(rng);
      const double rho = s.key_drift_rho, innov = std::sqrt(1 - rho * rho);
      const double w = std::sqrt(s.value_drift), u = std::sqrt(1 - s.value_drift);
      for (int32_t t = 0; t < n; ++t) {
        float* v = c.v.data() + (int64_t(t) * hkv + g) * d;
        for (int32_t i = 0; i < d; ++i) {
          state[i] = rho * state[i] + innov * normal(rng);
          v[i] = float(w * state[i] + u * normal(rng));
        }
      }
    }
    // Queries of this KV head's group: the mean holds a share of the key mean (the RoPE-relative
    // locality bias), the rest is the head's own direction (its similarity floor).
    const double key_m = std::sqrt(s.key_floor * d);
    for (int32_t j = 0; j < group; ++j) {
      const int32_t h = g * group + j;
      const auto own = unit_vector(rng, d, true);
      const double q_m = std::sqrt(s.query_floor * d);
      const double a = key_m > 0 ? std::min(q_m, s.local_logit * sqrt_d / key_m) : 0.0;
      const double b = std::sqrt(std::max(0.0, q_m * q_m - a * a));
      std::vector<double> mean(static_cast<size_t>(d));
      double n2 = 0;
      for (int32_t i = 0; i < d; ++i) n2 += (mean[i] = a * key_mean[i] + b * own[i]) * mean[i];
      for (double& x : mean) x /= n2 > 0 ? std::sqrt(n2) : 1.0;
      write_head(rng, {s.query_floor,
                       jitter(s.query_adjacent_cos, s.query_floor, s.query_drift_rho),
                       s.query_drift_rho}, mean, n, d,
                 c.q.data() + int64_t(h) * d, int64_t(hq) * d);
      for (int32_t t = 0; t < n; ++t) {
        float* q = c.q.data() + (int64_t(t) * hq + h) * d;
        if (s.rope_base > 0) apply_rope(q, d, t, s.rope_base);
        for (int32_t i = 0; i < d; ++i) {
          q[i] += float(sink_amp * sink[i]);
          if (n_dirs) q[i] += float(heavy_amp * dirs[size_t(h % n_dirs)][i]);
        }
      }
    }
  }
  return c;
}

void fill_workload(Workload& w, LongContextSpec spec) {
  spec.n_q_heads = w.spec.n_q_heads;
  spec.n_kv_heads = w.spec.n_kv_heads;
  spec.head_dim = w.spec.head_dim;
  const int32_t hq = spec.n_q_heads, hkv = spec.n_kv_heads, d = spec.head_dim,
                ps = w.spec.page_size;
  const uint64_t seed = spec.seed;
  const int32_t* kp = w.kv_indptr.data<int32_t>();
  const int32_t* pages = w.kv_indices.data<int32_t>();
  const int32_t* qo = w.qo_indptr.data<int32_t>();
  for (int32_t b = 0; b < w.batch; ++b) {
    spec.n_tokens = w.kv_len[b];
    spec.seed = seed + uint64_t(b);
    const LongContext c = make_long_context(spec);
    for (int32_t t = 0; t < spec.n_tokens; ++t)
      for (int32_t g = 0; g < hkv; ++g) {
        const int64_t o = ((int64_t(pages[kp[b] + t / ps]) * hkv + g) * ps + t % ps) * d;
        const float *k = c.k_at(t, g), *v = c.v_at(t, g);
        for (int32_t i = 0; i < d; ++i) {
          w.k_pages.set(o + i, k[i]);
          w.v_pages.set(o + i, v[i]);
        }
      }
    const int32_t first = spec.n_tokens - w.n_new[b];
    for (int32_t t = 0; t < w.n_new[b]; ++t)
      for (int32_t h = 0; h < hq; ++h) {
        const float* q = c.q_at(first + t, h);
        for (int32_t i = 0; i < d; ++i) w.q.set((int64_t(qo[b] + t) * hq + h) * d + i, q[i]);
      }
  }
}

AdjacencyStats measure_adjacency(const std::vector<float>& x, int32_t n, int32_t heads,
                                 int32_t d, int32_t far) {
  AdjacencyStats st;
  std::vector<double> cs;
  double far_sum = 0;
  int64_t far_n = 0;
  for (int32_t h = 0; h < heads; ++h)
    for (int32_t t = 1; t < n; ++t) {
      const float* a = x.data() + (int64_t(t) * heads + h) * d;
      cs.push_back(cosine(a, a - int64_t(heads) * d, d));
      if (far > 0 && t >= far) {
        far_sum += cosine(a, x.data() + (int64_t(t - far) * heads + h) * d, d);
        ++far_n;
      }
    }
  if (cs.empty()) return st;
  double sum = 0;
  for (double c : cs) sum += c;
  st.mean = sum / double(cs.size());
  std::sort(cs.begin(), cs.end());
  st.p10 = lower_quantile(cs, 0.1);
  st.p50 = lower_quantile(cs, 0.5);
  st.p90 = lower_quantile(cs, 0.9);
  st.far_mean = far_n ? far_sum / double(far_n) : 0.0;
  return st;
}

double measure_anchor_keep(const std::vector<float>& x, int32_t n, int32_t heads, int32_t d,
                           double threshold, int32_t chunk) {
  if (n <= 0 || heads <= 0) return 0.0;
  int64_t kept = 0;
  for (int32_t h = 0; h < heads; ++h) {
    const float* anchor = nullptr;
    for (int32_t t = 0; t < n; ++t) {
      const float* a = x.data() + (int64_t(t) * heads + h) * d;
      if (t % chunk == 0 || cosine(a, anchor, d) < threshold) {
        anchor = a;
        ++kept;
      }
    }
  }
  return double(kept) / (double(n) * heads);
}

}  // namespace sieve::reference
