// Random paged attention workloads (see workload.hpp).
#include "sieve/reference/workload.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>

#include "sieve/kernels/attention_args.hpp"

namespace sieve::reference {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

void fill(HostTensor& t, float v) {
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v);
}

}  // namespace

std::vector<float> random_unit_vector(std::mt19937& rng, int32_t d) {
  std::normal_distribution<float> normal;
  std::vector<float> u(static_cast<size_t>(d));
  double n2 = 0;
  for (float& x : u) {
    x = normal(rng);
    n2 += double(x) * x;
  }
  for (float& x : u) x = float(x / std::sqrt(n2));
  return u;
}

Workload::Workload(WorkloadSpec s) : spec(std::move(s)) {
  const int32_t hq = spec.n_q_heads, hkv = spec.n_kv_heads, d = spec.head_dim,
                ps = spec.page_size;
  if (hq < 1 || hkv < 1 || hq % hkv || d < 1 || ps < 1 || spec.kv_lens.empty() ||
      spec.spare_pages < 0)
    throw std::invalid_argument("WorkloadSpec: needs heads >= 1 with n_kv_heads | n_q_heads, "
                                "head_dim and page_size >= 1, at least one sequence");
  batch = int32_t(spec.kv_lens.size());
  const bool prefill = spec.phase == SIEVE_PHASE_PREFILL;
  if (!prefill && spec.phase != SIEVE_PHASE_DECODE)
    throw std::invalid_argument("WorkloadSpec.phase: not PREFILL or DECODE");
  kv_len = spec.kv_lens;
  n_new.resize(size_t(batch));
  for (int32_t b = 0; b < batch; ++b) {
    if (kv_len[b] < 0) throw std::invalid_argument("WorkloadSpec.kv_lens: negative length");
    if (prefill && !spec.n_new.empty() && spec.n_new.size() != spec.kv_lens.size())
      throw std::invalid_argument("WorkloadSpec.n_new: needs one entry per sequence (or none)");
    n_new[b] = !prefill ? 1 : spec.n_new.empty() ? kv_len[b] : spec.n_new[b];
    if (n_new[b] < 0 || n_new[b] > kv_len[b])
      throw std::invalid_argument("WorkloadSpec: sequence " + std::to_string(b) + " has " +
                                  std::to_string(n_new[b]) + " query tokens but kv_len " +
                                  std::to_string(kv_len[b]));
  }

  // Query tokens and the page table; physical page ids are a shuffled range with spares.
  qo_indptr = HostTensor({batch + 1}, kI32);
  kv_indptr = HostTensor({batch + 1}, kI32);
  kv_last_page_len = HostTensor({batch}, kI32);
  int32_t* qo = qo_indptr.data<int32_t>();
  int32_t* kp = kv_indptr.data<int32_t>();
  qo[0] = kp[0] = 0;
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t np = kernels::ceil_div(kv_len[b], ps);
    qo[b + 1] = qo[b] + n_new[b];
    kp[b + 1] = kp[b] + np;
    kv_last_page_len.data<int32_t>()[b] = np ? kv_len[b] - (np - 1) * ps : 0;
  }
  n_q_tokens = qo[batch];
  const int32_t nnz = kp[batch];
  const int32_t capacity = nnz + spec.spare_pages;

  std::mt19937 rng(uint32_t(spec.seed ^ (spec.seed >> 32)));
  std::vector<int32_t> phys(static_cast<size_t>(capacity));
  std::iota(phys.begin(), phys.end(), 0);
  std::shuffle(phys.begin(), phys.end(), rng);
  kv_indices = HostTensor({nnz}, kI32);
  std::copy_n(phys.begin(), nnz, kv_indices.data<int32_t>());

  k_pages = HostTensor({capacity, hkv, ps, d}, spec.kv_dtype);
  v_pages = HostTensor({capacity, hkv, ps, d}, spec.kv_dtype);
  fill(k_pages, kNaN);  // spare pages and unused page tails stay NaN
  fill(v_pages, kNaN);

  // Heavy directions: a heavy key and a query leaning the same way add ~heavy_logit at scale
  // 1/sqrt(d): amplitude a on both sides gives a^2 / sqrt(d).
  const float amp = float(std::sqrt(spec.heavy_logit * std::sqrt(double(d))));
  const int32_t n_dirs = std::max(spec.heavy_directions, 0);
  std::vector<std::vector<float>> dirs(size_t(hkv) * n_dirs);
  for (auto& u : dirs) u = random_unit_vector(rng, d);
  std::normal_distribution<float> normal;
  std::uniform_real_distribution<double> uniform;

  std::vector<float> row(static_cast<size_t>(d));
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t t = 0; t < kv_len[b]; ++t)
      for (int32_t g = 0; g < hkv; ++g) {
        const int64_t o =
            ((int64_t(kv_indices.data<int32_t>()[kp[b] + t / ps]) * hkv + g) * ps + t % ps) * d;
        for (float& x : row) x = normal(rng);
        if (n_dirs && uniform(rng) < spec.heavy_fraction) {
          const auto& u = dirs[size_t(g) * n_dirs + size_t(rng() % uint32_t(n_dirs))];
          for (int32_t i = 0; i < d; ++i) row[i] += amp * u[i];
        }
        for (int32_t i = 0; i < d; ++i) k_pages.set(o + i, row[i]);
        for (int32_t i = 0; i < d; ++i) v_pages.set(o + i, normal(rng));
      }

  q = HostTensor({n_q_tokens, hq, d}, spec.q_dtype);
  for (int32_t t = 0; t < n_q_tokens; ++t)
    for (int32_t h = 0; h < hq; ++h) {
      const int32_t g = h / (hq / hkv);
      for (int32_t i = 0; i < d; ++i) row[i] = normal(rng);
      if (n_dirs) {
        const auto& u = dirs[size_t(g) * n_dirs + size_t(h % n_dirs)];
        for (int32_t i = 0; i < d; ++i) row[i] += amp * u[i];
      }
      for (int32_t i = 0; i < d; ++i) q.set((int64_t(t) * hq + h) * d + i, row[i]);
    }
  out = HostTensor({n_q_tokens, hq, d}, spec.out_dtype);
  fill(out, kNaN);

  kv.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
  kv.batch = batch;
  kv.page_size = ps;
  kv.k_pages = k_pages.dl();
  kv.v_pages = v_pages.dl();
  kv.indptr = kv_indptr.dl();
  kv.indices = kv_indices.dl();
  kv.last_page_len = kv_last_page_len.dl();
  kv.indptr_host = kv_indptr.data<int32_t>();
  kv.last_page_len_host = kv_last_page_len.data<int32_t>();
  kv.k_pre_rope_pages = DLTensor{};

  args.hdr = SIEVE_HEADER_INIT(sieve_attention_args);
  args.phase = spec.phase;
  args.n_q_heads = hq;
  args.n_kv_heads = hkv;
  args.head_dim = d;
  args.scale = spec.scale;
  args.q = &q.dl();
  args.out = &out.dl();
  args.qo_indptr = &qo_indptr.dl();
  args.qo_indptr_host = qo_indptr.data<int32_t>();
  args.kv = &kv;
  args.selection = nullptr;
  args.q_rows = nullptr;
  args.stats = SIEVE_STATS_NONE;
  args.lse = nullptr;
  args.page_mass = nullptr;
}

int32_t Workload::pages(int32_t b) const {
  return kv_indptr.data<int32_t>()[b + 1] - kv_indptr.data<int32_t>()[b];
}
int32_t Workload::key_blocks(int32_t b, int32_t k_block_pages) const {
  return kernels::key_blocks(pages(b), k_block_pages);
}
int32_t Workload::query_blocks(int32_t b, int32_t q_block) const {
  return kernels::query_blocks(n_new[b], q_block);
}
int32_t Workload::selection_rows(uint32_t heads, int32_t q_block) const {
  int32_t blocks = 0;
  for (int32_t b = 0; b < batch; ++b) blocks += query_blocks(b, q_block);
  return blocks * kernels::selection_head_count(heads, spec.n_q_heads, spec.n_kv_heads);
}

SelectionRows Workload::random_selection_rows(uint32_t heads, int32_t q_block,
                                              int32_t k_block_pages, double keep,
                                              uint64_t seed) const {
  std::mt19937 rng(uint32_t(seed ^ (seed >> 32)));
  std::bernoulli_distribution pick(keep);
  const int32_t H = kernels::selection_head_count(heads, spec.n_q_heads, spec.n_kv_heads);
  SelectionRows rows;
  for (int32_t b = 0; b < batch; ++b)
    for (int32_t t = 0; t < query_blocks(b, q_block); ++t)
      for (int32_t h = 0; h < H; ++h) {
        std::vector<int32_t> r;
        for (int32_t j = 0; j < key_blocks(b, k_block_pages); ++j)
          if (pick(rng)) r.push_back(j);
        rows.push_back(std::move(r));
      }
  return rows;
}

void Workload::set_selection(uint32_t heads, int32_t q_block, int32_t k_block_pages,
                             const SelectionRows& rows) {
  constexpr int32_t kSpare = 4;
  int32_t nnz = 0;
  for (const auto& r : rows) nnz += int32_t(r.size());
  sel_indptr = HostTensor({int64_t(rows.size()) + 1}, kI32);
  sel_indices = HostTensor({nnz + kSpare}, kI32);
  int32_t* ip = sel_indptr.data<int32_t>();
  int32_t* ix = sel_indices.data<int32_t>();
  std::fill_n(ix, nnz + kSpare, -1);
  ip[0] = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::copy(rows[r].begin(), rows[r].end(), ix + ip[r]);
    ip[r + 1] = ip[r] + int32_t(rows[r].size());
  }
  selection.hdr = SIEVE_HEADER_INIT(sieve_selection);
  selection.kind = SIEVE_SEL_BLOCKS;
  selection.heads = heads;
  selection.q_block = q_block;
  selection.k_block_pages = k_block_pages;
  selection.n_rows = int32_t(rows.size());
  selection.indptr = sel_indptr.dl();
  selection.indices = sel_indices.dl();
  selection.capacity = nnz + kSpare;
  args.selection = &selection;
}

void Workload::clear_selection() { args.selection = nullptr; }

void Workload::set_q_rows(const std::vector<int32_t>& rows) {
  q_rows = HostTensor({int64_t(rows.size())}, kI32);
  std::copy(rows.begin(), rows.end(), q_rows.data<int32_t>());
  args.q_rows = &q_rows.dl();
}
void Workload::clear_q_rows() { args.q_rows = nullptr; }

void Workload::request_lse() {
  lse = HostTensor({n_q_tokens, spec.n_q_heads}, kF32);
  fill(lse, kNaN);
  args.lse = &lse.dl();
}

void Workload::request_stats(sieve_stats_request stats) {
  const int64_t h = stats == SIEVE_STATS_PAGE_MASS_PER_KV_HEAD ? spec.n_kv_heads : 1;
  page_mass = HostTensor({kv_indptr.data<int32_t>()[batch], h}, kF32);
  fill(page_mass, kNaN);
  args.stats = stats;
  args.page_mass = stats == SIEVE_STATS_NONE ? nullptr : &page_mass.dl();
}

void Workload::poison_outputs() {
  fill(out, kNaN);
  if (args.lse) fill(lse, kNaN);
  if (args.page_mass) fill(page_mass, kNaN);
}

}  // namespace sieve::reference
