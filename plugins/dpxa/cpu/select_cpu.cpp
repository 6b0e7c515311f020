#include "cpu/select_cpu.hpp"

#include <algorithm>
#include <exception>

#ifdef _OPENMP
#include <omp.h>
#endif

namespace sieve::dpxa {

namespace {
// Threads over (sequence, KV head) from this many q·k multiply-adds of the estimate (below it a
// thread team costs more than it saves; the same rule as the core kernel's small calls).
constexpr double kThreadedWork = double(1 << 20);
}  // namespace

void CpuSelect::run_kv_head(const sieve_geometry& g, const SelectConfig& c, const sieve_layer_call& call,
                            const sieve_paged_kv& view, int32_t b, int32_t kvh, int32_t row0,
                            TileShares* shares, Worker& w) {
  const int32_t B = c.cfg.block, group = g.n_q_heads / g.n_kv_heads;
  const int32_t H = c.per_kv_head ? g.n_kv_heads : g.n_q_heads;
  const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
  const int64_t kv_len = call.kv_len_host[b];
  const int32_t blocks = int32_t((n_new + B - 1) / B);
  gather_pages(g, view, view.k_pages, b, kvh, kv_len, w.k);
  if (c.cfg.estimator == kDpxa) block_anchors(w.k.data(), kv_len, g.head_dim, B, c.cfg.k_threshold, w.k_anchors);
  for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
    gather_q(g, call, b, h, w.q);
    if (c.cfg.estimator == kDpxa) block_anchors(w.q.data(), n_new, g.head_dim, B, c.cfg.q_threshold, w.q_anchors);
    score_head(c.cfg, w.q.data(), n_new, w.k.data(), kv_len, g.head_dim, &w.q_anchors, &w.k_anchors, w.scores);
    const float tau = c.thresholds->at(call.layer, h, c.tau);
    for (int32_t t = 0; t < blocks; ++t) {
      const RowSpan& r = w.scores.spans[size_t(t)];
      w.keep.resize(size_t(r.n_candidates));
      const TileLse* tiles = w.scores.tiles.data() + w.scores.row_start[size_t(t)];
      w.kept += greedy_row(r, tiles, tau, w.keep.data(), w.greedy);
      if (shares) {  // this head's shares rank the kept tiles for DeltaX's attend
        row_shares(r, tiles, w.row_shares);
        std::copy(w.row_shares.begin(), w.row_shares.end(), shares->row(row0 + t, h, g.n_q_heads));
      }
      w.causal += r.n_candidates;
      std::vector<int32_t>& row = rows_[size_t(row0 + t) * H + size_t(c.per_kv_head ? kvh : h)];
      for (int32_t j = 0; j < r.n_candidates; ++j)
        if (w.keep[size_t(j)]) row.push_back(j);
      if (c.per_kv_head) {  // union with the group's earlier heads
        std::sort(row.begin(), row.end());
        row.erase(std::unique(row.begin(), row.end()), row.end());
      }
      // Sampled share of the causal logits, for the dpxa_sampled metric (integer-valued sums:
      // exact in double whatever the order the workers' totals add in).
      const int64_t nq = std::min<int64_t>(B, n_new - int64_t(t) * B);
      for (int32_t j = 0; j < r.n_candidates; ++j) {
        const int64_t nk = std::min<int64_t>(B, kv_len - int64_t(j) * B);
        w.logits += double(nq) * double(nk);
        if (c.cfg.estimator == kDpxa) w.sampled += double(w.q_anchors.counts[size_t(t)]) * w.k_anchors.counts[size_t(j)];
      }
    }
  }
}

void CpuSelect::run(const sieve_geometry& g, const SelectConfig& c, const sieve_layer_call& call,
                    const sieve_paged_kv& view, int32_t n_rows, const sieve_host_services& services,
                    TileShares* shares) {
  check_cpu_tensors(g, call, view);
  const int32_t B = c.cfg.block;
  rows_.resize(size_t(n_rows));
  for (auto& r : rows_) r.clear();
  if (shares) shares->layout(call, B, g.n_q_heads);
  // Each (sequence, KV head) writes only its own rows (its q heads', or its KV head's) and share
  // rows: the workers change no bit of the selection.
  row0_.assign(size_t(call.batch) + 1, 0);  // first query block of sequence b
  double work = 0;
  for (int32_t b = 0; b < call.batch; ++b) {
    const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
    row0_[size_t(b) + 1] = row0_[size_t(b)] + int32_t((n_new + B - 1) / B);
    work += double(n_new) * double(call.kv_len_host[b]) * g.head_dim * g.n_q_heads / B;
  }
  const int64_t items = int64_t(call.batch) * g.n_kv_heads;
  int threads = 1;
#ifdef _OPENMP
  if (work >= kThreadedWork) threads = int(std::min<int64_t>(omp_get_max_threads(), items));
#endif
  if (workers_.size() < size_t(std::max(threads, 1))) workers_.resize(size_t(std::max(threads, 1)));
  for (Worker& w : workers_) w.kept = w.causal = 0, w.sampled = w.logits = 0;
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
  for (int64_t i = 0; i < items; ++i) {
#ifdef _OPENMP
    Worker& w = workers_[size_t(omp_get_thread_num())];
#else
    Worker& w = workers_[0];
#endif
    try {
      const int32_t b = int32_t(i / g.n_kv_heads), kvh = int32_t(i % g.n_kv_heads);
      run_kv_head(g, c, call, view, b, kvh, row0_[size_t(b)], shares, w);
    } catch (...) {
#pragma omp critical(dpxa_select_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  int64_t kept = 0, causal = 0;
  double sampled = 0, logits = 0;
  for (const Worker& w : workers_) kept += w.kept, causal += w.causal, sampled += w.sampled, logits += w.logits;
  if (causal > 0) metric(services, "dpxa_density", call.layer, double(kept) / double(causal));
  if (c.cfg.estimator == kDpxa && logits > 0) metric(services, "dpxa_sampled", call.layer, sampled / logits);
}

}  // namespace sieve::dpxa
