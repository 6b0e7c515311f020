// CPU paged attention: online softmax (flash-style) with f32 accumulation over K/V pages.
//
// Work is split into items of (sequence, KV head, head bundle, query tile[, KV split]) and run
// with OpenMP. A head bundle is every query head that reads one selection row through one KV head
// (the whole GQA group, or a single head for PER_Q_HEAD selections), so each K/V page is loaded
// and converted to f32 once for all of the bundle's heads (tile.cpp). Decode with fewer items
// than threads splits each sequence's pages into chunks and merges the partial softmax states by
// their log-sum-exp. Page statistics (decode) are a second sweep over the attended pages with the
// final lse (page_stats.cpp). This file: the checks, and the parallel run of the stages.
#include "sieve/kernels/attention_cpu.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

#include <algorithm>
#include <atomic>
#include <new>
#include <string>

#include "attention_variant_cpu.hpp"
#include "call.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kernels {
namespace {

using cpu::Call;
using cpu::CallBuffers;
using cpu::Item;
using cpu::Scratch;
using cpu::bind;
using cpu::merge_unit;
using cpu::page_mass_sweep;
using cpu::plan;
using cpu::run_item;

sieve_status fail(std::string* error, sieve_status st, std::string msg) {
  if (error) *error = std::move(msg);
  return st;
}

// Everything attend_cpu refuses, with the status it returns.
sieve_status validate(const sieve_attention_args& a, std::string* error) {
  if (std::string e = check_attention_args(a); !e.empty())
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT, e);
  if (std::string e = unsupported_attention_request(a); !e.empty())
    return fail(error, SIEVE_ERR_UNSUPPORTED, e);
  if (a.q->device.device_type != kDLCPU)
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT,
                "q: on " + device_name(a.q->device) +
                    ", but the CPU kernel needs every tensor in host memory (kDLCPU)");
  if (std::string e = check_page_table_contents(a, data_ptr<const int32_t>(a.kv->indices));
      !e.empty())
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT, e);
  if (a.selection && a.selection->kind == SIEVE_SEL_BLOCKS) {
    if (std::string e = check_selection_contents(a, data_ptr<const int32_t>(a.selection->indptr),
                                                 data_ptr<const int32_t>(a.selection->indices));
        !e.empty())
      return fail(error, SIEVE_ERR_INVALID_ARGUMENT, e);
  }
  // q_rows in host memory was range-checked by check_attention_args.
  return SIEVE_OK;
}

sieve_status check_isa(CpuIsa isa, std::string* error) {
  if (cpu_isa_available(isa)) return SIEVE_OK;
  return fail(error, SIEVE_ERR_UNSUPPORTED,
              std::string("options.isa: this CPU (or build) has no ") +
                  (isa == CpuIsa::kAvx512Bf16 ? "AVX-512F/BW/BF16 with FMA and F16C"
                   : isa == CpuIsa::kAvx512   ? "AVX-512F/BW with FMA and F16C"
                                              : "AVX2 with FMA and F16C"));
}

// Runs body(i, scratch) for i < n over `threads` OpenMP threads; false if scratch ran out of
// memory (nothing may throw out of a parallel region).
template <class Body>
bool parallel_for(int64_t n, int threads, const Call& c, Body body) {
  std::atomic<bool> ok{true};
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t i = 0; i < n; ++i) {
    try {
      body(i, Scratch::for_call(c));
    } catch (const std::bad_alloc&) {
      ok = false;
    }
  }
  return ok;
}

sieve_status run(const sieve_attention_args& a, const CpuAttentionOptions& opt,
                 std::string* error) {
  if (sieve_status st = validate(a, error); st != SIEVE_OK) return st;
  if (sieve_status st = check_isa(opt.isa, error); st != SIEVE_OK) return st;
#ifdef _OPENMP
  int threads = opt.threads > 0 ? opt.threads : omp_get_max_threads();
  if (opt.threads <= 0) {
    // Small calls (a small model's decode step) run on the calling thread: waking an OpenMP team
    // costs more than the work, and far more when the cores are busy (measured: 44 vs 3400
    // tokens/s for the 5-layer stories260K decode on a loaded 2-core machine).
    const AttentionShape s = attention_shape(a);
    const int64_t per_query = s.nnz_pages * int64_t(s.page_size) * s.d * s.group / std::max(1, s.batch);
    const int64_t work = per_query * int64_t(s.n_q_tokens) * s.hkv;  // ~ multiply-adds of Q K^T
    if (work < (int64_t(1) << 20)) threads = 1;
  }
#else
  const int threads = 1;
#endif
  if (attention_variant(a)) return attend_variant_cpu(a, threads, error);
  static thread_local CallBuffers buf;
  Call c;
  bind(a, opt, buf, c);
  plan(c, opt, threads, buf);

  // `buf` is thread_local: the workers get plain pointers to the calling thread's copy.
  const int32_t* tokens = buf.tokens.data();
  const Item* items = buf.items.data();
  const Item* units = buf.units.data();
  bool ok = parallel_for(int64_t(buf.items.size()), threads, c, [&](int64_t i, Scratch& w) {
    run_item(c, items[i], tokens, w);
  });
  if (ok && c.n_splits > 1)
    ok = parallel_for(int64_t(buf.units.size()), threads, c, [&](int64_t i, Scratch& w) {
      merge_unit(c, units[i], tokens, w);
    });
  if (ok && c.page_mass) {
    // Items (sequence, KV head column, run of pages): a batch of one still uses every thread
    // (the sweep exps every visible key for every head: as costly as the attention itself).
    const AttentionShape& s = c.s;
    const bool per_kv = s.stats == SIEVE_STATS_PAGE_MASS_PER_KV_HEAD;
    const int64_t columns = int64_t(s.batch) * (per_kv ? s.hkv : 1);
    const int32_t runs = int32_t(std::clamp<int64_t>((2 * threads + columns - 1) / columns, 1, 64));
    ok = parallel_for(columns * runs, threads, c, [&](int64_t i, Scratch& w) {
      const int64_t col = i / runs;
      const int32_t b = int32_t(per_kv ? col / s.hkv : col), g = per_kv ? int32_t(col % s.hkv) : 0;
      const int32_t r = int32_t(i % runs), pages = c.pages(b), per = (pages + runs - 1) / runs;
      page_mass_sweep(c, b, per_kv ? g : 0, per_kv ? g + 1 : s.hkv, per_kv ? g : 0, r * per,
                      std::min(pages, (r + 1) * per), w);
    });
  }
  if (!ok) return fail(error, SIEVE_ERR_OUT_OF_MEMORY, "attend_cpu: out of host memory for scratch");
  return SIEVE_OK;
}

}  // namespace

bool cpu_isa_available(CpuIsa isa) {
#ifdef SIEVE_X86_DECODE
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                           __builtin_cpu_supports("f16c");
  static const bool avx512 =
      avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  static const bool avx512_bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
  if (isa == CpuIsa::kAvx512Bf16) return avx512_bf16;
  if (isa == CpuIsa::kAvx2) return avx2;
  if (isa == CpuIsa::kAvx512) return avx512;
#else
  if (isa == CpuIsa::kAvx2 || isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Bf16) return false;
#endif
  return true;
}

sieve_status attend_cpu(const sieve_attention_args& args, const CpuAttentionOptions& options,
                        std::string* error) {
  try {
    return run(args, options, error);
  } catch (const std::bad_alloc&) {
    return fail(error, SIEVE_ERR_OUT_OF_MEMORY, "attend_cpu: out of host memory");
  } catch (const std::exception& e) {
    return fail(error, SIEVE_ERR_INTERNAL, std::string("attend_cpu: ") + e.what());
  }
}

sieve_status attend_cpu(const sieve_attention_args& args, std::string* error) {
  return attend_cpu(args, CpuAttentionOptions{}, error);
}

}  // namespace sieve::kernels
