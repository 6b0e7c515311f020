// The planted selection-quality probe (see planted.hpp).
#include "sieve/reference/planted.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "sieve/reference/attention_ref.hpp"

namespace sieve::reference {

int64_t PlantedKeys::count() const {
  int64_t n = 0;
  for (const auto& p : positions) n += int64_t(p.size());
  return n;
}

PlantedKeys plant_keys(Workload& w, int32_t per_head, double logit, uint64_t seed) {
  const auto& sp = w.spec;
  const int32_t hq = sp.n_q_heads, hkv = sp.n_kv_heads, d = sp.head_dim, ps = sp.page_size;
  const int32_t group = hq / hkv;
  std::mt19937 rng(uint32_t(seed * 2654435761u + 17));
  PlantedKeys planted;
  planted.n_kv_heads = hkv;
  planted.positions.resize(size_t(w.batch) * hkv);
  const int32_t* kp = w.kv_indptr.data<int32_t>();
  const int32_t* pages = w.kv_indices.data<int32_t>();
  const int32_t* qo = w.qo_indptr.data<int32_t>();
  const float q_norm = float(std::sqrt(double(d)));
  for (int32_t b = 0; b < w.batch; ++b) {
    // Whole pages before the first query, the last of them excluded (next to the queries, which
    // every recency rule keeps anyway).
    const int32_t candidates = (w.kv_len[size_t(b)] - w.n_new[size_t(b)]) / ps - 1;
    for (int32_t g = 0; g < hkv; ++g) {
      const std::vector<float> u = random_unit_vector(rng, d);
      for (int32_t t = qo[b]; t < qo[b + 1]; ++t)
        for (int32_t h = g * group; h < (g + 1) * group; ++h)
          for (int32_t i = 0; i < d; ++i) w.q.set((int64_t(t) * hq + h) * d + i, q_norm * u[size_t(i)]);
      if (candidates < per_head + 1) continue;
      std::vector<int32_t> order(static_cast<size_t>(candidates));  // candidate pages, shuffled
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      auto& where = planted.positions[size_t(b) * hkv + g];
      for (int32_t j = 0; j < per_head; ++j) {
        const int32_t pos = order[size_t(j)] * ps + int32_t(rng() % uint32_t(ps));
        where.push_back(pos);
        const int64_t o = ((int64_t(pages[kp[b] + pos / ps]) * hkv + g) * ps + pos % ps) * d;
        for (int32_t i = 0; i < d; ++i) w.k_pages.set(o + i, float(logit) * u[size_t(i)]);
      }
      std::sort(where.begin(), where.end());
    }
  }
  return planted;
}

double planted_recall(const sieve_attention_args& args, const PlantedKeys& planted,
                      const std::vector<std::vector<uint8_t>>* kept) {
  if (planted.count() == 0) return -1;
  RefOptions dense;
  dense.ignore_selection = true;
  dense.keep_probs = true;
  const RefAttention ref = attend_reference(args, dense);
  const int32_t hq = args.n_q_heads, group = hq / args.n_kv_heads;
  const int32_t ps = args.kv->page_size;
  double total = 0, attended = 0;
  for (int32_t b = 0; b < args.kv->batch; ++b)
    for (int32_t t = args.qo_indptr_host[b]; t < args.qo_indptr_host[b + 1]; ++t)
      for (int32_t h = 0; h < hq; ++h) {
        const auto& where = planted.positions[size_t(b) * planted.n_kv_heads + h / group];
        if (where.empty() || !ref.computed[size_t(t)]) continue;
        const auto p = ref.prob_row(t, h);
        const std::vector<uint8_t> mask = attended_keys(args, t, h);
        for (int32_t pos : where) {
          const bool resident = !kept || (*kept)[size_t(b)][size_t(pos / ps)];
          total += p[size_t(pos)];
          if (mask[size_t(pos)] && resident) attended += p[size_t(pos)];
        }
      }
  return total > 0 ? attended / total : -1;
}

}  // namespace sieve::reference
