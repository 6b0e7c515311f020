// Binding one call's arguments and cutting it into work items (see call.hpp).
#include <algorithm>

#include "call.hpp"
#include "decode_rows.hpp"
#include "prefill_rows.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kernels::cpu {
namespace {

constexpr int kMinPagesPerSplit = 8;
constexpr int kMaxSplits = 64;

// The instruction sets `allowed` (validated as available) lets a call use.
struct IsaSet {
  bool avx512_bf16, avx512, avx2;
};
IsaSet isa_set(CpuIsa allowed) {
  auto permits = [&](CpuIsa isa) {
    return allowed == isa || (allowed == CpuIsa::kAuto && cpu_isa_available(isa));
  };
  IsaSet s;
  s.avx512_bf16 = permits(CpuIsa::kAvx512Bf16);
  s.avx512 = s.avx512_bf16 || permits(CpuIsa::kAvx512);
  s.avx2 = s.avx512 || permits(CpuIsa::kAvx2);
  return s;
}

// The decode kernel for `allowed` and the call: the widest allowed that takes its dtypes and
// whose vector width divides its head dim.
CpuIsa decode_isa(CpuIsa allowed, const AttentionShape& s, DLDataType q_dt, DLDataType kv_dt) {
  const IsaSet set = isa_set(allowed);
  const bool all_bf16 = q_dt.code == kDLBfloat && kv_dt.code == kDLBfloat;
  if (set.avx512_bf16 && all_bf16 && s.d % 32 == 0) return CpuIsa::kAvx512Bf16;
  if (set.avx512 && s.d % 16 == 0) return CpuIsa::kAvx512;
  if (set.avx2 && s.d % 8 == 0) return CpuIsa::kAvx2;
  return CpuIsa::kPortable;
}

// The prefill kernel likewise (f32 products whatever the storage: no bf16-dot variant).
CpuIsa prefill_isa(CpuIsa allowed, const AttentionShape& s) {
  const IsaSet set = isa_set(allowed);
  if (set.avx512 && s.d % 16 == 0) return CpuIsa::kAvx512;
  if (set.avx2 && s.d % 8 == 0) return CpuIsa::kAvx2;
  return CpuIsa::kPortable;
}

}  // namespace

Scratch& Scratch::for_call(const Call& c) {
  static thread_local Scratch w;
  const size_t rows = size_t(c.tile_rows), d = size_t(c.s.d);
  const size_t keys = size_t(c.pages_per_tile) * size_t(c.s.page_size);
  const size_t keys_padded = (keys + kPrefillKeyAlign - 1) / kPrefillKeyAlign * kPrefillKeyAlign;
  grow(w.qf, rows * d);
  grow(w.acc, rows * d);
  grow(w.m, rows);
  grow(w.l, rows);
  grow(w.lim, rows);
  grow(w.qpos, rows);
  grow(w.s, rows * keys_padded);
  grow(w.kf, keys_padded * d);
  grow(w.vf, keys * d);
  grow(w.kpos, keys);
  grow(w.row, d);
  grow(w.pages, size_t(std::max(c.max_pages, 1)));
  if (c.page_mass) grow(w.pmax, size_t(std::max(c.max_pages, 1)) * size_t(c.s.page_size));
  if (c.decode_isa != CpuIsa::kPortable) {
    grow(w.slabs, size_t(std::max(c.max_pages, 1)));
    grow(w.page_tokens, size_t(std::max(c.max_pages, 1)));
    grow(w.simd, size_t(decode_scratch_floats(c.tile_rows)) + 16);
  }
  if (c.prefill_isa != CpuIsa::kPortable) {
    grow(w.kt, keys_padded * d);
    grow(w.alpha, rows);
  }
  return w;
}

// Points the call at the arguments' memory and sizes its tiles.
void bind(const sieve_attention_args& a, const CpuAttentionOptions& opt, CallBuffers& buf,
          Call& c) {
  const sieve_paged_kv& kv = *a.kv;
  c.s = attention_shape(a);
  const AttentionShape& s = c.s;
  c.q = data_ptr<const void>(*a.q);
  c.q_dt = a.q->dtype;
  c.out = data_ptr<void>(*a.out);
  c.out_dt = a.out->dtype;
  c.k = data_ptr<const void>(kv.k_pages);
  c.v = data_ptr<const void>(kv.v_pages);
  c.kv_dt = kv.k_pages.dtype;
  c.qo = a.qo_indptr_host;
  c.kv_indptr = kv.indptr_host;
  c.kv_last = kv.last_page_len_host;
  c.kv_ids = data_ptr<const int32_t>(kv.indices);
  c.lse = a.lse ? data_ptr<float>(*a.lse) : nullptr;
  if (!s.dense) {
    c.sel_indptr = data_ptr<const int32_t>(a.selection->indptr);
    c.sel_ids = data_ptr<const int32_t>(a.selection->indices);
    buf.c_b.resize(size_t(s.batch) + 1);
    query_block_offsets(c.qo, s.batch, s.q_block, buf.c_b.data());
    c.c_b = buf.c_b.data();
  }
  if (a.q_rows) {
    buf.mask.assign(size_t(s.n_q_tokens), 0);
    const int32_t* rows = data_ptr<const int32_t>(*a.q_rows);
    for (int64_t i = 0; i < s.q_rows; ++i) buf.mask[size_t(rows[i])] = 1;
    c.row_mask = buf.mask.data();
  }
  if (s.stats != SIEVE_STATS_NONE) {
    c.page_mass = data_ptr<float>(*a.page_mass);
    buf.lse_all.assign(size_t(s.n_q_tokens) * s.hq, kNegInf);
    c.lse_all = buf.lse_all.data();
  }
  for (int32_t b = 0; b < s.batch; ++b) c.max_pages = std::max(c.max_pages, c.pages(b));

  const int nh = !s.dense && s.sel_heads == SIEVE_SEL_PER_Q_HEAD ? 1 : s.group;
  c.decode_isa = s.prefill ? CpuIsa::kPortable : decode_isa(opt.isa, s, c.q_dt, c.kv_dt);
  c.prefill_isa = s.prefill ? prefill_isa(opt.isa, s) : CpuIsa::kPortable;
  c.gemm = opt.use_blas && s.prefill && c.prefill_isa == CpuIsa::kPortable &&
           s.d >= kBlasMinHeadDim;
  c.prefetch = opt.prefetch;
  c.pages_per_tile = s.prefill ? std::max(1, kTileKeys / s.page_size) : 1;
  const int64_t tile_keys = int64_t(c.pages_per_tile) * s.page_size;
  // The SIMD kernel's tile is bounded by L2 (its scores, keys, values and accumulators), the
  // loops' and BLAS's by kGemmMaxWork.
  const int rows_cap =
      c.prefill_isa != CpuIsa::kPortable
          ? kSimdTileRows
          : int(std::clamp<int64_t>(kGemmMaxWork / (tile_keys * s.d), kBlasMinRows, kMaxTileRows));
  c.tile_rows = (s.prefill ? std::max(1, rows_cap / nh) : 1) * nh;
}

void plan(Call& c, const CpuAttentionOptions& opt, int threads, CallBuffers& buf) {
  const AttentionShape& s = c.s;
  const int nh = !s.dense && s.sel_heads == SIEVE_SEL_PER_Q_HEAD ? 1 : s.group;
  const int32_t tok_cap = c.tile_rows / nh;
  buf.tokens.clear();
  buf.units.clear();
  for (int32_t b = 0; b < s.batch; ++b) {
    const int32_t n_b = c.qo[b + 1] - c.qo[b];
    const int32_t qb = s.dense ? std::max(n_b, 1) : s.q_block;  // dense: one block per sequence
    for (int32_t t = 0; t < query_blocks(n_b, qb); ++t) {
      auto close_chunk = [&](int32_t begin) {
        const int32_t count = int32_t(buf.tokens.size()) - begin;
        if (count == 0) return;
        for (int32_t g = 0; g < s.hkv; ++g)
          for (int32_t h0 = g * s.group; h0 < (g + 1) * s.group; h0 += nh)
            buf.units.push_back(Item{b, g, h0, nh, s.dense ? 0 : t, begin, count, 0,
                                     int32_t(buf.units.size())});
      };
      int32_t chunk_begin = int32_t(buf.tokens.size());
      for (int32_t i = t * qb; i < std::min((t + 1) * qb, n_b); ++i) {
        const int32_t token = c.qo[b] + i;
        if (c.row_mask && !c.row_mask[token]) continue;
        buf.tokens.push_back(token);
        if (int32_t(buf.tokens.size()) - chunk_begin == tok_cap) {
          close_chunk(chunk_begin);
          chunk_begin = int32_t(buf.tokens.size());
        }
      }
      close_chunk(chunk_begin);
    }
  }

  // Decode with fewer units than threads: split each unit's pages so every thread has work.
  const int64_t n_units = int64_t(buf.units.size());
  c.n_splits = 1;
  if (!s.prefill && n_units > 0) {
    if (opt.kv_splits > 0) {
      c.n_splits = std::min(opt.kv_splits, kMaxSplits);
    } else if (n_units < threads) {
      const int64_t want = (2 * int64_t(threads) + n_units - 1) / n_units;
      c.n_splits = int(std::clamp<int64_t>(std::min<int64_t>(want, c.max_pages / kMinPagesPerSplit),
                                           1, kMaxSplits));
    }
  }
  buf.items.clear();
  for (const Item& u : buf.units)
    for (int32_t sp = 0; sp < c.n_splits; ++sp) {
      buf.items.push_back(u);
      buf.items.back().split = sp;
    }
  if (c.n_splits > 1) {
    buf.partials.resize(size_t(n_units) * size_t(c.n_splits) * size_t(c.partial_floats(nh)));
    c.partials = buf.partials.data();
  }
}

// Runs body(i, scratch) for i < n over `threads` OpenMP threads; false if scratch ran out of

}  // namespace sieve::kernels::cpu
