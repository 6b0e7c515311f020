// Page statistics (decode): Σ over a page's tokens of the max over heads of p_h(t), a second
// sweep over the attended pages with each row's final lse.
#include <algorithm>
#include <cmath>

#include "call.hpp"
#include "cpu_loops.hpp"

namespace sieve::kernels::cpu {

void page_mass_sweep(const Call& c, int32_t b, int32_t g_begin, int32_t g_end, int32_t column,
                     int32_t p_begin, int32_t p_end, Scratch& w) {
  const int d = c.s.d;
  const int32_t len = c.len(b);
  const int32_t token = c.qo[b];  // decode: one query per sequence
  p_end = std::min(p_end, c.pages(b));
  if (p_begin >= p_end) return;
  float* pmax = w.pmax.data();  // indexed by position; [p_begin, p_end)'s positions are used
  const int64_t first = int64_t(p_begin) * c.s.page_size;
  std::fill(pmax + first, pmax + std::min<int64_t>(len, int64_t(p_end) * c.s.page_size), 0.f);
  if (!c.row_mask || c.row_mask[token]) {
    // The heads of a KV head that visit the same pages (all of them, unless selections are per
    // query head) share one pass: each page's keys are read and converted once for all of them,
    // not once per head. max is exact, so the order of the heads changes no bit.
    const int nh = !c.s.dense && c.s.sel_heads == SIEVE_SEL_PER_Q_HEAD ? 1 : c.s.group;
    float* qf = w.qf.data();  // [nh, d]: the live heads' scaled queries
    float* lse = w.m.data();  // [nh]: their lse
    float* sc = w.s.data();
    int32_t* pages = w.pages.data();
    for (int32_t g = g_begin; g < g_end; ++g) {
      for (int32_t h0 = g * c.s.group; h0 < (g + 1) * c.s.group; h0 += nh) {
        int live = 0;
        for (int32_t h = h0; h < h0 + nh; ++h) {
          const float l = c.lse_all[int64_t(token) * c.s.hq + h];
          if (l == kNegInf) continue;  // attended nothing
          load_run(c.q, c.q_dt, (int64_t(token) * c.s.hq + h) * d, d, c.s.scale,
                   qf + int64_t(live) * d);
          lse[live++] = l;
        }
        if (live == 0) continue;
        const int32_t n = visit_pages(c, b, c.row(b, 0, h0), len - 1, pages);
        for (int32_t u = 0; u < n; ++u) {
          if (pages[u] < p_begin || pages[u] >= p_end) continue;
          const int nt = c.page_tokens(b, pages[u]);
          const int64_t o = c.slab(b, pages[u], g);
          const float* kt = static_cast<const float*>(c.k) + o;
          if (!c.in_place()) {
            load_rows(c.k, c.kv_dt, o, nt, d, c.s.pages.token, w.kf.data());
            kt = w.kf.data();
          }
          float* pm = pmax + int64_t(pages[u]) * c.s.page_size;
          for (int r = 0; r < live; ++r) {
            score_row(qf + int64_t(r) * d, kt, nt, d, sc);
            for (int i = 0; i < nt; ++i) pm[i] = std::max(pm[i], std::exp(sc[i] - lse[r]));
          }
        }
      }
    }
  }
  for (int32_t p = p_begin; p < p_end; ++p) {
    const float* pm = pmax + int64_t(p) * c.s.page_size;
    float sum = 0.f;
    for (int i = 0; i < c.page_tokens(b, p); ++i) sum += pm[i];
    c.page_mass[(int64_t(c.kv_indptr[b]) + p) * c.s.stats_h + column] = sum;
  }
}

}  // namespace sieve::kernels::cpu
