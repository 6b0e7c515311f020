// Micro-benchmarks of the policies' CPU selection work (issue 24), at docs/results/policy-step-cpu.md's
// geometry (8 q / 2 KV heads, head dim 64, page 16, bf16), one layer, with the threads OpenMP
// gives (OMP_NUM_THREADS): Quest's page bounds (core/selection page_bounds_cpu) and its top-k
// (top_k_batch_cpu, 63 best pages + the last of each row: token_budget 1024), and DELTA's page
// statistics (the dense decode call with and without SIEVE_STATS_PAGE_MASS_ALL_HEADS: the
// difference is the page-mass sweep). Arguments: context, batch. The K pages of one layer fit the
// last-level cache here, as the policy step's do; these time the arithmetic, not memory.
//
//   build/bin/sieve_selection_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/kernels/attention_cpu.hpp"
#include "sieve/selection/page_bound.hpp"
#include "sieve/selection/top_k.hpp"
#include "sieve/util/tensor.hpp"

namespace {

using namespace sieve;
constexpr int32_t kHq = 8, kHkv = 2, kD = 64, kPage = 16, kBudgetPages = 1024 / kPage;

// A decode call's paged KV of `batch` sequences of `ctx` tokens (pages shuffled), q, the Quest
// min/max sidecar of K, and the views over them.
struct Layer {
  int32_t batch, pages_per_seq;
  HostTensor k, v, q, out, sidecar;
  std::vector<int32_t> indptr, indices, last, qo;
  int64_t kv_shape[4], ip_shape[1], ix_shape[1], last_shape[1];
  sieve_paged_kv kv{};
  DLTensor qo_t{};

  Layer(int32_t ctx, int32_t b)
      : batch(b), pages_per_seq((ctx + kPage - 1) / kPage),
        k({int64_t(b) * pages_per_seq, kHkv, kPage, kD}, kBF16), v(k.shape(), kBF16), q({b, kHq, kD}, kBF16),
        out({b, kHq, kD}, kBF16), sidecar({int64_t(b) * pages_per_seq, kHkv, 2 * kD}, kBF16) {
    std::mt19937 rng(7);
    std::normal_distribution<float> n01;
    for (HostTensor* t : {&k, &v, &q})
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, n01(rng));
    const int64_t pages = int64_t(b) * pages_per_seq;
    indices.resize(size_t(pages));
    std::iota(indices.begin(), indices.end(), 0);
    std::shuffle(indices.begin(), indices.end(), rng);
    for (int32_t s = 0; s <= b; ++s) {
      indptr.push_back(s * pages_per_seq);
      qo.push_back(s);
    }
    last.assign(size_t(b), ctx - (pages_per_seq - 1) * kPage);
    for (int i = 0; i < 4; ++i) kv_shape[i] = k.shape()[size_t(i)];
    ip_shape[0] = b + 1, ix_shape[0] = pages, last_shape[0] = b;
    kv.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
    kv.batch = b;
    kv.page_size = kPage;
    kv.k_pages = make_view(k.dl().data, kCpu, kBF16, 4, kv_shape);
    kv.v_pages = make_view(v.dl().data, kCpu, kBF16, 4, kv_shape);
    kv.indptr = make_view(indptr.data(), kCpu, kI32, 1, ip_shape);
    kv.indices = make_view(indices.data(), kCpu, kI32, 1, ix_shape);
    kv.last_page_len = make_view(last.data(), kCpu, kI32, 1, last_shape);
    kv.indptr_host = indptr.data();
    kv.last_page_len_host = last.data();
    qo_t = make_view(qo.data(), kCpu, kI32, 1, ip_shape);
    std::vector<int32_t> appended(size_t(b) + 1);  // every token new: the sidecar Quest's on_append leaves
    for (int32_t s = 0; s <= b; ++s) appended[size_t(s)] = s * ctx;
    selection::minmax_on_append_cpu(kv, appended.data(), sidecar.dl());
  }
};

void QuestBounds(benchmark::State& st) {
  Layer l(int32_t(st.range(0)), int32_t(st.range(1)));
  std::vector<float> scores(l.indices.size() * kHq), scratch(size_t(selection::page_bounds_scratch_floats(kHq, kD)));
  for (auto _ : st) {
    selection::page_bounds_cpu(l.kv, l.sidecar.dl(), l.q.dl(), l.qo.data(), kHq, false, scores.data(),
                               {kHq, 1}, scratch.data());
    benchmark::DoNotOptimize(scores.data());
  }
}

void QuestTopK(benchmark::State& st) {
  Layer l(int32_t(st.range(0)), int32_t(st.range(1)));
  std::vector<float> scores(l.indices.size() * kHq), scratch(size_t(selection::page_bounds_scratch_floats(kHq, kD)));
  selection::page_bounds_cpu(l.kv, l.sidecar.dl(), l.q.dl(), l.qo.data(), kHq, false, scores.data(), {kHq, 1},
                             scratch.data());
  const selection::TopKBatch batch{scores.data(), {kHq, 1}, l.indptr.data(), l.batch, kHq, 0, 1, kBudgetPages - 1};
  std::vector<int32_t> indptr(size_t(l.batch) * kHq + 1), indices(size_t(selection::top_k_capacity_needed(batch)));
  std::vector<int32_t> topk_scratch(size_t(l.pages_per_seq) + 1);
  for (auto _ : st) {
    selection::top_k_batch_cpu(batch, indptr.data(), indices.data(), topk_scratch.data());
    benchmark::DoNotOptimize(indices.data());
  }
}

// Dense decode of the layer, with DELTA's page statistics when st.range(2) is 1.
void DeltaDecode(benchmark::State& st) {
  Layer l(int32_t(st.range(0)), int32_t(st.range(1)));
  sieve_attention_args a = kernels::make_attention_args(SIEVE_PHASE_DECODE, kHq, kHkv, kD, &l.q.dl(), &l.out.dl(),
                                                        &l.qo_t, l.qo.data(), &l.kv);
  HostTensor mass({int64_t(l.indices.size()), 1}, kF32);
  if (st.range(2)) {
    a.stats = SIEVE_STATS_PAGE_MASS_ALL_HEADS;
    a.page_mass = &mass.dl();
  }
  std::string err;
  for (auto _ : st)
    if (kernels::attend_cpu(a, &err) != SIEVE_OK) {
      st.SkipWithError(err.c_str());
      break;
    }
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t ctx : {4096, 16384})
    for (int64_t batch : {1, 4}) b->Args({ctx, batch});
}
void SizesStats(benchmark::internal::Benchmark* b) {
  for (int64_t ctx : {4096, 16384})
    for (int64_t batch : {1, 4})
      for (int64_t stats : {0, 1}) b->Args({ctx, batch, stats});
}

BENCHMARK(QuestBounds)->Apply(Sizes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(QuestTopK)->Apply(Sizes)->Unit(benchmark::kMicrosecond)->UseRealTime();
BENCHMARK(DeltaDecode)->Apply(SizesStats)->ArgNames({"ctx", "batch", "page_mass"})->Unit(benchmark::kMicrosecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
