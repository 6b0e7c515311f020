// CPU cases: the same paged workloads in host memory through attend_cpu, timed with a steady
// clock; a decode call's ceilings (memcpy and a read-only stream over the same threads,
// host_ceilings.cpp) are measured right before each timed call, so noise moves both. The
// K/V pool holds enough copies of the case's pages that the bytes the calls read (all of K/V
// dense, the selected blocks sparse) exceed the last-level cache three times before they repeat,
// and successive calls read successive copies (page tables rotated), so every call reads its K/V
// from memory as a long decode would. The pool is advised to use transparent huge pages
// (host_buffer.hpp), as a KV cache's one large allocation would be: with 4 KiB pages every 4 KiB K or V
// slab of a scattered page is a TLB miss, which nested paging in a VM makes costly (measured here:
// 4 KiB blocks read in random order at 8.7-11 GB/s with 4 KiB pages, 16-24 GB/s with huge pages,
// under load).
#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <utility>

#include <unistd.h>

#include "host_buffer.hpp"
#include "runner.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/kernels/attention_cpu.hpp"

namespace sieve::bench {
namespace {

using Clock = std::chrono::steady_clock;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Bytes of the last-level cache: the kernel's (sysfs, as lscpu reads it), else the C library's,
// else 32 MiB. (glibc's _SC_LEVEL3_CACHE_SIZE reads CPUID, which a VM may fill with the host's.)
int64_t last_level_cache_bytes() {
  int64_t best = 0;
  for (int i = 0; i < 8; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level(dir + "level"), size(dir + "size");
    int lv = 0;
    int64_t kb = 0;
    std::string unit;
    if (!(level >> lv) || !(size >> kb)) continue;
    size >> unit;
    const int64_t bytes = kb << (!unit.empty() && unit[0] == 'M' ? 20 : 10);  // e.g. 32768K
    if (lv >= 2) best = std::max(best, bytes);
  }
#ifdef _SC_LEVEL3_CACHE_SIZE
  if (best <= 0) best = int64_t(sysconf(_SC_LEVEL3_CACHE_SIZE));
#endif
  return best > 0 ? best : int64_t(32) << 20;
}

}  // namespace

Timing summarize(std::vector<double> ms, int calls_per_sample) {
  Timing t;
  if (ms.empty()) return t;
  std::sort(ms.begin(), ms.end());
  t.samples = int(ms.size());
  t.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  t.min_ms = ms.front();
  t.max_ms = ms.back();
  t.calls_per_sample = calls_per_sample;
  return t;
}

int host_threads() {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

void fill_host_random(void* p, DLDataType dt, int64_t n, uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t h = splitmix64(seed ^ splitmix64(uint64_t(i)));
    float s = 0.f;
    for (int k = 0; k < 4; ++k) s += float((h >> (16 * k)) & 0xffff) * (1.f / 65536.f) - 0.5f;
    store_float(p, dt, i, s * 1.7320508f);
  }
}

void run_cpu_case(benchmark::State& state, const Case& c, CaseResult& out, HostStreamProbe* probe) {
  out.c = c;
  const int32_t nq = n_new(c), np = kernels::ceil_div(c.ctx, c.page_size);
  const int64_t pages = int64_t(c.batch) * np;
  std::vector<int32_t> qo(size_t(c.batch) + 1), kvp(size_t(c.batch) + 1), last(size_t(c.batch)), idx(static_cast<size_t>(pages));
  for (int32_t b = 0; b <= c.batch; ++b) {
    qo[size_t(b)] = b * nq;
    kvp[size_t(b)] = b * np;
  }
  std::fill(last.begin(), last.end(), c.ctx - (np - 1) * c.page_size);
  std::iota(idx.begin(), idx.end(), 0);
  std::mt19937_64 rng(0x5eed + uint64_t(c.ctx));
  std::shuffle(idx.begin(), idx.end(), rng);
  const reference::SelectionRows rows = make_selection(c, 0x5e1 + uint64_t(c.sparsity * 1000));
  out.work = case_work(c, rows);
  // Copies of the pages, one page table each (copy r: page ids + r * pages).
  const double read = std::max(out.work.kv_bytes, 1.0);
  const int64_t copies = std::clamp<int64_t>(int64_t(std::ceil(3.0 * double(last_level_cache_bytes()) / read)), 1, 64);
  std::vector<std::vector<int32_t>> tables(size_t(copies), idx);
  for (int64_t r = 0; r < copies; ++r)
    for (int32_t& id : tables[size_t(r)]) id += int32_t(r * pages);

  int64_t kv_shape[4] = {pages * copies, c.hkv, c.page_size, c.d};
  const int64_t kv_numel = kv_shape[0] * kv_shape[1] * kv_shape[2] * kv_shape[3];
  PoolBuffer k_pool(size_t(kv_numel) * dtype_bytes(c.dtype)), v_pool(size_t(kv_numel) * dtype_bytes(c.dtype));
  HostTensor q({int64_t(c.batch) * nq, c.hq, c.d}, c.dtype), o({int64_t(c.batch) * nq, c.hq, c.d}, c.dtype);
  fill_host_random(k_pool.data(), c.dtype, kv_numel, 1);
  fill_host_random(v_pool.data(), c.dtype, kv_numel, 2);
  fill_host_random(q.dl().data, c.dtype, q.numel(), 3);
  int64_t qo_shape[1] = {c.batch + 1}, idx_shape[1] = {pages}, last_shape[1] = {c.batch};
  sieve_paged_kv kv{};
  kv.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
  kv.batch = c.batch;
  kv.page_size = c.page_size;
  kv.k_pages = make_view(k_pool.data(), kCpu, c.dtype, 4, kv_shape);
  kv.v_pages = make_view(v_pool.data(), kCpu, c.dtype, 4, kv_shape);
  kv.indptr = make_view(kvp.data(), kCpu, kI32, 1, qo_shape);
  kv.indices = make_view(idx.data(), kCpu, kI32, 1, idx_shape);
  kv.last_page_len = make_view(last.data(), kCpu, kI32, 1, last_shape);
  kv.indptr_host = kvp.data();
  kv.last_page_len_host = last.data();
  DLTensor qo_t = make_view(qo.data(), kCpu, kI32, 1, qo_shape);
  sieve_attention_args args =
      kernels::make_attention_args(c.phase, c.hq, c.hkv, c.d, &q.dl(), &o.dl(), &qo_t, qo.data(), &kv);
  std::vector<int32_t> sel_ip(1, 0), sel_ix;
  for (const auto& r : rows) {
    sel_ix.insert(sel_ix.end(), r.begin(), r.end());
    sel_ip.push_back(int32_t(sel_ix.size()));
  }
  sel_ix.push_back(0);  // never an empty tensor
  int64_t ip_shape[1] = {int64_t(sel_ip.size())}, ix_shape[1] = {int64_t(sel_ix.size())};
  sieve_selection sel{};
  if (!c.dense()) {
    sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    sel.kind = SIEVE_SEL_BLOCKS;
    sel.heads = SIEVE_SEL_PER_KV_HEAD;
    sel.q_block = c.prefill() ? c.q_block : 1;
    sel.k_block_pages = c.k_block_pages;
    sel.n_rows = int32_t(rows.size());
    sel.indptr = make_view(sel_ip.data(), kCpu, kI32, 1, ip_shape);
    sel.indices = make_view(sel_ix.data(), kCpu, kI32, 1, ix_shape);
    sel.capacity = ix_shape[0];
    args.selection = &sel;
  }

  int64_t call = 0;
  auto next_copy = [&] { kv.indices.data = tables[size_t(call++ % copies)].data(); };
  kernels::CpuAttentionOptions options;
  if (c.cpu_portable) options.isa = kernels::CpuIsa::kPortable;
  std::string err;
  next_copy();
  if (kernels::attend_cpu(args, options, &err) != SIEVE_OK) {  // warm-up (thread pool, scratch)
    out.error = err;
    state.SkipWithError(err.c_str());
    return;
  }
  std::vector<double> ms;
  if (c.prefill()) probe = nullptr;  // prefill's ceiling is sgemm's FLOP rate
  for (auto _ : state) {
    next_copy();
    if (probe) {  // copy, then read: the read also evicts the copy's dirty lines before the call
      out.adjacent.copy_gbs.push_back(probe->copy_gbs());
      out.adjacent.read_gbs.push_back(probe->read_gbs());
    }
    const auto t0 = Clock::now();
    const sieve_status st = kernels::attend_cpu(args, options, &err);
    const double t = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (st != SIEVE_OK) {
      out.error = err;
      state.SkipWithError(err.c_str());
      return;
    }
    ms.push_back(t);
    state.SetIterationTime(t * 1e-3);
  }
  int64_t bad = 0;
  for (int64_t i = 0; i < o.numel(); ++i) bad += !std::isfinite(o.get(i));
  if (bad) {
    out.error = std::to_string(bad) + " non-finite outputs";
    state.SkipWithError(out.error.c_str());
    return;
  }
  if (probe) out.adjacent.ms = ms;
  out.t = summarize(ms, 1);
  out.kernel = "cpu";
  out.ran = true;
  state.counters["GB/s"] = out.work.bytes() / (out.t.median_ms * 1e-3) / 1e9;
  state.counters["median_us"] = out.t.median_ms * 1e3;
}

}  // namespace sieve::bench
