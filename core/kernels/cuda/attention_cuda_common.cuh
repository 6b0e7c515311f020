// What the CUDA attention kernels share: the per-call parameter block, dtype conversion, the
// device-side error record, and the small index helpers (sequence of a query token, query-block
// offsets, page lookup). Internal to core/kernels/cuda.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "sieve/util/page_layout.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::kernels::cuda {

constexpr int kThreads = 128;  // every attention kernel runs 4-warp CTAs
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr float kNegInf = -__builtin_huge_valf();

// The element dtype of q / out is a runtime Storage (load_storage / store_storage, read once per
// tile); the pages' is a template argument (dispatch_cuda_storage in the launchers).

// Bad contents found on the device (the host cannot see device arrays without a sync). The first
// offender wins (atomicCAS on `code`); the kernels skip the bad entry and go on, so nothing reads
// out of bounds. cuda_attention_check_errors() reads and clears it.
enum ErrorCode : int {
  kErrNone = 0,
  kErrSelBlockRange = 1,    // a = row, b = entry, c = key block, d = key blocks of the sequence
  kErrSelNotIncreasing = 2, // a = row, b = entry, c = key block, d = the previous key block
  kErrSelIndptr = 3,        // a = row, b = begin, c = end, d = capacity
  kErrPageId = 4,           // a = sequence, b = logical page, c = physical id, d = pool pages
  kErrPageSlot = 5,         // a = sequence, b = logical page, c = slot in kv.indices, d = its length
  kErrQRow = 6,             // a = q_rows entry, b = token, c = n_q_tokens
  kErrVariantRow = 7,       // a = variant row, b = first span, c = end span, d = n_spans
  kErrVariantSpan = 8,      // a = variant row, b = span, c = begin, d = end
  kErrPackedKey = 9,        // a = variant row, b = packed key, c = its position / count, d = kv_len
};
struct ErrorRecord {
  int code;
  int pad;
  long long a, b, c, d;
};

static __device__ __noinline__ void record_error(ErrorRecord* e, int code, long long a, long long b, long long c,
                                    long long d) {
  if (atomicCAS(&e->code, 0, code) == 0) {
    e->a = a;
    e->b = b;
    e->c = c;
    e->d = d;
  }
}

// Everything a kernel reads about one call. Built on the host from sieve_attention_args.
struct AttnParams {
  // queries and outputs (compact row-major [n_q_tokens, hq, d])
  const void* q;
  Storage q_dt;
  void* out;
  Storage out_dt;
  float* lse;      // optional, natural log
  float* lse_all;  // scratch lse for the statistics pass when the caller passed no lse, else null
  const int32_t* qo_indptr;  // [batch + 1]
  const int32_t* q_rows;     // null: work row r is token r
  int32_t token_is_sequence; // 1: sequence b holds query token b alone (decode), no search
  int32_t n_work;            // work rows: q_rows entries or n_q_tokens
  int32_t n_q_tokens;
  int32_t batch;
  // pages: row (physical page, KV head, token) of K / V at k / v + pages.row(...), head_dim
  // contiguous (compact HND, NHD or a combined pool: sieve/util/page_layout.hpp)
  const void* k;
  const void* v;
  PageStrides pages;
  const int32_t* kv_indptr;
  const int32_t* kv_indices;
  const int32_t* kv_last;
  int64_t kv_indices_len;
  int64_t page_capacity;
  int32_t page_size;
  int32_t page_shift;  // log2(page_size) when a power of two, else -1
  int32_t hq, hkv, group, d;
  float scale_log2;  // logit scale * log2(e): scores live in the log2 domain
  // selection (sel_heads < 0: dense)
  int32_t sel_heads;
  int32_t sel_h;
  int32_t q_block;
  int32_t k_block_pages;
  const int32_t* sel_indptr;
  const int32_t* sel_indices;
  int64_t sel_capacity;
  // head units: unit u = (KV head u / chunks, chunk u % chunks) covers query heads
  // [kvh * group + chunk * hg, + min(hg, group - chunk * hg)); all of them read one selection row.
  int32_t hg;
  int32_t chunks;
  // split-KV (row kernel): partial outputs [n_splits, n_work, hq, d] and lse [n_splits, n_work, hq]
  int32_t n_splits;
  // Tensor-core row kernel: a (row, head unit) whose key list is shorter than n_splits *
  // split_min_keys uses only ceil(keys / split_min_keys) of the splits (at least one), so a sparse
  // selection is not spread thinner than this; 0 = always n_splits.
  int32_t split_min_keys;
  float* part_o;
  float* part_lse;
  // With split_min_keys and n_splits > 1: the splits each (row, head unit) used,
  // [n_work, hkv * chunks], written by its split 0. The combine merges only those; a row that used
  // one split was written (out, lse) by the row kernel itself and the combine leaves it alone.
  int32_t* split_used;
  // page statistics
  int32_t stats_h;  // page_mass columns: hkv or 1
  float* page_mass;
  // Tensor-core row kernel, when statistics are asked for: it also writes every computed
  // log2-domain logit here, so the statistics need no second pass over K. Per sequence b, head-major:
  // logits[(kv_indptr[b] * page_size) * hq + h * (n_pages_b * page_size) + position] (one query per
  // sequence: decode). Null: not written (the FMA row kernel; statistics from K, attention_stats.cu).
  float* logits;
  ErrorRecord* err;
  // attention variant (sieve_attention_variant; var_h == 0: none): rows (var_heads, var_q_block)
  // attend spans {kind, begin, end} of `spans`, PACKED ones over packed_pos / _count / _bias
  Storage kv_dt;  // the pages' storage (the FMA variant kernel loads it at run time)
  int32_t var_heads;
  int32_t var_h;
  int32_t var_q_block;
  const int32_t* row_spans;     // [n_rows][2]
  const int32_t* spans;         // [n_spans][3]
  int32_t n_spans;
  const int32_t* packed_pos;    // [n_packed]
  const int32_t* packed_count;  // null: counts 1
  const float* packed_bias;     // null: 0
  int32_t n_packed;
};

// ---- dtype conversion ------------------------------------------------------------------------

// 16 bytes of storage elements -> f32.
template <class T>
struct Vec16;
template <>
struct Vec16<float> {
  static constexpr int N = 4;
  __device__ static void to_float(const uint4& r, float* f) {
    f[0] = __uint_as_float(r.x);
    f[1] = __uint_as_float(r.y);
    f[2] = __uint_as_float(r.z);
    f[3] = __uint_as_float(r.w);
  }
};
template <>
struct Vec16<__half> {
  static constexpr int N = 8;
  __device__ static void to_float(const uint4& r, float* f) {
    const __half2* h = reinterpret_cast<const __half2*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 x = __half22float2(h[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
};
template <>
struct Vec16<__nv_bfloat16> {
  static constexpr int N = 8;
  __device__ static void to_float(const uint4& r, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&r);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float2 x = __bfloat1622float2(h[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
};

// ---- index helpers ---------------------------------------------------------------------------

__device__ inline int32_t ceil_div_d(int32_t a, int32_t b) { return (a + b - 1) / b; }

// First index in [lo, hi) where `pred` is false, for a predicate that is true on a prefix and
// false after it. Every lane of a warp calls it with the same arguments: each round the 32 lanes
// probe 32 evenly spaced entries at once, so a list of n entries costs ~log32(n) dependent loads
// instead of log2(n) (a dependent global load is ~0.5 us: the per-CTA setup of short decode
// splits is made of such chains).
template <class Pred>
__device__ inline int32_t warp_partition_point(int32_t lo, int32_t hi, Pred pred) {
  const int lane = threadIdx.x & 31;
  while (hi - lo > 32) {
    const int32_t step = (hi - lo + 31) / 32;
    const int32_t i = lo + lane * step;
    const int n = __popc(__ballot_sync(0xffffffffu, i < hi && pred(i)));
    if (n == 0) return lo;
    const int32_t next_hi = min(hi, lo + n * step);  // probe n is false (or past the end)
    lo += (n - 1) * step + 1;                        // probe n - 1 is true
    hi = next_hi;
  }
  const int32_t i = lo + lane;
  return lo + __popc(__ballot_sync(0xffffffffu, i < hi && pred(i)));
}

// The sequence holding query token `tok`: the last b with qo[b] <= tok (empty sequences share
// their qo value with the next one, so the last such b is the one whose range contains tok).
// Warp-uniform (warp_partition_point).
__device__ inline int32_t sequence_of(const int32_t* qo, int32_t batch, int32_t tok) {
  return warp_partition_point(1, batch, [&](int32_t b) { return __ldg(qo + b) <= tok; }) - 1;
}

// C_b: query blocks of the sequences before b. Every warp computes it for itself (lane-strided
// sum + shuffle reduction), so no barrier is needed; only prefill selections with q_block > 1 ask.
__device__ inline int64_t query_block_offset(const int32_t* qo, int32_t b, int32_t q_block) {
  const int lane = threadIdx.x & 31;
  int64_t s = 0;
  for (int32_t i = lane; i < b; i += 32)
    s += ceil_div_d(__ldg(qo + i + 1) - __ldg(qo + i), q_block);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// The query heads of head unit `unit` (AttnParams::hg / chunks): [h0, h0 + nh) of KV head kvh.
struct HeadUnit {
  int32_t kvh, h0, nh;
};
__device__ inline HeadUnit head_unit(const AttnParams& p, int32_t unit) {
  const int32_t chunk = unit % p.chunks;
  return {unit / p.chunks, (unit / p.chunks) * p.group + chunk * p.hg, min(p.hg, p.group - chunk * p.hg)};
}

// The query token of row r of a row-kernel grid: q_rows[r] when q_rows is given. False when that
// entry is out of range; `report` picks the one CTA that records it (kErrQRow).
__device__ inline bool row_token(const AttnParams& p, int32_t r, bool report, int32_t* tok) {
  *tok = r;
  if (!p.q_rows) return true;
  *tok = __ldg(p.q_rows + r);
  if (*tok >= 0 && *tok < p.n_q_tokens) return true;
  if (report) record_error(p.err, kErrQRow, r, *tok, p.n_q_tokens, 0);
  return false;
}

// The query blocks of sequence b in a prefill grid: its first query token, query count, tokens
// per selection query block (all of them when dense) and CTA tiles per block.
struct PrefillBlocks {
  int32_t qo0, n_q, qb, tiles_per_block;
};
__device__ inline PrefillBlocks prefill_blocks(const AttnParams& p, int32_t b, int32_t tile_tokens) {
  PrefillBlocks r;
  r.qo0 = __ldg(p.qo_indptr + b);
  r.n_q = __ldg(p.qo_indptr + b + 1) - r.qo0;
  r.qb = p.sel_heads < 0 ? max(r.n_q, 1) : p.q_block;
  r.tiles_per_block = ceil_div_d(r.qb, tile_tokens);
  return r;
}

// Everything about the sequence of one query token.
struct QueryToken {
  int32_t tok;       // token index in q / out
  int32_t b;         // sequence
  int32_t local;     // index among the sequence's query tokens
  int32_t kv_len;    // resident keys
  int32_t n_pages;
  int32_t page_base; // kv_indptr[b]
  int32_t limit;     // keys [0, limit) are visible (causal)
};

// Warp-uniform: every lane of the calling warp passes the same token.
__device__ inline QueryToken query_token(const AttnParams& p, int32_t tok) {
  QueryToken t;
  t.tok = tok;
  t.b = p.token_is_sequence ? tok : sequence_of(p.qo_indptr, p.batch, tok);
  const int32_t q0 = __ldg(p.qo_indptr + t.b), q1 = __ldg(p.qo_indptr + t.b + 1);
  t.local = tok - q0;
  t.page_base = __ldg(p.kv_indptr + t.b);
  t.n_pages = __ldg(p.kv_indptr + t.b + 1) - t.page_base;
  t.kv_len = t.n_pages > 0 ? (t.n_pages - 1) * p.page_size + __ldg(p.kv_last + t.b) : 0;
  t.limit = t.kv_len - (q1 - q0) + t.local + 1;
  if (t.limit > t.kv_len) t.limit = t.kv_len;
  return t;
}

// Physical page of logical page `page` of a sequence, or -1 (recorded) when the page table is bad.
__device__ inline int32_t physical_page(const AttnParams& p, int32_t b, int32_t page_base,
                                        int32_t page) {
  const int64_t slot = int64_t(page_base) + page;
  if (slot < 0 || slot >= p.kv_indices_len) {
    record_error(p.err, kErrPageSlot, b, page, slot, p.kv_indices_len);
    return -1;
  }
  const int32_t id = __ldg(p.kv_indices + slot);
  if (id < 0 || id >= p.page_capacity) {
    record_error(p.err, kErrPageId, b, page, id, p.page_capacity);
    return -1;
  }
  return id;
}

// Row range [begin, end) of selection row `row` in selection.indices, empty (recorded) when bad.
__device__ inline void check_row_range(const AttnParams& p, int64_t row, int32_t& begin, int32_t& end) {
  if (begin < 0 || end < begin || end > p.sel_capacity) {
    record_error(p.err, kErrSelIndptr, row, begin, end, p.sel_capacity);
    begin = end = 0;
  }
}
__device__ inline void selection_row_range(const AttnParams& p, int64_t row, int32_t& begin,
                                           int32_t& end) {
  begin = __ldg(p.sel_indptr + row);
  end = __ldg(p.sel_indptr + row + 1);
  check_row_range(p, row, begin, end);
}

// Key block of entry e of a row, or -1 (recorded) when out of range or not increasing.
__device__ inline int32_t selected_block(const AttnParams& p, int64_t row, int32_t begin, int32_t e,
                                         int32_t n_blocks) {
  const int32_t j = __ldg(p.sel_indices + e);
  if (j < 0 || j >= n_blocks) {
    record_error(p.err, kErrSelBlockRange, row, e, j, n_blocks);
    return -1;
  }
  if (e > begin) {
    const int32_t prev = __ldg(p.sel_indices + e - 1);
    if (prev >= j) {
      record_error(p.err, kErrSelNotIncreasing, row, e, j, prev);
      return -1;
    }
  }
  return j;
}

// Query-block row index C_b + t of query token t (rows = this * sel_h + row head). Call it from
// every thread of a warp: with q_block > 1 it reduces across the warp.
__device__ inline int64_t query_row(const AttnParams& p, const QueryToken& t) {
  if (p.q_block == 1) return t.tok;  // C_b = qo[b] when every query token is its own block
  return query_block_offset(p.qo_indptr, t.b, p.q_block) + t.local / p.q_block;
}

// Row head a query head reads: 0, its KV head or itself.
__device__ inline int32_t row_head(const AttnParams& p, int32_t q_head) {
  return p.sel_heads == 0 ? 0 : p.sel_heads == 1 ? q_head / p.group : q_head;
}

// Bytes of dynamic shared memory for `floats` floats of runtime-sized arrays, padded: ptxas may
// merge the scalar loads of a loop's remainder into one wider load that reads up to 3 floats past
// the last element (compute-sanitizer memcheck caught this on split_combine_kernel), so every
// runtime-sized shared array keeps 16 spare bytes behind it.
constexpr size_t padded_smem_floats(size_t floats) { return ((floats + 3) / 4 + 1) * 4 * sizeof(float); }

// Raises a kernel's dynamic shared-memory limit once per device (a launch inside CUDA-graph
// capture then makes no attribute call at all).
template <class Kernel>
inline cudaError_t allow_dynamic_smem(Kernel kernel, size_t bytes, unsigned long long& done_mask) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = dev < 64 ? 1ull << dev : 0;
  if (bit && (__atomic_load_n(&done_mask, __ATOMIC_ACQUIRE) & bit)) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
  if (e == cudaSuccess && bit) __atomic_fetch_or(&done_mask, bit, __ATOMIC_ACQ_REL);
  return e;
}

// ---- programmatic dependent launch (sm_90) --------------------------------------------------
// A kernel launched with the programmatic-serialization attribute may start once every CTA of the
// kernel before it called pdl_launch_dependents() (or exited); it must pdl_wait() before reading
// what that kernel wrote (the wait returns when it has completed and its writes are visible).
// Both are no-ops without such a launch, and on older devices.
__device__ inline void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ inline void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// ---- launchers (one per kernel family, dispatching on storage dtype, head dim, heads/CTA) -----

// Row kernel: one CTA per (work row, head unit, KV split); decode, and prefill rows listed in
// q_rows. `kv_dt` is the storage dtype; p.hg must not exceed row_heads_per_cta(kv_dt, d).
cudaError_t launch_row_attention(const AttnParams& p, Storage kv_dt, cudaStream_t stream);
// Split-KV merge of the row kernel's partial states.
cudaError_t launch_split_combine(const AttnParams& p, cudaStream_t stream);
// Tiled causal prefill over every query token: grid (tiles, head units, batch).
cudaError_t launch_prefill_attention(const AttnParams& p, Storage kv_dt, int32_t max_tiles,
                                     int32_t tile_tokens, cudaStream_t stream);
// Tensor-core variants (attention_decode_mma.cu, attention_prefill_mma.cu) for q and K/V of one
// 16-bit dtype, head_dim 64 or 128: the row kernel with up to kMmaRowHeads heads per CTA, and the
// prefill kernel with tile_tokens * hg <= kMmaPrefillRows rows per CTA.
constexpr int kMmaRowHeads = 16;
constexpr int kMmaPrefillRows = 128;
cudaError_t launch_row_attention_mma(const AttnParams& p, Storage kv_dt, cudaStream_t stream);
cudaError_t launch_prefill_attention_mma(const AttnParams& p, Storage kv_dt, int32_t max_tiles,
                                         int32_t tile_tokens, cudaStream_t stream);
// Attention variants (attention_variant.cu, attention_variant_mma.cu): grid (query tiles of one
// row block, head units, batch). The FMA kernel takes any head_dim up to kMaxVariantHeadDim and
// one query head per CTA (p.hg == 1); the tensor-core one q and K/V of one 16-bit dtype with
// head_dim 64 or 128, tile_tokens * hg <= kMmaPrefillRows.
constexpr int kMaxVariantHeadDim = 256;
constexpr int kVariantRows = 32;  // query tokens per CTA of the FMA variant kernel
cudaError_t launch_variant_attention(const AttnParams& p, int32_t max_tiles, cudaStream_t stream);
cudaError_t launch_variant_attention_mma(const AttnParams& p, Storage kv_dt, int32_t max_tiles,
                                         int32_t tile_tokens, cudaStream_t stream);
// Page statistics (decode) from the final lse: grid (max pages, work rows).
cudaError_t launch_page_mass(const AttnParams& p, Storage kv_dt, int32_t max_pages,
                             cudaStream_t stream);
// The same statistics from p.logits (written by the tensor-core row kernel in the attention pass)
// and the final lse: reads 4 bytes per (token, head) instead of the K cache.
cudaError_t launch_page_mass_from_logits(const AttnParams& p, int32_t max_pages, cudaStream_t stream);

// Heads per CTA the row kernel is compiled for; a GQA group larger than this is chunked. Queries
// and accumulators of every head live in registers: 8 heads of 16-bit storage at head_dim >= 64
// need ~230 registers (2 CTAs per SM), so those take 4 (~170) and a group of 8 runs as two CTAs
// whose K/V reads meet in L2 (they are neighbours in the grid).
constexpr int kMaxHeadsPerCta = 8;
inline int row_heads_per_cta(Storage kv_dt, int d) { return kv_dt != Storage::f32 && d >= 64 ? 4 : 8; }

}  // namespace sieve::kernels::cuda
