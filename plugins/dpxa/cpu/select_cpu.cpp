#include "cpu/select_cpu.hpp"

#include <algorithm>

namespace sieve::dpxa {

void CpuSelect::run(const sieve_geometry& g, const SelectConfig& c, const sieve_layer_call& call,
                    const sieve_paged_kv& view, int32_t n_rows, const sieve_host_services& services,
                    TileShares* shares) {
  check_cpu_tensors(g, call, view);
  const int32_t B = c.cfg.block, group = g.n_q_heads / g.n_kv_heads;
  const int32_t H = c.per_kv_head ? g.n_kv_heads : g.n_q_heads;
  rows_.resize(size_t(n_rows));
  for (auto& r : rows_) r.clear();
  int64_t kept = 0, causal = 0;
  double sampled = 0, logits = 0;
  if (shares) shares->layout(call, B, g.n_q_heads);
  int32_t row0 = 0;  // first query block of sequence b (C_b)
  for (int32_t b = 0; b < call.batch; ++b) {
    const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
    const int64_t kv_len = call.kv_len_host[b];
    const int32_t blocks = int32_t((n_new + B - 1) / B);
    for (int32_t kvh = 0; kvh < g.n_kv_heads; ++kvh) {
      gather_pages(g, view, view.k_pages, b, kvh, kv_len, k_);
      if (c.cfg.estimator == kDpxa) block_anchors(k_.data(), kv_len, g.head_dim, B, c.cfg.k_threshold, k_anchors_);
      for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
        gather_q(g, call, b, h, q_);
        if (c.cfg.estimator == kDpxa) block_anchors(q_.data(), n_new, g.head_dim, B, c.cfg.q_threshold, q_anchors_);
        score_head(c.cfg, q_.data(), n_new, k_.data(), kv_len, g.head_dim, &q_anchors_, &k_anchors_, scores_);
        const float tau = c.thresholds->at(call.layer, h, c.tau);
        for (int32_t t = 0; t < blocks; ++t) {
          const RowSpan& r = scores_.spans[size_t(t)];
          keep_.resize(size_t(r.n_candidates));
          const TileLse* tiles = scores_.tiles.data() + scores_.row_start[size_t(t)];
          kept += greedy_row(r, tiles, tau, keep_.data(), greedy_);
          if (shares) {  // this head's shares rank the kept tiles for DeltaX's attend
            row_shares(r, tiles, row_shares_);
            std::copy(row_shares_.begin(), row_shares_.end(), shares->row(row0 + t, h, g.n_q_heads));
          }
          causal += r.n_candidates;
          std::vector<int32_t>& row = rows_[size_t(row0 + t) * H + size_t(c.per_kv_head ? kvh : h)];
          for (int32_t j = 0; j < r.n_candidates; ++j)
            if (keep_[size_t(j)]) row.push_back(j);
          if (c.per_kv_head) {  // union with the group's earlier heads
            std::sort(row.begin(), row.end());
            row.erase(std::unique(row.begin(), row.end()), row.end());
          }
          // Sampled share of the causal logits, for the dpxa_sampled metric.
          const int64_t nq = std::min<int64_t>(B, n_new - int64_t(t) * B);
          for (int32_t j = 0; j < r.n_candidates; ++j) {
            const int64_t nk = std::min<int64_t>(B, kv_len - int64_t(j) * B);
            logits += double(nq) * double(nk);
            if (c.cfg.estimator == kDpxa) sampled += double(q_anchors_.counts[size_t(t)]) * k_anchors_.counts[size_t(j)];
          }
        }
      }
    }
    row0 += blocks;
  }
  if (causal > 0) metric(services, "dpxa_density", call.layer, double(kept) / double(causal));
  if (c.cfg.estimator == kDpxa && logits > 0) metric(services, "dpxa_sampled", call.layer, sampled / logits);
}

}  // namespace sieve::dpxa
