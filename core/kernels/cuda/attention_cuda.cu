// attend_cuda: the host side of the CUDA attention kernels. Checks the arguments (shared
// check_attention_args), plans the launch, and enqueues on the caller's stream without ever
// synchronising:
//   - decode, and prefill restricted to q_rows: a row kernel, one CTA per (query row, head unit,
//     KV split), then the split-KV combine when split: on tensor cores (attention_decode_mma.cu)
//     when q and K/V share a 16-bit dtype and head_dim is 64 or 128, else with f32 FMA
//     (attention_row.cu);
//   - prefill over every query token: a tiled kernel, on tensor cores (attention_prefill_mma.cu)
//     under the same conditions, else FMA (attention_prefill.cu);
//   - an attention variant (sieve_attention_variant): its own kernel over the variant rows' spans,
//     on tensor cores (attention_variant_mma.cu) under the same conditions, else FMA
//     (attention_variant.cu);
//   - page statistics (decode): page_mass zeroed, then a reduction with the final lse
//     (attention_stats.cu): on the tensor-core path over the logits the row kernel stored in its
//     attention pass (no second read of K), else a second pass recomputing q·k from K.
// Per device, once: the SM count (split heuristic), a private stream-ordered memory pool for the
// per-call scratch (split partials, the lse the statistics need when the caller passed none), and
// the device-side error record (a __device__ variable, so no allocation and zero at module load).
// Scratch comes from cudaMallocFromPoolAsync / cudaFreeAsync on the caller's stream: stream
// ordered, never synchronising, safe with concurrent streams and capturable in a CUDA graph; the
// pool keeps its memory (release threshold = max), so steady state asks the driver for nothing.
#include <algorithm>
#include <array>
#include <cstdint>
#include <mutex>

#include "attention_cuda_common.cuh"
#include "attention_variant.cuh"
#if SIEVE_CUDA_HOPPER
#include "hopper/prefill_wgmma.hpp"
#endif
#include "sieve/kernels/attention_args.hpp"
#include "sieve/kernels/attention_cuda.hpp"
#include "sieve/kernels/attention_cuda_checks.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kernels {
namespace {

using cuda::AttnParams;
using cuda::ErrorRecord;

__device__ ErrorRecord g_error_record;  // one per device (each device loads its own module copy)

constexpr int kMaxSplits = 256;
constexpr int kMinPagesPerSplit = 8;  // below ~128 keys per split the combine costs more than it saves
// Tensor-core row kernel splits (see mma_splits): 2 CTAs fit per SM (shared memory); a CTA costs
// about kMmaCtaSetupKeys keys' worth of time to start (dependent loads of the page table and
// selection, the first tiles); a row takes one split per kMmaMinSplitKeys keys begun, decided per
// row on the device, so a sparse row is not spread much thinner than that.
constexpr int kMmaCtasPerSm = 2;
constexpr int kMmaCtaSetupKeys = 256;
constexpr int kMmaMinSplitKeys = 256;
constexpr int kMaxDevices = 64;
constexpr int kPrefillRows = 64;      // rows (token x head) of a prefill tile, see attention_prefill.cu
constexpr int kMaxStatsPageSize = 512;

struct DeviceState {
  bool ready = false;
  int sm_count = 0;
  int resident_clusters[cuda::kMaxClusterSplits + 1] = {};  // cuda::row_mma_resident_clusters()
  cudaMemPool_t pool = nullptr;
  ErrorRecord* err = nullptr;
};
std::mutex g_mutex;
std::array<DeviceState, kMaxDevices> g_devices;

std::string cuda_message(const char* call, cudaError_t e) {
  return std::string(call) + " failed: " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

sieve_status fail(std::string* error, sieve_status st, std::string msg) {
  if (error) *error = std::move(msg);
  return st;
}

// Makes `device` current for the scope of a call and restores the caller's device after.
class DeviceGuard {
 public:
  cudaError_t enter(int device) {
    cudaError_t e = cudaGetDevice(&prev_);
    if (e != cudaSuccess) return e;
    if (prev_ == device) return cudaSuccess;
    e = cudaSetDevice(device);
    if (e == cudaSuccess) changed_ = true;
    return e;
  }
  ~DeviceGuard() {
    if (changed_) cudaSetDevice(prev_);
  }

 private:
  int prev_ = 0;
  bool changed_ = false;
};

// The device's state, created on first use (the device must be current).
sieve_status device_state(int dev, DeviceState** out, std::string* error) {
  if (dev < 0 || dev >= kMaxDevices)
    return fail(error, SIEVE_ERR_UNSUPPORTED, "CUDA device " + std::to_string(dev) + " is beyond the " +
                                                  std::to_string(kMaxDevices) + " this build tracks");
  std::lock_guard<std::mutex> lock(g_mutex);
  DeviceState& st = g_devices[size_t(dev)];
  if (!st.ready) {
    cudaError_t e = cudaDeviceGetAttribute(&st.sm_count, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) return fail(error, SIEVE_ERR_DEVICE, cuda_message("cudaDeviceGetAttribute(MultiProcessorCount)", e));
    int pools = 0;
    e = cudaDeviceGetAttribute(&pools, cudaDevAttrMemoryPoolsSupported, dev);
    if (e != cudaSuccess || !pools)
      return fail(error, SIEVE_ERR_UNSUPPORTED,
                  "CUDA device " + std::to_string(dev) + " has no stream-ordered memory pools");
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
    e = cudaMemPoolCreate(&st.pool, &props);
    if (e != cudaSuccess) return fail(error, SIEVE_ERR_DEVICE, cuda_message("cudaMemPoolCreate", e));
    uint64_t keep = UINT64_MAX;
    e = cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReleaseThreshold, &keep);
    if (e != cudaSuccess) return fail(error, SIEVE_ERR_DEVICE, cuda_message("cudaMemPoolSetAttribute", e));
    void* rec = nullptr;
    e = cudaGetSymbolAddress(&rec, g_error_record);
    if (e != cudaSuccess) return fail(error, SIEVE_ERR_DEVICE, cuda_message("cudaGetSymbolAddress(error record)", e));
    st.err = static_cast<ErrorRecord*>(rec);
    cuda::row_mma_resident_clusters(st.resident_clusters);
    st.ready = true;
  }
  *out = &st;
  return SIEVE_OK;
}

// How one call runs.
struct Plan {
  AttentionShape s;
  bool row_path = false;  // row kernel (decode, q_rows) or tiled prefill
  bool mma = false;       // tensor-core kernels
  bool hopper = false;    // tiled prefill on the wgmma + TMA kernel (SIEVE_CUDA_HOPPER builds)
  int32_t split_min_keys = 0;
  int32_t hg = 1;         // query heads per CTA
  int32_t chunks = 1;     // CTAs per KV head (group / hg, rounded up)
  int32_t n_work = 0;     // rows of the row kernel
  int32_t splits = 1;
  bool cluster_merge = false;  // the splits merge on a thread-block cluster (AttnParams::cluster_merge)
  int32_t max_pages = 0;  // pages of the longest sequence
  int32_t tile_tokens = 0;
  int32_t max_tiles = 0;  // prefill tiles of the busiest sequence
};

// Refusals beyond check_attention_args: what these kernels are not built for.
std::string unsupported_here(const AttentionShape& s) {
  if (s.variant && s.d > cuda::kMaxVariantHeadDim)
    return "head_dim: " + std::to_string(s.d) + "; attention variants on CUDA take head_dim <= " +
           std::to_string(cuda::kMaxVariantHeadDim);
  if (!s.variant && s.d != 8 && s.d != 64 && s.d != 128)
    return "head_dim: " + std::to_string(s.d) + "; the CUDA kernels are built for 8, 64 and 128";
  if (s.stats != SIEVE_STATS_NONE && s.page_size > kMaxStatsPageSize)
    return "kv.page_size: " + std::to_string(s.page_size) + "; page statistics on CUDA take pages of at most " +
           std::to_string(kMaxStatsPageSize) + " tokens";
  if (int64_t(s.n_q_tokens) * s.hq > INT32_MAX)
    return "q: " + std::to_string(s.n_q_tokens) + " tokens x " + std::to_string(s.hq) +
           " heads exceed the CUDA grid (2^31 - 1 rows)";
  if (s.batch > 65535) return "kv.batch: " + std::to_string(s.batch) + " sequences; the CUDA kernels take at most 65535";
  return {};
}

// The kernels load K/V rows as 16-byte vectors: every row of the pool must start on a 16-byte
// boundary (the base after byte_offset, and each stride in bytes). Compact pools from cudaMalloc
// always do; a strided view (NHD, combined) does when head_dim x element size is a multiple of 16.
std::string misaligned_pages(const sieve_attention_args& a, const AttentionShape& s) {
  const size_t elem = dtype_bytes(a.kv->k_pages.dtype);
  for (const DLTensor* t : {&a.kv->k_pages, &a.kv->v_pages})
    if (reinterpret_cast<uintptr_t>(data_ptr<const void>(*t)) % 16 != 0)
      return std::string(t == &a.kv->k_pages ? "kv.k_pages" : "kv.v_pages") +
             ": data + byte_offset is not 16-byte aligned (the CUDA kernels load 16-byte rows)";
  // A dimension of size 1 is never stepped along: its stride does not matter.
  for (int64_t st : {s.page_capacity > 1 ? s.pages.page : 0, s.hkv > 1 ? s.pages.head : 0,
                     s.page_size > 1 ? s.pages.token : 0})
    if (st * int64_t(elem) % 16 != 0)
      return "kv.k_pages: stride " + std::to_string(st) + " x " + std::to_string(elem) +
             " bytes is not a multiple of 16 (the CUDA kernels load 16-byte rows)";
  return {};
}

// Split count of the tensor-core row kernel for `ctas` (row, head unit) pairs of up to `keys`
// keys: the S minimising ceil(ctas * S / resident) * (keys / S + setup), i.e. few whole rounds of
// resident CTAs, each as short as the split allows (at batch 16 x 32K: 2 splits, one round of 256
// CTAs). On an H200 (docs/bench/README.md) an earlier "~8 waves" rule (17 splits there) ran 2.5%
// slower than 8 splits on dense rows, and 90%-sparse rows ran 23% slower split 7 ways than 2 ways
// (95.1 vs 77.6 us): every extra round pays the CTA setup again.
int32_t mma_splits(int64_t ctas, int64_t keys, int64_t min_keys, int sm_count) {
  const int64_t resident = int64_t(kMmaCtasPerSm) * std::max(sm_count, 1);
  const int64_t cap = std::clamp<int64_t>((keys + min_keys - 1) / min_keys, 1, kMaxSplits);
  int32_t best = 1;
  double best_t = -1;
  for (int64_t s = 1; s <= cap; ++s) {
    const double rounds = double((ctas * s + resident - 1) / resident);
    const double t = rounds * (double(keys) / double(s) + kMmaCtaSetupKeys);
    if (best_t < 0 || t < best_t) {
      best_t = t;
      best = int32_t(s);
    }
  }
  return best;
}

// The tensor-core kernels need q and K/V in one 16-bit dtype (the MMA's operands), head_dim 64
// or 128, and 16-byte aligned bases (cp.async / ldmatrix rows).
bool tensor_core_eligible(const sieve_attention_args& a, const AttentionShape& s) {
  const Storage kv_dt = require_storage(a.kv->k_pages.dtype, "kv.k_pages");
  auto aligned = [](const DLTensor& t) { return reinterpret_cast<uintptr_t>(data_ptr<const void>(t)) % 16 == 0; };
  return kv_dt != Storage::f32 && require_storage(a.q->dtype, "q") == kv_dt && (s.d == 64 || s.d == 128) &&
         aligned(*a.q) && aligned(a.kv->k_pages) && aligned(a.kv->v_pages);
}

// An attention variant: the tensor-core variant kernel where the prefill one would run (unless the
// variant keeps its weights f32), its CTA's heads sharing one variant row (a row per query head: one head per CTA), else the FMA variant
// kernel, one query head per CTA.
Plan variant_plan(const sieve_attention_args& a, const CudaAttentionOptions& o, Plan p) {
  const AttentionShape& s = p.s;
  p.mma = o.tensor_cores && tensor_core_eligible(a, s) && !(s.var_flags & SIEVE_VARIANT_F32_WEIGHTS);
  p.hg = !p.mma || s.var_heads == SIEVE_SEL_PER_Q_HEAD ? 1 : std::min(s.group, cuda::kMaxHeadsPerCta);
  p.chunks = (s.group + p.hg - 1) / p.hg;
  p.tile_tokens = p.mma ? cuda::kMmaPrefillRows / p.hg : cuda::kVariantRows;
  for (int32_t b = 0; b < s.batch; ++b)
    p.max_tiles = std::max(p.max_tiles, cuda::variant_tiles(a.qo_indptr_host[b + 1] - a.qo_indptr_host[b],
                                                            s.var_q_block, p.tile_tokens));
  return p;
}

Plan make_plan(const sieve_attention_args& a, const CudaAttentionOptions& o, const DeviceState& dev) {
  const int sm_count = dev.sm_count;
  Plan p;
  p.s = attention_shape(a);
  const AttentionShape& s = p.s;
  if (s.variant) return variant_plan(a, o, p);
  const bool per_q_head = !s.dense && s.sel_heads == SIEVE_SEL_PER_Q_HEAD;
  p.row_path = !s.prefill || s.q_rows >= 0;
  p.mma = o.tensor_cores && tensor_core_eligible(a, s);
  int32_t max_hg;
  if (p.mma) max_hg = cuda::kMmaRowHeads;
  else if (p.row_path) max_hg = cuda::row_heads_per_cta(require_storage(a.kv->k_pages.dtype, "kv.k_pages"), s.d);
  else max_hg = cuda::kMaxHeadsPerCta;
  p.hg = per_q_head ? 1 : std::min(s.group, max_hg);
  p.chunks = (s.group + p.hg - 1) / p.hg;
  for (int32_t b = 0; b < s.batch; ++b) p.max_pages = std::max(p.max_pages, kv_pages(*a.kv, b));
  if (p.row_path) {
    p.n_work = s.q_rows >= 0 ? int32_t(s.q_rows) : s.n_q_tokens;
    const int64_t ctas = int64_t(p.n_work) * s.hkv * p.chunks;
    if (o.kv_splits > 0) {
      p.splits = std::min(o.kv_splits, kMaxSplits);
    } else if (p.mma) {
      // An upper bound from the longest dense row, counted in whole pages so that the plan
      // changes only when a page is added: a decode step replayed from a CUDA graph within a
      // page runs the plan an eager call would (LayerRunner's graphs key on the page counts).
      // Each row uses what its key list needs.
      const int64_t min_keys = o.split_min_keys > 0 ? o.split_min_keys : kMmaMinSplitKeys;
      p.splits = mma_splits(ctas, int64_t(p.max_pages) * s.page_size, min_keys, sm_count);
      p.split_min_keys = int32_t(min_keys);
    } else {
      // Enough CTAs for ~4 per SM; no split shorter than kMinPagesPerSplit pages.
      const int64_t target = 4 * int64_t(sm_count);
      if (ctas > 0 && ctas < target) {
        const int64_t want = (target + ctas - 1) / ctas;
        const int64_t cap = std::max<int64_t>(1, p.max_pages / kMinPagesPerSplit);
        p.splits = int32_t(std::clamp<int64_t>(std::min(want, cap), 1, kMaxSplits));
      }
    }
    // One cluster per (row, head unit), merged on the cluster only when every cluster of the grid
    // is resident at once (a second round of clusters would cost far more than the combine).
    p.cluster_merge = p.mma && p.splits > 1 && p.splits <= cuda::kMaxClusterSplits &&
                      ctas <= dev.resident_clusters[p.splits];
  } else {
    p.tile_tokens = (p.mma ? cuda::kMmaPrefillRows : kPrefillRows) / p.hg;
    for (int32_t b = 0; b < s.batch; ++b) {
      const int32_t n_b = a.qo_indptr_host[b + 1] - a.qo_indptr_host[b];
      const int32_t qb = s.dense ? std::max(n_b, 1) : s.q_block;
      const int32_t tiles = query_blocks(n_b, qb) * ceil_div(qb, p.tile_tokens);
      p.max_tiles = std::max(p.max_tiles, tiles);
    }
  }
  return p;
}

// Scratch of one call from the device's pool, returned on the stream at scope exit.
class Scratch {
 public:
  Scratch(cudaMemPool_t pool, cudaStream_t stream) : pool_(pool), stream_(stream) {}
  ~Scratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);
  }
  cudaError_t get(size_t bytes, float** out) {
    *out = nullptr;
    if (bytes == 0) return cudaSuccess;
    cudaError_t e = cudaMallocFromPoolAsync(&ptr_, bytes, pool_, stream_);
    if (e == cudaSuccess) *out = static_cast<float*>(ptr_);
    return e;
  }

 private:
  cudaMemPool_t pool_;
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

sieve_status check_and_plan(const sieve_attention_args& a, const CudaAttentionOptions& o,
                            DeviceGuard& guard, DeviceState** st, Plan* plan, std::string* error) {
  if (std::string e = check_attention_args(a); !e.empty())
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT, e);
  if (std::string e = unsupported_attention_request(a); !e.empty())
    return fail(error, SIEVE_ERR_UNSUPPORTED, e);
  if (a.q->device.device_type != kDLCUDA)  // check_attention_args put every tensor on q's device
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT,
                "q: on " + device_name(a.q->device) + ", but attend_cuda needs every tensor on a CUDA device");
  const AttentionShape s = attention_shape(a);
  if (std::string e = unsupported_here(s); !e.empty()) return fail(error, SIEVE_ERR_UNSUPPORTED, e);
  if (std::string e = misaligned_pages(a, s); !e.empty()) return fail(error, SIEVE_ERR_UNSUPPORTED, e);
  if (o.kv_splits < 0)
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT,
                "options.kv_splits: " + std::to_string(o.kv_splits) + ", expected >= 0");
  if (o.hopper_ctas < 0)
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT,
                "options.hopper_ctas: " + std::to_string(o.hopper_ctas) + ", expected >= 0");
  if (o.split_min_keys < 0)
    return fail(error, SIEVE_ERR_INVALID_ARGUMENT,
                "options.split_min_keys: " + std::to_string(o.split_min_keys) + ", expected >= 0");
  const int dev = a.q->device.device_id;
  if (cudaError_t e = guard.enter(dev); e != cudaSuccess)
    return fail(error, SIEVE_ERR_DEVICE, cuda_message(("cudaSetDevice(" + std::to_string(dev) + ")").c_str(), e));
  if (sieve_status st_ = device_state(dev, st, error); st_ != SIEVE_OK) return st_;
  *plan = make_plan(a, o, **st);
#if SIEVE_CUDA_HOPPER
  // The Hopper kernel takes the row maximum before scaling: positive scales only.
  plan->hopper = o.hopper && !s.variant && !plan->row_path && plan->mma && s.scale > 0.f &&
                 cuda::sm90::prefill_wgmma_unsupported(dev, s.d, s.page_size).empty();
#endif
  return SIEVE_OK;
}

sieve_status run(const sieve_attention_args& a, const CudaAttentionOptions& o, void* stream_ptr,
                 std::string* error) {
  DeviceGuard guard;
  DeviceState* st = nullptr;
  Plan plan;
  if (sieve_status r = check_and_plan(a, o, guard, &st, &plan, error); r != SIEVE_OK) return r;
  const AttentionShape& s = plan.s;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  const sieve_paged_kv& kv = *a.kv;

  AttnParams p{};
  p.q = data_ptr<const void>(*a.q);
  p.q_dt = require_storage(a.q->dtype, "q");
  p.out = data_ptr<void>(*a.out);
  p.out_dt = require_storage(a.out->dtype, "out");
  p.lse = a.lse ? data_ptr<float>(*a.lse) : nullptr;
  p.qo_indptr = data_ptr<const int32_t>(*a.qo_indptr);
  p.q_rows = a.q_rows ? data_ptr<const int32_t>(*a.q_rows) : nullptr;
  // Decode (one query token per sequence): token b is sequence b's, so the kernels skip the
  // search of qo_indptr (one dependent round trip per CTA). O(batch) on the host mirror.
  p.token_is_sequence = s.n_q_tokens == s.batch;
  for (int32_t b = 0; p.token_is_sequence && b < s.batch; ++b)
    p.token_is_sequence = a.qo_indptr_host[b + 1] == b + 1;
  p.n_work = plan.n_work;
  p.n_q_tokens = s.n_q_tokens;
  p.batch = s.batch;
  p.k = data_ptr<const void>(kv.k_pages);
  p.v = data_ptr<const void>(kv.v_pages);
  p.pages = s.pages;
  p.kv_indptr = data_ptr<const int32_t>(kv.indptr);
  p.kv_indices = data_ptr<const int32_t>(kv.indices);
  p.kv_last = data_ptr<const int32_t>(kv.last_page_len);
  p.kv_indices_len = kv.indices.shape[0];
  p.page_capacity = s.page_capacity;
  p.page_size = s.page_size;
  p.page_shift = (s.page_size & (s.page_size - 1)) == 0 ? __builtin_ctz(unsigned(s.page_size)) : -1;
  p.hq = s.hq;
  p.hkv = s.hkv;
  p.group = s.group;
  p.d = s.d;
  p.scale_log2 = s.scale * cuda::kLog2e;
  p.sel_heads = s.dense ? -1 : int32_t(s.sel_heads);
  p.sel_h = s.dense ? 1 : s.sel_h;
  p.q_block = s.dense ? 1 : s.q_block;
  p.k_block_pages = s.dense ? 1 : s.k_block_pages;
  if (!s.dense) {
    p.sel_indptr = data_ptr<const int32_t>(a.selection->indptr);
    p.sel_indices = data_ptr<const int32_t>(a.selection->indices);
    p.sel_capacity = a.selection->capacity;
  }
  p.hg = plan.hg;
  p.chunks = plan.chunks;
  p.n_splits = plan.splits;
  p.split_min_keys = plan.splits > 1 ? plan.split_min_keys : 0;
  p.cluster_merge = plan.cluster_merge;
  p.stats_h = s.stats_h;
  p.page_mass = s.stats != SIEVE_STATS_NONE ? data_ptr<float>(*a.page_mass) : nullptr;
  p.err = st->err;
  if (const sieve_attention_variant* v = attention_variant(a)) {
    p.kv_dt = require_storage(kv.k_pages.dtype, "kv.k_pages");
    p.var_heads = int32_t(s.var_heads);
    p.var_h = s.var_h;
    p.var_q_block = s.var_q_block;
    p.row_spans = data_ptr<const int32_t>(v->row_spans);
    p.spans = data_ptr<const int32_t>(v->spans);
    p.n_spans = int32_t(v->spans.shape[0]);
    p.packed_pos = data_ptr<const int32_t>(v->packed_pos);
    p.packed_count = v->packed_count.data ? data_ptr<const int32_t>(v->packed_count) : nullptr;
    p.packed_bias = v->packed_bias.data ? data_ptr<const float>(v->packed_bias) : nullptr;
    p.n_packed = int32_t(v->packed_pos.shape[0]);
  }

  const Storage kv_dt = require_storage(kv.k_pages.dtype, "kv.k_pages");
  const bool stats = s.stats != SIEVE_STATS_NONE;

  // Scratch: split partials [splits, n_work, hq, d] + [splits, n_work, hq] unless the splits merge
  // on a cluster, the statistics' lse [n_q_tokens, hq] when the caller did not ask for lse, and on
  // the tensor-core row path the logits the statistics are reduced from [nnz_pages * page_size, hq]
  // (AttnParams::logits). A call that needs none allocates nothing: no allocation node in a CUDA
  // graph between this kernel and the one before it, so the programmatic launch can overlap them.
  const bool global_partials = plan.splits > 1 && !plan.cluster_merge;
  const size_t part_o = global_partials ? size_t(plan.splits) * plan.n_work * s.hq * s.d : 0;
  const size_t part_lse = global_partials ? size_t(plan.splits) * plan.n_work * s.hq : 0;
  const size_t lse_scratch = stats && !p.lse ? size_t(s.n_q_tokens) * s.hq : 0;
  const bool stats_from_logits = stats && plan.row_path && plan.mma;
  size_t logits = stats_from_logits ? size_t(s.nnz_pages) * s.page_size * s.hq : 0;
  // The splits each (row, head unit) used (AttnParams::split_used), stored as int32 in a float slot.
  const size_t used = p.split_min_keys > 0 && global_partials ? size_t(plan.n_work) * s.hkv * plan.chunks : 0;
  const size_t used_at = part_o + part_lse + lse_scratch;
  const size_t logits_at = (used_at + used + 3) / 4 * 4;  // 16-byte aligned (paired stores)
  Scratch scratch(st->pool, stream);
  float* ws = nullptr;
  cudaError_t alloc = scratch.get((logits ? logits_at + logits : used_at + used) * sizeof(float), &ws);
  if (alloc == cudaErrorMemoryAllocation && logits) {
    // No room for the logits (4 bytes per token and query head): the statistics then take the
    // second pass over K, which needs no scratch.
    cudaGetLastError();
    logits = 0;
    alloc = scratch.get((used_at + used) * sizeof(float), &ws);
  }
  if (alloc != cudaSuccess)
    return fail(error, alloc == cudaErrorMemoryAllocation ? SIEVE_ERR_OUT_OF_MEMORY : SIEVE_ERR_DEVICE,
                cuda_message("cudaMallocFromPoolAsync(attention scratch)", alloc));
  if (part_o) {
    p.part_o = ws;
    p.part_lse = ws + part_o;
  }
  if (lse_scratch) p.lse_all = ws + part_o + part_lse;
  if (used) p.split_used = reinterpret_cast<int32_t*>(ws + used_at);
  if (logits) p.logits = ws + logits_at;

  if (stats && s.nnz_pages > 0) {
    // Pages no computed row attends hold 0.
    if (cudaError_t e = cudaMemsetAsync(p.page_mass, 0, size_t(s.nnz_pages) * s.stats_h * sizeof(float), stream);
        e != cudaSuccess)
      return fail(error, SIEVE_ERR_DEVICE, cuda_message("cudaMemsetAsync(page_mass)", e));
  }

  if (s.variant) {
    if (plan.max_tiles == 0) return SIEVE_OK;
    const cudaError_t e =
        plan.mma ? cuda::launch_variant_attention_mma(p, kv_dt, plan.max_tiles, plan.tile_tokens, stream)
                 : cuda::launch_variant_attention(p, plan.max_tiles, stream);
    if (e != cudaSuccess) return fail(error, SIEVE_ERR_DEVICE, cuda_message("attention variant kernel launch", e));
  } else if (plan.row_path) {
    if (plan.n_work == 0) return SIEVE_OK;
    const cudaError_t e = plan.mma ? cuda::launch_row_attention_mma(p, kv_dt, stream)
                                   : cuda::launch_row_attention(p, kv_dt, stream);
    if (e != cudaSuccess) return fail(error, SIEVE_ERR_DEVICE, cuda_message("row attention kernel launch", e));
    if (plan.splits > 1 && !plan.cluster_merge) {
      if (cudaError_t e = cuda::launch_split_combine(p, stream); e != cudaSuccess)
        return fail(error, SIEVE_ERR_DEVICE, cuda_message("split-KV combine kernel launch", e));
    }
    if (stats && plan.max_pages > 0) {
      const cudaError_t e = p.logits ? cuda::launch_page_mass_from_logits(p, plan.max_pages, stream)
                                     : cuda::launch_page_mass(p, kv_dt, plan.max_pages, stream);
      if (e != cudaSuccess)
        return fail(error, SIEVE_ERR_DEVICE, cuda_message("page statistics kernel launch", e));
    }
  } else if (plan.max_tiles > 0) {
#if SIEVE_CUDA_HOPPER
    if (plan.hopper) {
      std::string why;
      const cudaError_t e = cuda::sm90::launch_prefill_attention_wgmma(p, kv_dt, plan.max_tiles, plan.tile_tokens,
                                                                       o.hopper_ctas, stream, &why);
      if (e != cudaSuccess)
        return fail(error, SIEVE_ERR_DEVICE,
                    why.empty() ? cuda_message("Hopper prefill attention kernel launch", e) : "Hopper prefill: " + why);
      return SIEVE_OK;
    }
#endif
    const cudaError_t e =
        plan.mma ? cuda::launch_prefill_attention_mma(p, kv_dt, plan.max_tiles, plan.tile_tokens, stream)
                 : cuda::launch_prefill_attention(p, kv_dt, plan.max_tiles, plan.tile_tokens, stream);
    if (e != cudaSuccess) return fail(error, SIEVE_ERR_DEVICE, cuda_message("prefill attention kernel launch", e));
  }
  return SIEVE_OK;
}

}  // namespace

sieve_status attend_cuda(const sieve_attention_args& args, const CudaAttentionOptions& options,
                         void* cuda_stream, std::string* error) {
  try {
    return run(args, options, cuda_stream, error);
  } catch (const std::bad_alloc&) {
    return fail(error, SIEVE_ERR_OUT_OF_MEMORY, "attend_cuda: out of host memory");
  } catch (const std::exception& e) {
    return fail(error, SIEVE_ERR_INTERNAL, std::string("attend_cuda: ") + e.what());
  }
}

sieve_status attend_cuda(const sieve_attention_args& args, void* cuda_stream, std::string* error) {
  return attend_cuda(args, CudaAttentionOptions{}, cuda_stream, error);
}

sieve_status cuda_attention_plan(const sieve_attention_args& args, const CudaAttentionOptions& options,
                                 CudaAttentionPlan* out, std::string* error) {
  try {
    DeviceGuard guard;
    DeviceState* st = nullptr;
    Plan plan;
    if (sieve_status r = check_and_plan(args, options, guard, &st, &plan, error); r != SIEVE_OK) return r;
    out->kernel = plan.s.variant ? (plan.mma ? "variant-mma" : "variant-fma")
                  : plan.row_path    ? (plan.mma ? "row-mma" : "row-fma")
                  : plan.hopper      ? "prefill-wgmma"
                                     : (plan.mma ? "prefill-mma" : "prefill-fma");
    out->kv_splits = plan.row_path ? plan.splits : 1;
    out->merge = !plan.row_path || plan.splits <= 1 ? "none" : plan.cluster_merge ? "cluster" : "combine";
    out->heads_per_cta = plan.hg;
    return SIEVE_OK;
  } catch (const std::exception& e) {
    return fail(error, SIEVE_ERR_INTERNAL, std::string("cuda_attention_plan: ") + e.what());
  }
}

int cuda_attention_kv_splits(const sieve_attention_args& args, const CudaAttentionOptions& options,
                             std::string* error) {
  CudaAttentionPlan plan;
  return cuda_attention_plan(args, options, &plan, error) == SIEVE_OK ? plan.kv_splits : 0;
}

sieve_status cuda_attention_check_errors(int device, void* cuda_stream, std::string* error) {
  DeviceGuard guard;
  if (cudaError_t e = guard.enter(device); e != cudaSuccess)
    return fail(error, SIEVE_ERR_DEVICE, cuda_message("cudaSetDevice", e));
  DeviceState* st = nullptr;
  if (sieve_status r = device_state(device, &st, error); r != SIEVE_OK) return r;
  cudaStream_t stream = static_cast<cudaStream_t>(cuda_stream);
  ErrorRecord rec{};
  cudaError_t e = cudaMemcpyAsync(&rec, st->err, sizeof rec, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) return fail(error, SIEVE_ERR_DEVICE, cuda_message("reading the attention error record", e));
  if (rec.code == cuda::kErrNone) return SIEVE_OK;
  e = cudaMemsetAsync(st->err, 0, sizeof rec, stream);
  if (e != cudaSuccess) return fail(error, SIEVE_ERR_DEVICE, cuda_message("cudaMemsetAsync(error record)", e));
  auto n = [](long long v) { return std::to_string(v); };
  std::string msg;
  switch (rec.code) {
    case cuda::kErrSelBlockRange:
      msg = "selection row " + n(rec.a) + ": key block " + n(rec.c) + " at selection.indices[" + n(rec.b) +
            "] is outside [0, " + n(rec.d) + ")";
      break;
    case cuda::kErrSelNotIncreasing:
      msg = "selection row " + n(rec.a) + ": key blocks not strictly increasing at selection.indices[" +
            n(rec.b) + "] (" + n(rec.c) + " after " + n(rec.d) + ")";
      break;
    case cuda::kErrSelIndptr:
      msg = "selection row " + n(rec.a) + ": indptr range [" + n(rec.b) + ", " + n(rec.c) +
            ") is not inside selection.capacity " + n(rec.d);
      break;
    case cuda::kErrPageId:
      msg = "kv.indices: physical page " + n(rec.c) + " (sequence " + n(rec.a) + ", logical page " + n(rec.b) +
            ") is outside the pool [0, " + n(rec.d) + ")";
      break;
    case cuda::kErrPageSlot:
      msg = "kv.indptr: sequence " + n(rec.a) + ", logical page " + n(rec.b) + " maps to kv.indices[" + n(rec.c) +
            "], outside its " + n(rec.d) + " entries";
      break;
    case cuda::kErrVariantRow:
      msg = "variant row " + n(rec.a) + ": spans [" + n(rec.b) + ", " + n(rec.c) + ") are not inside [0, " + n(rec.d) + ")";
      break;
    case cuda::kErrVariantSpan:
      msg = "variant row " + n(rec.a) + ": variant.spans[" + n(rec.b) + "] = [" + n(rec.c) + ", " + n(rec.d) +
            ") has a bad kind or range";
      break;
    case cuda::kErrPackedKey:
      msg = "variant row " + n(rec.a) + ": packed key " + n(rec.b) + " has position or count " + n(rec.c) +
            " (position outside the sequence's " + n(rec.d) + " keys, or count < 1)";
      break;
    case cuda::kErrQRow:
      msg = "q_rows[" + n(rec.a) + "]: query token " + n(rec.b) + " is outside [0, " + n(rec.c) + ")";
      break;
    default:
      msg = "attention error record holds unknown code " + std::to_string(rec.code);
  }
  return fail(error, SIEVE_ERR_INVALID_ARGUMENT, "attend_cuda (device check): " + msg + " (entry skipped)");
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear it: no device is not an error for the caller
    return 0;
  }
  return n;
}

}  // namespace sieve::kernels
