// The benchmark cases, their selections and work (see cases.hpp).
#include "cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

#include "sieve/kernels/attention_args.hpp"

namespace sieve::bench {
namespace {

constexpr double kSparsities[] = {0.5, 0.75, 0.9, 0.95};

std::string shape_name(const Case& c) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s/%dq%dkv%d/bs%d/ctx%d/%s", c.prefill() ? "prefill" : "decode", c.hq,
                c.hkv, c.d, c.batch, c.ctx, dtype_name(c.dtype).c_str());
  return buf;
}

// Fills name and shape: "<gpu|cpu>/<shape>/<dense|sparse0.90>[/fma]".
Case named(Case c) {
  c.shape = shape_name(c);
  char variant[32];
  if (c.dense()) std::snprintf(variant, sizeof variant, "dense");
  else std::snprintf(variant, sizeof variant, "sparse%.2f", c.sparsity);
  c.name = std::string(c.backend == Backend::kCuda ? "gpu/" : "cpu/") + c.shape + "/" + variant +
           (c.tensor_cores ? "" : "/fma") + (c.cpu_portable ? "/portable" : "");
  if (c.kv_splits) c.name += "/splits" + std::to_string(c.kv_splits);
  if (c.split_min_keys) c.name += "/minkeys" + std::to_string(c.split_min_keys);
  return c;
}

// A dense case and its sparse variants.
void add_with_sparse(std::vector<Case>& out, Case c, bool all_sparsities = true) {
  c.sparsity = 0;
  c.sdpa = c.backend == Backend::kCuda && c.tensor_cores;
  out.push_back(named(c));
  c.sdpa = false;
  for (double s : kSparsities) {
    if (!all_sparsities && s != 0.9) continue;
    c.sparsity = s;
    out.push_back(named(c));
  }
}

struct Geometry {
  int32_t hq, hkv;
};
constexpr Geometry kGeometries[] = {{64, 8}, {32, 8}};  // SeerAttention-R's kernel benchmark; Llama-3-8B

}  // namespace

std::vector<Case> gpu_cases(bool quick) {
  std::vector<Case> out;
  Case c;
  c.backend = Backend::kCuda;
  c.d = 128;
  c.page_size = 16;
  c.dtype = kBF16;
  if (quick) {
    c.hq = 64, c.hkv = 8, c.batch = 4, c.ctx = 8192, c.samples = 5;
    add_with_sparse(out, c, false);
    c.phase = SIEVE_PHASE_PREFILL, c.hq = 32, c.batch = 1, c.ctx = 4096, c.q_block = 128;
    add_with_sparse(out, c, false);
    return out;
  }
  // Decode: batch 1-16, context 8K-128K.
  for (Geometry g : kGeometries)
    for (int32_t batch : {1, 4, 16})
      for (int32_t ctx : {8192, 32768, 131072}) {
        c.hq = g.hq, c.hkv = g.hkv, c.batch = batch, c.ctx = ctx, c.samples = 15;
        add_with_sparse(out, c);
      }
  // The FMA kernels on the headline decode shape, to show what the tensor-core path buys.
  c.hq = 64, c.hkv = 8, c.batch = 16, c.ctx = 32768, c.tensor_cores = false;
  add_with_sparse(out, c, false);
  c.tensor_cores = true;
  // Other split counts on the headline shape (dense and 90% sparse), so the table shows whether
  // the automatic choice leaves time behind.
  for (double sp : {0.0, 0.9})
    for (int32_t splits : {4, 8, 17}) {
      c.sparsity = sp, c.kv_splits = splits;
      out.push_back(named(c));
    }
  c.kv_splits = 0;
  // Short block-sparse rows on a grid that is one round of CTAs: one split per 64-key tile begun
  // instead of per 256 keys (the row kernel's time there is a chain of dependent loads per CTA,
  // so fewer tiles per CTA may beat the combine's cost; issue 20, docs/bench/policy.md).
  c.hq = 32;
  for (int32_t batch : {1, 4})
    for (int32_t ctx : {8192, 32768})
      for (double sp : {0.9, 0.95}) {
        c.batch = batch, c.ctx = ctx, c.sparsity = sp, c.split_min_keys = 64;
        out.push_back(named(c));
      }
  c.split_min_keys = 0;
  c.sparsity = 0;
  // Prefill: one prompt of 16K-64K tokens, BSR selections of 128-token query blocks x 64-key blocks.
  c.phase = SIEVE_PHASE_PREFILL;
  c.batch = 1;
  c.q_block = 128;
  for (Geometry g : kGeometries)
    for (int32_t ctx : {16384, 32768, 65536}) {
      c.hq = g.hq, c.hkv = g.hkv, c.ctx = ctx, c.samples = ctx <= 16384 ? 7 : ctx <= 32768 ? 5 : 3;
      add_with_sparse(out, c);
    }
  c.hq = 32, c.hkv = 8, c.ctx = 16384, c.samples = 3, c.tensor_cores = false;
  c.sparsity = 0;
  out.push_back(named(c));
  return out;
}

std::vector<Case> cpu_cases(bool quick) {
  std::vector<Case> out;
  Case c;
  c.backend = Backend::kCpu;
  c.hq = 32, c.hkv = 8, c.d = 128, c.page_size = 16, c.samples = 5;
  for (DLDataType dt : {kBF16, kF32})
    for (int32_t batch : {1, 4})
      for (int32_t ctx : {8192, 32768}) {
        if (quick && (batch != 1 || ctx != 8192 || dt.bits != 16)) continue;
        c.dtype = dt, c.batch = batch, c.ctx = ctx;
        add_with_sparse(out, c, false);
        // The portable loops on the dense shape: the in-run baseline of the SIMD kernel.
        c.sparsity = 0, c.cpu_portable = true;
        out.push_back(named(c));
        c.cpu_portable = false;
      }
  // Causal prefill of one 4K prompt, 128-query x 64-key blocks for the sparse case: FLOP/s
  // against OpenBLAS sgemm in the same run; the portable path (BLAS tiles) as the in-run baseline.
  c.phase = SIEVE_PHASE_PREFILL, c.batch = 1, c.ctx = 4096, c.q_block = 128, c.samples = 3;
  for (DLDataType dt : {kF32, kBF16}) {
    if (quick) continue;
    c.dtype = dt;
    add_with_sparse(out, c, false);
    c.sparsity = 0, c.cpu_portable = true;
    out.push_back(named(c));
    c.cpu_portable = false;
  }
  return out;
}

reference::SelectionRows make_selection(const Case& c, uint64_t seed) {
  reference::SelectionRows rows;
  if (c.dense()) return rows;
  std::mt19937_64 rng(seed);
  const int32_t np = kernels::ceil_div(c.ctx, c.page_size);
  const int32_t n_blocks_seq = kernels::key_blocks(np, c.k_block_pages);
  const int32_t block_keys = c.k_block_pages * c.page_size;
  const int32_t qb = c.prefill() ? c.q_block : 1;
  const int32_t n_qb = kernels::query_blocks(n_new(c), qb);
  std::vector<int32_t> pool;
  for (int32_t b = 0; b < c.batch; ++b)
    for (int32_t t = 0; t < n_qb; ++t)
      for (int32_t g = 0; g < c.hkv; ++g) {
        // Key blocks this query block can see: up to the one holding its last query's position.
        const int32_t last_pos = c.prefill() ? std::min((t + 1) * qb, c.ctx) - 1 : c.ctx - 1;
        const int32_t visible = std::min(n_blocks_seq, last_pos / block_keys + 1);
        const int32_t keep = std::clamp(int32_t(std::lround((1.0 - c.sparsity) * visible)), 1, visible);
        pool.resize(size_t(visible - 1));
        std::iota(pool.begin(), pool.end(), 0);
        for (int32_t i = 0; i < keep - 1; ++i) {  // partial Fisher-Yates
          std::uniform_int_distribution<int32_t> pick(i, visible - 2);
          std::swap(pool[size_t(i)], pool[size_t(pick(rng))]);
        }
        std::vector<int32_t> row(pool.begin(), pool.begin() + (keep - 1));
        row.push_back(visible - 1);  // the local block
        std::sort(row.begin(), row.end());
        rows.push_back(std::move(row));
      }
  return rows;
}

Work case_work(const Case& c, const reference::SelectionRows& rows) {
  Work w;
  const double elem = double(dtype_bytes(c.dtype));
  const int32_t group = c.hq / c.hkv;
  const int32_t nq = n_new(c);
  w.qo_bytes = 2.0 * c.batch * nq * c.hq * c.d * elem;
  const int32_t block_keys = c.k_block_pages * c.page_size;
  const int32_t first_pos = c.ctx - nq;

  // Query-key pairs (per head) that one selection row attends, for query positions [p0, p1].
  auto pairs = [&](int64_t p0, int64_t p1, int64_t ks, int64_t ke) -> double {
    ke = std::min<int64_t>(ke, c.ctx);
    if (ke <= ks || p1 < ks) return 0;
    if (ke - 1 <= p0) return double(p1 - p0 + 1) * double(ke - ks);  // below the diagonal
    double n = 0;
    for (int64_t pos = p0; pos <= p1; ++pos) n += double(std::max<int64_t>(0, std::min(pos + 1, ke) - ks));
    return n;
  };
  double keys = 0, dense_keys = 0, pair_count = 0, dense_pairs = 0;
  const int32_t qb = c.prefill() ? c.q_block : 1;
  const int32_t n_qb = kernels::query_blocks(nq, c.dense() ? nq : qb);
  for (int32_t b = 0; b < c.batch; ++b) {
    // Dense: every sequence's keys once per KV head; causal pairs n(n+1)/2 (prefill) or ctx.
    dense_keys += double(c.ctx) * c.hkv;
    for (int64_t i = 0; i < nq; ++i) dense_pairs += double(first_pos + i + 1) * c.hkv;
    if (c.dense()) continue;
    for (int32_t t = 0; t < n_qb; ++t)
      for (int32_t g = 0; g < c.hkv; ++g) {
        const auto& row = rows[size_t((int64_t(b) * n_qb + t) * c.hkv + g)];
        const int64_t p0 = first_pos + int64_t(t) * qb, p1 = first_pos + std::min<int64_t>((t + 1) * qb, nq) - 1;
        for (int32_t j : row) {
          const int64_t ks = int64_t(j) * block_keys, ke = std::min<int64_t>(ks + block_keys, c.ctx);
          pair_count += pairs(p0, p1, ks, ke);
          if (!c.prefill()) keys += double(ke - ks);
        }
      }
  }
  if (c.dense()) {
    keys = dense_keys;
    pair_count = dense_pairs;
  }
  // Decode reads each attended key once per KV head; prefill's minimum is the same (its re-reads
  // across query tiles hit L2 and are not counted).
  w.kv_bytes = (c.prefill() ? dense_keys * (pair_count / dense_pairs) : keys) * 2.0 * c.d * elem;
  w.flops = 4.0 * c.d * group * pair_count;
  w.kept = pair_count / dense_pairs;
  return w;
}

}  // namespace sieve::bench
