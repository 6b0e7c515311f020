// The Quest selection written the slow, obvious way from the raw keys of a FakePagedKv view:
// min/max recomputed from the pages, the bound per query head (or the max over the GQA group),
// the last page plus the best (budget - 1) others by a full sort (score desc, page asc); every
// page when the sequence has no more than `budget` pages. Rows in the plugin's order.
// With `prompt_pages` (raas's prefill_policy=quest): sequence b's row is that choice among its
// first prompt_pages[b] pages, then every page after them.
#pragma once
#include <sieve/selection/page_bound.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <vector>

namespace sieve::testing {

inline std::vector<std::vector<int32_t>> quest_reference(const sieve_paged_kv& view, const DLTensor& q,
                                                         int32_t n_q_heads, int32_t budget_pages,
                                                         bool gqa_share,
                                                         const std::vector<int32_t>* prompt_pages = nullptr) {
  const int32_t Hkv = int32_t(view.k_pages.shape[1]), d = int32_t(view.k_pages.shape[3]);
  const int32_t G = n_q_heads / Hkv, ps = view.page_size;
  std::vector<std::vector<int32_t>> rows;
  const size_t dn = static_cast<size_t>(d);
  std::vector<float> mn(dn), mx(dn), qh(dn);
  for (int32_t b = 0; b < view.batch; ++b) {
    const int32_t n = view.indptr_host[b + 1] - view.indptr_host[b];
    // scores[page][q head]
    std::vector<std::vector<float>> s(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(n_q_heads)));
    for (int32_t j = 0; j < n; ++j) {
      const int32_t phys = sieve::data_ptr<int32_t>(view.indices)[view.indptr_host[b] + j];
      const int32_t tokens = j + 1 < n ? ps : view.last_page_len_host[b];
      for (int32_t h = 0; h < n_q_heads; ++h) {
        sieve::selection::minmax_recompute_cpu(view, phys, h / G, tokens, mn.data(), mx.data());
        for (int32_t c = 0; c < d; ++c)
          qh[size_t(c)] = sieve::load_float(q.data, q.dtype, (int64_t(b) * n_q_heads + h) * d + c);
        s[size_t(j)][size_t(h)] = sieve::selection::page_bound(qh.data(), mn.data(), mx.data(), d);
      }
    }
    const int32_t H = gqa_share ? Hkv : n_q_heads;
    for (int32_t r = 0; r < H; ++r) {
      auto score = [&](int32_t j) {
        if (!gqa_share) return s[size_t(j)][size_t(r)];
        float m = s[size_t(j)][size_t(r * G)];
        for (int32_t g = 1; g < G; ++g) m = std::max(m, s[size_t(j)][size_t(r * G + g)]);
        return m;
      };
      const int32_t m = prompt_pages ? std::min(n, (*prompt_pages)[size_t(b)]) : n;  // the pages ranked
      std::vector<int32_t> row;
      if (m <= budget_pages) {
        for (int32_t j = 0; j < m; ++j) row.push_back(j);
      } else {
        std::vector<int32_t> others;
        for (int32_t j = 0; j + 1 < m; ++j) others.push_back(j);
        std::stable_sort(others.begin(), others.end(), [&](int32_t a, int32_t c) { return score(a) > score(c); });
        others.resize(size_t(budget_pages - 1));
        row = others;
        row.push_back(m - 1);
        std::sort(row.begin(), row.end());
      }
      for (int32_t j = m; j < n; ++j) row.push_back(j);
      rows.push_back(row);
    }
  }
  return rows;
}

}  // namespace sieve::testing
