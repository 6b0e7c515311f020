// The policy-step benchmark (include/sieve/bench/policy.hpp, docs/bench/policy.md).
//
// Per (context, batch) and chain (dense = the empty chain first): a KV store of the device is
// created, the policies of the chain are created on it (LayerRunner), and the context enters the
// store in chunks through LayerRunner::append_only — the store's append plus the chain's on_append
// hooks (Quest min/max, RaaS stamps, ...), no attention — with the same deterministic contents for
// every chain. Then:
//   decode : warm-up + timed steps; a step = run_layer for every layer (1 new token per sequence)
//            + end_step, timed with CUDA events on the host stream (steady clock on the CPU). The
//            steps append: the store grows by one token per step (accepted; the context reported
//            is the one before the steps). Then one untimed step with the selections recorded;
//            before its end_step, the core kernel alone is timed on that step's views and
//            selections (and dense on the same views).
//   prefill: per sample a fresh store filled with ctx - new tokens, then one run_layer per layer
//            with the `new` last tokens + end_step, timed; the untimed warm-up sample records the
//            selections for the core-kernel-only time.
#include "sieve/bench/policy.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "report.hpp"
#include "runner.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/kv/paged_store.hpp"
#include "sieve/reference/long_context.hpp"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/layer_runner.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"
#ifdef SIEVE_WITH_CUDA
#include <cuda_runtime.h>

#include "gpu_support.hpp"
#endif

namespace sieve::bench {
namespace {

using runtime::HostServices;
using Clock = std::chrono::steady_clock;

constexpr size_t kFillChunkBytes = size_t(64) << 20;  // K+V+q of one fill chunk, all sequences

// Device (or host) memory through the services table, freed with it.
class Buffer {
 public:
  Buffer(HostServices& s, size_t bytes) : s_(s) {
    bytes_ = std::max<size_t>(bytes, 4);
    p_ = s.table()->alloc(s.table()->host_ctx, s.device(), bytes_, 256);
    require(p_ != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
            "cannot allocate " + std::to_string(bytes_) + " bytes on " + device_name(s.device()));
  }
  ~Buffer() { s_.table()->free(s_.table()->host_ctx, s_.device(), p_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* get() const { return p_; }
  void upload(const void* host, size_t bytes) {
    std::string err;
    require(s_.copy(p_, s_.device(), host, kCpu, bytes, &err), SIEVE_ERR_DEVICE, err);
  }

 private:
  HostServices& s_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// A tensor view over a Buffer (the shape lives here).
struct Tensor {
  std::unique_ptr<Buffer> buf;
  std::vector<int64_t> shape;
  DLTensor t{};
  Tensor(HostServices& s, std::vector<int64_t> sh, DLDataType dt) : shape(std::move(sh)) {
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    buf = std::make_unique<Buffer>(s, size_t(std::max<int64_t>(n, 1)) * dtype_bytes(dt));
    t = make_view(buf->get(), s.device(), dt, int(shape.size()), shape.data());
  }
  int64_t numel() const { return sieve::numel(t); }
};

// n random values (N(0,1)-like, deterministic in seed) of dt at p on the services' device.
void fill_random(HostServices& s, void* p, DLDataType dt, int64_t n, uint64_t seed) {
#ifdef SIEVE_WITH_CUDA
  if (s.device().device_type == kDLCUDA) {
    cudaError_t e = fill_device_random(p, dt, n, seed, 1.f, static_cast<cudaStream_t>(s.cuda_stream()));
    require(e == cudaSuccess, SIEVE_ERR_DEVICE, std::string("random fill: ") + cudaGetErrorString(e));
    return;
  }
#else
  (void)s;
#endif
  fill_host_random(p, dt, n, seed);
}

// Times device work enqueued on the services' stream between start() and stop().
class Timer {
 public:
  explicit Timer(HostServices& s) : s_(s) {
#ifdef SIEVE_WITH_CUDA
    if (s.device().device_type == kDLCUDA) {
      require(cudaEventCreate(&e0_) == cudaSuccess && cudaEventCreate(&e1_) == cudaSuccess, SIEVE_ERR_DEVICE,
              "cudaEventCreate failed");
    }
#endif
  }
  ~Timer() {
#ifdef SIEVE_WITH_CUDA
    if (e0_) cudaEventDestroy(e0_);
    if (e1_) cudaEventDestroy(e1_);
#endif
  }
  void start() {
#ifdef SIEVE_WITH_CUDA
    if (e0_) {
      cudaEventRecord(e0_, static_cast<cudaStream_t>(s_.cuda_stream()));
      return;
    }
#endif
    t0_ = Clock::now();
  }
  double stop_ms() {
#ifdef SIEVE_WITH_CUDA
    if (e0_) {
      cudaEventRecord(e1_, static_cast<cudaStream_t>(s_.cuda_stream()));
      cudaError_t e = cudaEventSynchronize(e1_);
      float ms = 0;
      if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0_, e1_);
      require(e == cudaSuccess, SIEVE_ERR_DEVICE, std::string("timing: ") + cudaGetErrorString(e));
      return double(ms);
    }
#endif
    std::string err;
    require(s_.synchronize(&err), SIEVE_ERR_DEVICE, err);
    return std::chrono::duration<double, std::milli>(Clock::now() - t0_).count();
  }

 private:
  HostServices& s_;
  Clock::time_point t0_;
#ifdef SIEVE_WITH_CUDA
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
#endif
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// ---- the workload of one (context, batch) ----------------------------------------------------

struct Shape {
  uint32_t phase = SIEVE_PHASE_DECODE;
  int32_t layers = 1, hq = 32, hkv = 8, d = 128, page = 16, ctx = 0, batch = 1;
  int32_t n_new = 1;   // tokens per sequence of the timed call (decode: 1)
  int32_t extra = 0;   // tokens appended after the context (decode steps)
  DLDataType dtype = kBF16;
  DLDevice device = kCpu;
  bool similar = false;
  double key_cos = 0.9;
  uint32_t fill_phase = SIEVE_PHASE_DECODE;
  int32_t min_q_block = 1;
  uint64_t seed = 1;
  bool check = false;
  bool prefill() const { return phase == SIEVE_PHASE_PREFILL; }
  int32_t n_fill() const { return prefill() ? ctx - n_new : ctx; }
  int32_t pages_per_seq() const { return kernels::ceil_div(ctx + extra, page) + 1; }
};

struct Result {
  std::string chain, error, skipped;
  double step_ms = 0, step_min_ms = 0, step_max_ms = 0, dense_step_ms = 0;
  double core_ms = 0, core_dense_ms = 0;  // the core kernel alone on the recorded selection / dense
  double attended = 1;                    // attended keys / causal keys (logical), mean over (token, q head)
  double resident_fraction = 1;           // resident tokens / logical tokens (eviction)
  uint64_t kv_bytes = 0;                  // store bytes in use after the recorded step
  int samples = 0;
  std::string selection;                  // kind/heads/blocks of the recorded selection
  std::vector<std::pair<std::string, HostServices::MetricSummary>> metrics;
};

struct StoreHandle {
  const sieve_kv_store_api* api = nullptr;
  sieve_kv_store* store = nullptr;
  ~StoreHandle() {
    if (store) api->destroy(store);
  }
};

// Bytes a case needs on its device, beyond what policies allocate (their sidecars and scratch):
// the store, the timed call's tensors, the runner's selection buffers and a fill chunk.
double estimate_bytes(const Shape& s, bool pre_rope) {
  const double eb = double(dtype_bytes(s.dtype));
  const double tok = double(s.hkv) * s.d * eb;
  double store = double(s.layers) * (double(s.batch) * s.pages_per_seq() + s.batch) * s.page * tok * (pre_rope ? 3 : 2);
  const double n = double(s.batch) * s.n_new;
  double call = n * (2.0 * s.hq * s.d * eb + 2 * tok);
  double rows = n * s.hq;
  if (s.prefill() && s.min_q_block > 1) rows = std::min(rows, (n / s.min_q_block + s.batch) * s.hq);
  double sel = rows * s.pages_per_seq() * 4.0 + n * s.hq * 4.0;
  double stats = s.prefill() ? 0 : double(s.batch) * s.pages_per_seq() * s.hkv * 4.0;
  return store + call + sel + stats + double(kFillChunkBytes);
}

double available_bytes(const DLDevice& dev) {
#ifdef SIEVE_WITH_CUDA
  if (dev.device_type == kDLCUDA) {
    size_t free_b = 0, total = 0;
    if (cudaMemGetInfo(&free_b, &total) == cudaSuccess) return double(free_b);
    return 0;
  }
#endif
  (void)dev;
  return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
}

// One sequence's similar-key context (long_context.hpp), converted to the K/V/q dtype rows.
struct SimilarContext {
  HostTensor q, k, v;  // [n_tokens, H, d]
};
SimilarContext make_similar(const Shape& s, int32_t b, int32_t n_tokens) {
  reference::LongContextSpec ls;
  ls.n_q_heads = s.hq;
  ls.n_kv_heads = s.hkv;
  ls.head_dim = s.d;
  ls.n_tokens = n_tokens;
  ls.seed = s.seed + uint64_t(b);
  ls.key_adjacent_cos = s.key_cos;
  reference::LongContext lc = reference::make_long_context(ls);
  SimilarContext out{HostTensor({n_tokens, s.hq, s.d}, s.dtype), HostTensor({n_tokens, s.hkv, s.d}, s.dtype),
                     HostTensor({n_tokens, s.hkv, s.d}, s.dtype)};
  for (size_t i = 0; i < lc.q.size(); ++i) store_float(out.q.dl().data, s.dtype, int64_t(i), lc.q[i]);
  for (size_t i = 0; i < lc.k.size(); ++i) store_float(out.k.dl().data, s.dtype, int64_t(i), lc.k[i]);
  for (size_t i = 0; i < lc.v.size(); ++i) store_float(out.v.dl().data, s.dtype, int64_t(i), lc.v[i]);
  return out;
}

// Attended / causal keys from a selection snapshot, averaged over (query token, query head);
// `logical[b]` is the sequence's length before any eviction, `view` the layer's resident pages.
double attended_fraction(const runtime::SelectionSnapshot& sel, const sieve_paged_kv& view, const Shape& s,
                         const std::vector<int32_t>& logical) {
  double sum = 0;
  int64_t n = 0;
  const int32_t H = sel.kind == SIEVE_SEL_ALL ? 1 : kernels::selection_head_count(sel.heads, s.hq, s.hkv);
  const int32_t heads_per_row = s.hq / H;
  int64_t row_base = 0;
  for (int32_t b = 0; b < s.batch; ++b) {
    const int32_t kv = kernels::kv_len(view, b), nb = s.n_new;
    const int32_t qb = sel.kind == SIEVE_SEL_ALL ? nb : std::max(sel.q_block, 1);
    const int32_t n_qblocks = kernels::query_blocks(nb, qb);
    const int32_t block_keys = std::max(sel.k_block_pages, 1) * s.page;
    for (int32_t t = 0; t < n_qblocks; ++t)
      for (int32_t h = 0; h < H; ++h) {
        // Selected key blocks of the row as sorted [start, end) key ranges, with prefix sums.
        std::vector<int64_t> starts, prefix(1, 0);
        if (sel.kind != SIEVE_SEL_ALL) {
          const int64_t r = kernels::selection_row(row_base, t, H, h);
          for (int32_t i = sel.indptr[size_t(r)]; i < sel.indptr[size_t(r) + 1]; ++i) {
            const int64_t a = int64_t(sel.indices[size_t(i)]) * block_keys;
            starts.push_back(a);
            prefix.push_back(prefix.back() + std::min<int64_t>(a + block_keys, kv) - a);
          }
        }
        for (int32_t i = t * qb; i < std::min(nb, (t + 1) * qb); ++i) {
          const int64_t pos = kv - nb + i;                       // resident index of the query token
          const int64_t causal = int64_t(logical[size_t(b)]) - nb + i + 1;  // keys it would see undropped
          int64_t got = pos + 1;
          if (sel.kind != SIEVE_SEL_ALL) {
            // Blocks starting at or before pos count up to pos (causality inside a block).
            const size_t k = size_t(std::upper_bound(starts.begin(), starts.end(), pos) - starts.begin());
            got = k == 0 ? 0 : prefix[k - 1] + std::min<int64_t>(pos + 1, std::min<int64_t>(starts[k - 1] + block_keys, kv)) - starts[k - 1];
          }
          sum += double(heads_per_row) * double(got) / double(std::max<int64_t>(causal, 1));
          n += heads_per_row;
        }
      }
    row_base += n_qblocks;
  }
  return n ? sum / double(n) : 1.0;
}

std::string describe(const runtime::SelectionSnapshot& sel) {
  if (sel.kind == SIEVE_SEL_ALL) return "all";
  static const char* heads[] = {"per-sequence", "per-kv-head", "per-q-head"};
  return std::string(sel.heads <= 2 ? heads[sel.heads] : "?") + " q_block " + std::to_string(sel.q_block) +
         " k_block " + std::to_string(sel.k_block_pages) + "p";
}

// ---- one chain on one shape -------------------------------------------------------------------

sieve_geometry geometry_of(const Shape& s) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = s.layers;
  g.n_q_heads = s.hq;
  g.n_kv_heads = s.hkv;
  g.head_dim = s.d;
  g.page_size = s.page;
  g.max_batch = s.batch;
  g.max_seq_len = s.ctx + s.extra;
  g.kv_dtype = s.dtype;
  g.device = s.device;
  g.rope_theta = 10000.f;
  g.rope_dim = s.d;
  return g;
}

// Resolves a chain for the geometry: "" or every problem, "; "-separated.
std::string resolve(const runtime::ChainSpec& spec, const runtime::Registry& registry, const sieve_geometry& g,
                    runtime::ResolvedChains* out) {
  std::vector<std::string> errors;
  if (runtime::resolve_chains(spec, registry, g, out, &errors)) return {};
  std::string all;
  for (const auto& e : errors) all += (all.empty() ? "" : "; ") + e;
  return all;
}

class Case {
 public:
  // `similar`: with --keys similar, each sequence's generated context (n_fill + n_new tokens).
  Case(const Shape& s, const runtime::ChainSpec& spec, const runtime::Registry& registry, HostServices& services,
       const std::vector<SimilarContext>* similar)
      : s_(s), services_(services), similar_(similar) {
    const sieve_geometry g = g_ = geometry_of(s);
    runtime::ResolvedChains chains;
    if (std::string e = resolve(spec, registry, g, &chains); !e.empty()) fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    needs_ = chains.needs;
    store_.api = s.device.device_type == kDLCUDA ? kv::paged_cuda_store_api() : kv::paged_cpu_store_api();
    require(store_.api != nullptr, SIEVE_ERR_UNSUPPORTED, "this build has no CUDA KV store");
    sieve_kv_config kc{};
    kc.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
    kc.geometry = g;
    kc.pages_per_layer = s.batch * s.pages_per_seq() + s.batch;
    kc.keep_pre_rope_k = (needs_ & SIEVE_NEEDS_PRE_ROPE_K) ? 1 : 0;
    std::string reason;
    sieve_reason_sink sink{&reason, [](void* c, const char* m) { *static_cast<std::string*>(c) = m ? m : ""; }};
    if (store_.api->create(services.table(), &kc, &store_.store, sink) != SIEVE_OK)
      fail(SIEVE_ERR_OUT_OF_MEMORY, "KV store '" + std::string(store_.api->name) + "': " + reason);
    seq_ids_.resize(size_t(s.batch));
    for (auto& id : seq_ids_)
      require(store_.api->add_sequence(store_.store, &id) == SIEVE_OK, SIEVE_ERR_INTERNAL, "add_sequence failed");
    runtime::LayerRunner::Options opt;
    opt.check = s.check;  // off unless --check: its host copies would be in the timings
    opt.record_selections = false;
    opt.min_selection_q_block = s.prefill() ? s.min_q_block : 1;
    runner_ = std::make_unique<runtime::LayerRunner>(services, g, store_.store, store_.api, chains, opt);
    logical_.assign(size_t(s.batch), 0);
  }
  ~Case() {
    runner_.reset();  // instances go before the store
  }

  // The first n tokens of every sequence enter the store through the chain's on_append hooks.
  void fill(int32_t n) {
    if (n <= 0) return;
    const size_t row_bytes = size_t(s_.hq + 2 * s_.hkv) * s_.d * dtype_bytes(s_.dtype);
    if (s_.similar) {  // one sequence at a time: the generator's context is per sequence
      require(similar_ && similar_->size() == size_t(s_.batch), SIEVE_ERR_INTERNAL, "no similar-key context");
    }
    const int32_t chunk = std::clamp<int32_t>(int32_t(kFillChunkBytes / row_bytes / size_t(s_.batch)), 1, n);
    Tensor q(services_, {int64_t(chunk) * s_.batch, s_.hq, s_.d}, s_.dtype);
    Tensor k(services_, {int64_t(chunk) * s_.batch, s_.hkv, s_.d}, s_.dtype);
    Tensor v(services_, {int64_t(chunk) * s_.batch, s_.hkv, s_.d}, s_.dtype);
    Tensor qo(services_, {s_.batch + 1}, kI32);  // on_append hooks may read the device copy
    int32_t uploaded = -1;
    for (int32_t from = 0; from < n; from += chunk) {
      const int32_t c = std::min(chunk, n - from);
      std::vector<int32_t> indptr(size_t(s_.batch) + 1), positions;
      for (int32_t b = 0; b <= s_.batch; ++b) indptr[size_t(b)] = b * c;
      if (c != uploaded) qo.buf->upload(indptr.data(), indptr.size() * 4), uploaded = c;
      for (int32_t b = 0; b < s_.batch; ++b)
        for (int32_t i = 0; i < c; ++i) positions.push_back(from + i);
      int64_t qs[3] = {int64_t(c) * s_.batch, s_.hq, s_.d}, ks[3] = {int64_t(c) * s_.batch, s_.hkv, s_.d};
      DLTensor qt = make_view(q.t.data, s_.device, s_.dtype, 3, qs), kt = make_view(k.t.data, s_.device, s_.dtype, 3, ks),
               vt = make_view(v.t.data, s_.device, s_.dtype, 3, ks);
      for (int32_t L = 0; L < s_.layers; ++L) {
        if (s_.similar) {
          // Same context in every layer (the generator is per sequence, not per layer).
          if (L == 0) {
            const size_t qr = size_t(s_.hq) * s_.d * dtype_bytes(s_.dtype), kr = size_t(s_.hkv) * s_.d * dtype_bytes(s_.dtype);
            for (int32_t b = 0; b < s_.batch; ++b) {
              const SimilarContext& sc = (*similar_)[size_t(b)];
              copy_tokens(q.t.data, size_t(b) * c * qr, sc.q, from, c, qr);
              copy_tokens(k.t.data, size_t(b) * c * kr, sc.k, from, c, kr);
              copy_tokens(v.t.data, size_t(b) * c * kr, sc.v, from, c, kr);
            }
          }
        } else {
          const uint64_t seed = s_.seed * 1000003u + uint64_t(L) * 7919u + uint64_t(from) * 31u;
          fill_random(services_, k.t.data, s_.dtype, sieve::numel(kt), seed);
          fill_random(services_, v.t.data, s_.dtype, sieve::numel(kt), seed + 1);
          fill_random(services_, q.t.data, s_.dtype, sieve::numel(qt), seed + 2);
        }
        runtime::LayerInputs in;
        in.layer = L;
        in.phase = s_.fill_phase;
        in.step = 0;
        in.batch = s_.batch;
        in.seq_ids = seq_ids_.data();
        in.qo_indptr_host = indptr.data();
        in.qo_indptr = &qo.t;
        in.positions_host = positions.data();
        in.q = &qt;
        in.q_pre_rope = (needs_ & SIEVE_NEEDS_PRE_ROPE_Q) ? &qt : nullptr;
        in.k = &kt;
        in.v = &vt;
        in.k_pre_rope = (needs_ & SIEVE_NEEDS_PRE_ROPE_K) ? &kt : nullptr;  // synthetic: no rotation
        std::string err;
        if (runner_->append_only(in, &err) != SIEVE_OK) fail(SIEVE_ERR_INTERNAL, "context fill: " + err);
      }
    }
    for (auto& l : logical_) l += n;
    std::string err;
    if (runner_->end_step(s_.fill_phase, 0, seq_ids_.data(), s_.batch, &err) != SIEVE_OK)
      fail(SIEVE_ERR_INTERNAL, "context fill: " + err);
    require(services_.synchronize(&err), SIEVE_ERR_DEVICE, err);
  }

  // The timed call's inputs: n_new tokens per sequence (the next positions).
  void make_inputs() {
    const int64_t n = int64_t(s_.batch) * s_.n_new;
    q_ = std::make_unique<Tensor>(services_, std::vector<int64_t>{n, s_.hq, s_.d}, s_.dtype);
    out_ = std::make_unique<Tensor>(services_, std::vector<int64_t>{n, s_.hq, s_.d}, s_.dtype);
    k_ = std::make_unique<Tensor>(services_, std::vector<int64_t>{n, s_.hkv, s_.d}, s_.dtype);
    v_ = std::make_unique<Tensor>(services_, std::vector<int64_t>{n, s_.hkv, s_.d}, s_.dtype);
    if (s_.similar) {
      // Token n_fill() on of each sequence's generated context (fill() made n_fill + n_new).
      require(similar_ && similar_->size() == size_t(s_.batch), SIEVE_ERR_INTERNAL, "no similar-key context");
      const size_t qr = size_t(s_.hq) * s_.d * dtype_bytes(s_.dtype), kr = size_t(s_.hkv) * s_.d * dtype_bytes(s_.dtype);
      const size_t at = size_t(s_.n_fill());
      for (int32_t b = 0; b < s_.batch; ++b) {
        const SimilarContext& sc = (*similar_)[size_t(b)];
        copy_tokens(q_->t.data, size_t(b) * s_.n_new * qr, sc.q, int64_t(at), s_.n_new, qr);
        copy_tokens(k_->t.data, size_t(b) * s_.n_new * kr, sc.k, int64_t(at), s_.n_new, kr);
        copy_tokens(v_->t.data, size_t(b) * s_.n_new * kr, sc.v, int64_t(at), s_.n_new, kr);
      }
    } else {
      fill_random(services_, q_->t.data, s_.dtype, q_->numel(), s_.seed * 77 + 1);
      fill_random(services_, k_->t.data, s_.dtype, k_->numel(), s_.seed * 77 + 2);
      fill_random(services_, v_->t.data, s_.dtype, v_->numel(), s_.seed * 77 + 3);
    }
    qo_host_.resize(size_t(s_.batch) + 1);
    for (int32_t b = 0; b <= s_.batch; ++b) qo_host_[size_t(b)] = b * s_.n_new;
    qo_ = std::make_unique<Tensor>(services_, std::vector<int64_t>{s_.batch + 1}, kI32);
    qo_->buf->upload(qo_host_.data(), qo_host_.size() * 4);
  }

  // One step over all layers (the timed call), then end_step.
  void step(uint64_t step_no) {
    positions_.clear();
    for (int32_t b = 0; b < s_.batch; ++b)
      for (int32_t i = 0; i < s_.n_new; ++i) positions_.push_back(logical_[size_t(b)] + i);
    for (int32_t L = 0; L < s_.layers; ++L) run_layer(L, step_no);
    finish(step_no);
  }
  void run_layer(int32_t L, uint64_t step_no) {
    runtime::LayerInputs in;
    in.layer = L;
    in.phase = s_.phase;
    in.step = step_no;
    in.batch = s_.batch;
    in.seq_ids = seq_ids_.data();
    in.qo_indptr_host = qo_host_.data();
    in.qo_indptr = &qo_->t;
    in.positions_host = positions_.data();
    in.q = &q_->t;
    in.q_pre_rope = (needs_ & SIEVE_NEEDS_PRE_ROPE_Q) ? &q_->t : nullptr;
    in.k = &k_->t;
    in.v = &v_->t;
    in.k_pre_rope = (needs_ & SIEVE_NEEDS_PRE_ROPE_K) ? &k_->t : nullptr;
    std::string err;
    if (runner_->run_layer(in, &out_->t, &err) != SIEVE_OK) fail(SIEVE_ERR_INTERNAL, err);
  }
  void finish(uint64_t step_no) {
    std::string err;
    if (runner_->end_step(s_.phase, step_no, seq_ids_.data(), s_.batch, &err) != SIEVE_OK) fail(SIEVE_ERR_INTERNAL, err);
    for (auto& l : logical_) l += s_.n_new;
  }

  // An untimed step with the selections recorded; before its end_step, the core kernel alone
  // is timed on that step's views (with the recorded selections, and dense) over `reps` samples.
  void recorded_step(uint64_t step_no, int reps, Result* r) {
    positions_.clear();
    for (int32_t b = 0; b < s_.batch; ++b)
      for (int32_t i = 0; i < s_.n_new; ++i) positions_.push_back(logical_[size_t(b)] + i);
    poison_output();
    runner_->set_record_selections(true);
    for (int32_t L = 0; L < s_.layers; ++L) run_layer(L, step_no);
    runner_->set_record_selections(false);
    check_output();
    std::vector<int32_t> logical_after = logical_;
    for (auto& l : logical_after) l += s_.n_new;

    std::vector<sieve_paged_kv> views(size_t(s_.layers));
    std::vector<std::unique_ptr<Buffer>> sel_bufs;
    std::vector<sieve_selection> sels(size_t(s_.layers));
    std::vector<std::array<int64_t, 2>> shapes(size_t(s_.layers));
    double att = 0;
    int64_t resident = 0, logical_total = 0;
    for (int32_t L = 0; L < s_.layers; ++L) {
      require(store_.api->view(store_.store, L, seq_ids_.data(), s_.batch, &views[size_t(L)]) == SIEVE_OK,
              SIEVE_ERR_INTERNAL, store_.api->last_error(store_.store));
      const runtime::SelectionSnapshot& snap = runner_->selection_used(L);
      att += attended_fraction(snap, views[size_t(L)], s_, logical_after);
      for (int32_t b = 0; b < s_.batch; ++b) {
        resident += kernels::kv_len(views[size_t(L)], b);
        logical_total += logical_after[size_t(b)];
      }
      if (L == 0) r->selection = describe(snap);
      sieve_selection& sel = sels[size_t(L)];
      sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
      sel.kind = snap.kind;
      if (snap.kind == SIEVE_SEL_ALL) continue;
      sel.heads = snap.heads;
      sel.q_block = snap.q_block;
      sel.k_block_pages = snap.k_block_pages;
      sel.n_rows = snap.n_rows;
      auto ip = std::make_unique<Buffer>(services_, snap.indptr.size() * 4);
      auto ix = std::make_unique<Buffer>(services_, std::max<size_t>(snap.indices.size(), 1) * 4);
      ip->upload(snap.indptr.data(), snap.indptr.size() * 4);
      if (!snap.indices.empty()) ix->upload(snap.indices.data(), snap.indices.size() * 4);
      shapes[size_t(L)] = {int64_t(snap.indptr.size()), int64_t(std::max<size_t>(snap.indices.size(), 1))};
      sel.indptr = make_view(ip->get(), s_.device, kI32, 1, &shapes[size_t(L)][0]);
      sel.indices = make_view(ix->get(), s_.device, kI32, 1, &shapes[size_t(L)][1]);
      sel.capacity = shapes[size_t(L)][1];
      sel_bufs.push_back(std::move(ip));
      sel_bufs.push_back(std::move(ix));
    }
    r->attended = att / s_.layers;
    r->resident_fraction = logical_total ? double(resident) / double(logical_total) : 1.0;

    const sieve_host_services* hs = services_.table();
    auto core = [&](bool sparse) {
      Timer timer(services_);
      std::vector<double> ms;
      for (int rep = 0; rep < reps + 1; ++rep) {
        timer.start();
        for (int32_t L = 0; L < s_.layers; ++L) {
          sieve_attention_args a = kernels::make_attention_args(s_.phase, s_.hq, s_.hkv, s_.d, &q_->t, &out_->t,
                                                                &qo_->t, qo_host_.data(), &views[size_t(L)]);
          a.selection = sparse && sels[size_t(L)].kind != SIEVE_SEL_ALL ? &sels[size_t(L)] : nullptr;
          if (hs->kernels->attend(hs->host_ctx, &a) != SIEVE_OK)
            fail(SIEVE_ERR_INTERNAL, std::string("core kernel alone: ") + hs->kernels->last_error(hs->host_ctx));
        }
        const double t = timer.stop_ms();
        if (rep > 0) ms.push_back(t);  // the first is a warm-up
      }
      return median(ms);
    };
    r->core_ms = core(true);
    r->core_dense_ms = core(false);
    finish(step_no);
    store_.api->bytes_in_use(store_.store, &r->kv_bytes);
  }

  const Shape& shape() const { return s_; }

 private:
  // All-ones bytes (NaN in f32, f16 and bf16) in the output, so a row nobody writes shows.
  void poison_output() {
    const size_t bytes = size_t(out_->numel()) * dtype_bytes(s_.dtype);
    std::vector<unsigned char> ones(std::min<size_t>(bytes, size_t(64) << 20), 0xff);
    for (size_t at = 0; at < bytes; at += ones.size()) {
      std::string err;
      require(services_.copy(static_cast<char*>(out_->t.data) + at, s_.device, ones.data(), kCpu,
                             std::min(ones.size(), bytes - at), &err),
              SIEVE_ERR_DEVICE, err);
    }
  }

  // The chain's output of the last layer must be finite and not all zero (at most 4M values read).
  void check_output() {
    const int64_t n = std::min<int64_t>(out_->numel(), int64_t(1) << 22);
    std::vector<unsigned char> host(size_t(n) * dtype_bytes(s_.dtype));
    std::string err;
    require(services_.copy(host.data(), kCpu, out_->t.data, s_.device, host.size(), &err), SIEVE_ERR_DEVICE, err);
    int64_t bad = 0, nonzero = 0;
    for (int64_t i = 0; i < n; ++i) {
      const float x = load_float(host.data(), s_.dtype, i);
      bad += !std::isfinite(x);
      nonzero += x != 0.f;
    }
    if (bad || !nonzero)
      fail(SIEVE_ERR_INTERNAL, "output check: " + std::to_string(bad) + " non-finite and " + std::to_string(nonzero) +
                                   " non-zero of " + std::to_string(n) + " values");
  }

  // Tokens [from, from + n) of a generated context (repeated with its period) to the device.
  void copy_tokens(void* dst_dev, size_t dst_off, const HostTensor& src, int64_t from, int64_t n, size_t row_bytes) {
    const int64_t period = src.dl().shape[0];
    std::string err;
    while (n > 0) {
      const int64_t at = from % period, run = std::min(n, period - at);
      require(services_.copy(static_cast<char*>(dst_dev) + dst_off, s_.device,
                             static_cast<const char*>(src.dl().data) + size_t(at) * row_bytes, kCpu,
                             size_t(run) * row_bytes, &err),
              SIEVE_ERR_DEVICE, err);
      dst_off += size_t(run) * row_bytes;
      from += run;
      n -= run;
    }
  }

  Shape s_;
  HostServices& services_;
  sieve_geometry g_{};
  uint32_t needs_ = 0;
  StoreHandle store_;
  std::unique_ptr<runtime::LayerRunner> runner_;
  std::vector<int32_t> seq_ids_, logical_, qo_host_, positions_;
  std::unique_ptr<Tensor> q_, out_, k_, v_, qo_;
  const std::vector<SimilarContext>* similar_ = nullptr;
};

Result measure(const Shape& s, const std::string& label, const runtime::ChainSpec& spec,
               const runtime::Registry& registry, HostServices& services, const PolicyOptions& o,
               const std::vector<SimilarContext>* similar) {
  Result r;
  r.chain = label;
  services.clear_metrics();
  try {
    std::vector<double> ms;
    if (!s.prefill()) {
      Case c(s, spec, registry, services, similar);
      c.fill(s.ctx);
      c.make_inputs();
      Timer timer(services);
      uint64_t step = 1;
      for (int i = 0; i < o.warmup + o.steps; ++i, ++step) {
        timer.start();
        c.step(step);
        const double t = timer.stop_ms();
        if (i >= o.warmup) ms.push_back(t);
      }
      c.recorded_step(step, o.steps, &r);
    } else {
      for (int sample = 0; sample <= o.samples; ++sample) {
        Case c(s, spec, registry, services, similar);
        c.fill(s.n_fill());
        c.make_inputs();
        if (sample == 0) {  // warm-up: also records the selections for the core-only time
          c.recorded_step(0, o.samples, &r);
          continue;
        }
        Timer timer(services);
        timer.start();
        c.step(0);
        ms.push_back(timer.stop_ms());
      }
    }
    r.samples = int(ms.size());
    r.step_ms = median(ms);
    r.step_min_ms = *std::min_element(ms.begin(), ms.end());
    r.step_max_ms = *std::max_element(ms.begin(), ms.end());
    r.metrics = services.metrics();
  } catch (const Error& e) {
    r.error = e.what();
  } catch (const std::exception& e) {
    r.error = e.what();
  }
  std::string ignored;
  services.synchronize(&ignored);
  return r;
}

// ---- options ----------------------------------------------------------------------------------

const char kUsage[] =
    "usage: %s --policy [options]\n"
    "Times a whole layer step through the runtime (KV append + chain hooks + core attention) on a\n"
    "synthetic geometry, for each --chain against dense, with the core kernel alone on the chain's\n"
    "selection (selection overhead = step - core). docs/bench/policy.md explains every number.\n"
    "  --phase decode|prefill       (decode)\n"
    "  --chain SPEC                 a chain (repeatable): 'decode:*=quest(token_budget=2048)', or bare\n"
    "                               'streaming(window=1024)' for every layer; dense always runs first\n"
    "  --layers N --hq N --hkv N --d N --page N    geometry (1, 32, 8, 128, 16)\n"
    "  --dtype bf16|f16|f32         K/V, q and out (bf16)\n"
    "  --device cuda|cpu            (cuda when there is one)\n"
    "  --ctx N,N,...                tokens per sequence in the cache (32768)\n"
    "  --batch N,N,...              sequences (1)\n"
    "  --new N                      prefill: the timed call is the last N tokens (default all)\n"
    "  --keys random|similar[:cos]  K/V/q: hash-random, or long_context.hpp with that adjacent-key\n"
    "                               cosine (default 0.9; generated on the host, one thread per sequence)\n"
    "  --similar-period N           ... N tokens generated per sequence, repeated along the context\n"
    "                               (16384; 0: the whole context, ~1 s per 1K tokens of 32q/8kv d128)\n"
    "  --fill decode|prefill        whose on_append hooks see the context (default: the timed phase)\n"
    "  --steps N --warmup N         decode steps timed / untimed before them (20, 3)\n"
    "  --samples N                  prefill calls timed, each on a freshly filled store (3)\n"
    "  --min-q-block N              prefill: selection buffers sized for query blocks >= N (16)\n"
    "  --seed N                     (1)\n"
    "  --check                      the runner's checks on (selections, finite outputs): to debug a\n"
    "                               plugin; its host copies are then inside the timed step\n"
    "  --sdpa                       also time PyTorch SDPA on the dense shape (bench/sdpa_reference.py)\n"
    "  --sdpa-script PATH --python EXE\n"
    "  --memory-fraction F          skip sizes needing more than F of the free memory (0.9)\n"
    "  --plugin-dir DIR             searched first (repeatable); then SIEVE_PLUGIN_PATH, <exe>/../lib/sieve/plugins\n"
    "  --json FILE                  every number, the device, date and command line\n";

bool parse_int_list(const std::string& s, std::vector<int32_t>* out) {
  out->clear();
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    const std::string part = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end || v < 1 || v > (1L << 30)) return false;
    out->push_back(int32_t(v));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return !out->empty();
}

bool parse_int(const std::string& s, int64_t lo, int64_t hi, int64_t* out) {
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

int policy_main(int argc, char** argv, int first, const char* prog) {
  PolicyOptions o;
  o.command = prog;  // as a shell would take it back: arguments with other characters quoted
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                         "0123456789_./=:,+-@%") == std::string::npos;
    o.command += " " + (plain ? a : "'" + a + "'");
  }
  auto bad = [&](const std::string& m) {
    std::fprintf(stderr, "%s --policy: %s\n", prog, m.c_str());
    return 2;
  };
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i], val;
    bool has_val = false;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_val = true;
    }
    auto value = [&]() -> const std::string& {
      if (!has_val) {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        val = argv[++i];
        has_val = true;
      }
      return val;
    };
    auto int_opt = [&](int64_t lo, int64_t hi) {
      int64_t v = 0;
      if (!parse_int(value(), lo, hi, &v))
        throw std::invalid_argument(a + " '" + val + "': expected an integer in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "]");
      return v;
    };
    try {
      if (a == "--policy") {
      } else if (a == "--help" || a == "-h") {
        std::printf(kUsage, prog);
        return 0;
      } else if (a == "--phase") {
        o.phase = value();
        if (o.phase != "decode" && o.phase != "prefill") return bad("--phase '" + o.phase + "': decode or prefill");
      } else if (a == "--chain") {
        o.chains.push_back(value());
      } else if (a == "--layers") {
        o.layers = int32_t(int_opt(1, 1024));
      } else if (a == "--hq") {
        o.hq = int32_t(int_opt(1, 1024));
      } else if (a == "--hkv") {
        o.hkv = int32_t(int_opt(1, 1024));
      } else if (a == "--d") {
        o.d = int32_t(int_opt(1, 1024));
      } else if (a == "--page") {
        o.page = int32_t(int_opt(1, 4096));
      } else if (a == "--dtype") {
        o.dtype = value();
      } else if (a == "--device") {
        o.device = value();
      } else if (a == "--ctx" || a == "--batch") {
        if (!parse_int_list(value(), a == "--ctx" ? &o.ctx : &o.batch))
          return bad(a + " '" + val + "': expected positive integers separated by commas");
      } else if (a == "--new") {
        o.new_tokens = int32_t(int_opt(1, 1 << 30));
      } else if (a == "--keys") {
        o.keys = value();
      } else if (a == "--similar-period") {
        o.similar_period = int32_t(int_opt(0, 1 << 30));
      } else if (a == "--fill") {
        o.fill = value();
        if (o.fill != "decode" && o.fill != "prefill") return bad("--fill '" + o.fill + "': decode or prefill");
      } else if (a == "--steps") {
        o.steps = int32_t(int_opt(1, 100000));
      } else if (a == "--warmup") {
        o.warmup = int32_t(int_opt(0, 100000));
      } else if (a == "--samples") {
        o.samples = int32_t(int_opt(1, 100000));
      } else if (a == "--min-q-block") {
        o.min_q_block = int32_t(int_opt(1, 1 << 20));
      } else if (a == "--seed") {
        o.seed = uint64_t(int_opt(0, INT64_MAX));
      } else if (a == "--check") {
        o.check = true;
      } else if (a == "--sdpa") {
        o.sdpa = true;
      } else if (a == "--sdpa-script") {
        o.sdpa_script = value();
        o.sdpa = true;
      } else if (a == "--python") {
        o.python = value();
      } else if (a == "--memory-fraction") {
        char* end = nullptr;
        o.memory_fraction = std::strtod(value().c_str(), &end);
        if (*end || !(o.memory_fraction > 0 && o.memory_fraction <= 1)) return bad("--memory-fraction '" + val + "': in (0, 1]");
      } else if (a == "--plugin-dir") {
        o.plugin_dirs.push_back(value());
      } else if (a == "--json") {
        o.json_out = value();
      } else {
        return bad("unknown argument '" + a + "' (--help lists the options)");
      }
      if (has_val && a == "--policy") return bad("--policy takes no value");
    } catch (const std::invalid_argument& e) {
      return bad(e.what());
    }
  }
  return run_policy_bench(o);
}

int run_policy_bench(const PolicyOptions& o) {
  auto bad = [](const std::string& m) {
    std::fprintf(stderr, "sieve_bench --policy: %s\n", m.c_str());
    return 2;
  };
  Shape base;
  base.phase = o.phase == "prefill" ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
  base.layers = o.layers, base.hq = o.hq, base.hkv = o.hkv, base.d = o.d, base.page = o.page;
  if (o.hq % o.hkv != 0) return bad("--hq " + std::to_string(o.hq) + " must be a multiple of --hkv " + std::to_string(o.hkv));
  if (o.dtype == "bf16") base.dtype = kBF16;
  else if (o.dtype == "f16") base.dtype = kF16;
  else if (o.dtype == "f32") base.dtype = kF32;
  else return bad("--dtype '" + o.dtype + "': bf16, f16 or f32");
  std::string device = o.device;
  if (device.empty()) device = runtime::cuda_devices() > 0 ? "cuda" : "cpu";
  if (device == "cuda") {
    if (runtime::cuda_devices() == 0) return bad("--device cuda: no CUDA device (or this build has no CUDA); use --device cpu");
    base.device = DLDevice{kDLCUDA, 0};
  } else if (device != "cpu") {
    return bad("--device '" + device + "': cuda or cpu");
  }
  if (o.keys == "random") {
  } else if (o.keys.rfind("similar", 0) == 0) {
    base.similar = true;
    if (o.keys.size() > 7) {
      char* end = nullptr;
      if (o.keys[7] != ':') return bad("--keys '" + o.keys + "': random, similar or similar:COS");
      base.key_cos = std::strtod(o.keys.c_str() + 8, &end);
      if (*end || !(base.key_cos > 0 && base.key_cos < 1)) return bad("--keys '" + o.keys + "': the cosine must be in (0, 1)");
    }
  } else {
    return bad("--keys '" + o.keys + "': random, similar or similar:COS");
  }
  base.fill_phase = o.fill.empty() ? base.phase : uint32_t(o.fill == "prefill" ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE);
  base.min_q_block = o.min_q_block;
  base.seed = o.seed;
  base.check = o.check;
  base.extra = base.prefill() ? 0 : o.warmup + o.steps + 1;

  // Chains: dense (empty) first, then the user's.
  std::vector<std::pair<std::string, runtime::ChainSpec>> chains;
  chains.emplace_back("dense", runtime::ChainSpec{});
  for (const auto& text : o.chains) {
    runtime::ChainSpec cs;
    std::string error;
    if (!runtime::parse_chain_argument(text, &cs, &error)) return bad("--chain '" + text + "': " + error);
    chains.emplace_back(text, std::move(cs));
  }

  runtime::DiscoveryOptions dopt;
  dopt.plugin_dirs = o.plugin_dirs;
  runtime::Registry registry = runtime::Registry::discover(dopt);
  for (const auto& m : registry.missing_dirs()) return bad("plugin directory '" + m + "' does not exist");
  for (const auto& f : registry.failures()) std::fprintf(stderr, "sieve_bench --policy: not loaded: %s\n", f.reason.c_str());

  std::unique_ptr<HostServices> services;
  try {
    services = std::make_unique<HostServices>(base.device);
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  std::string device_desc = device_name(base.device);
#ifdef SIEVE_WITH_CUDA
  if (base.device.device_type == kDLCUDA) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) device_desc = prop.name;
  }
#endif
  if (base.device.device_type == kDLCPU) device_desc = "cpu (" + std::to_string(host_threads()) + " threads)";

  std::vector<Shape> shapes;
  for (int32_t ctx : o.ctx)
    for (int32_t b : o.batch) {
      Shape s = base;
      s.ctx = ctx;
      s.batch = b;
      s.n_new = s.prefill() ? (o.new_tokens > 0 ? std::min(o.new_tokens, ctx) : ctx) : 1;
      shapes.push_back(s);
    }
  // Every chain must resolve (names, parameters, phases, devices) before anything runs.
  for (const auto& [label, spec] : chains) {
    runtime::ResolvedChains rc;
    if (std::string e = resolve(spec, registry, geometry_of(shapes.front()), &rc); !e.empty())
      return bad("--chain '" + label + "': " + e);
  }
  auto shape_name = [&](const Shape& s) {
    return "policy/" + o.phase + "/" + std::to_string(s.hq) + "q" + std::to_string(s.hkv) + "kv" + std::to_string(s.d) +
           "/bs" + std::to_string(s.batch) + "/ctx" + std::to_string(s.ctx) + "/" + o.dtype;
  };

  // PyTorch SDPA first, in its own process (it frees the GPU when it exits).
  Report sdpa;
  nlohmann::json sdpa_note;
  if (o.sdpa) {
    if (base.device.device_type != kDLCUDA) {
      sdpa_note = "SDPA runs only with --device cuda";
    } else {
      nlohmann::json cases = nlohmann::json::array();
      for (const Shape& s : shapes)
        if (s.n_new == (s.prefill() ? s.ctx : 1))
          cases.push_back({{"shape", shape_name(s)}, {"phase", o.phase}, {"n_q_heads", s.hq}, {"n_kv_heads", s.hkv},
                           {"head_dim", s.d}, {"batch", s.batch}, {"context", s.ctx}, {"dtype", o.dtype},
                           {"samples", s.prefill() ? 5 : 15}});
      SuiteOptions so;
      so.python = o.python;
      so.sdpa_script = o.sdpa_script.empty() ? default_sdpa_script() : o.sdpa_script;
      nlohmann::json out;
      std::string err = cases.empty() ? "no shape SDPA can run (prefill with --new < ctx)" : run_sdpa_script(so, cases, &out);
      if (err.empty()) err = merge_sdpa(sdpa, out);
      if (!err.empty()) {
        std::fprintf(stderr, "sieve_bench --policy: no PyTorch SDPA column: %s\n", err.c_str());
        sdpa_note = err;
      }
    }
  }

  std::printf("== Sieve policy step, %s, %s: %s, %d layer(s), %dq/%dkv d%d, page %d, %s, keys %s, context through the %s chain's on_append\n",
              today_utc().c_str(), device_desc.c_str(), o.phase.c_str(), o.layers, o.hq, o.hkv, o.d, o.page,
              o.dtype.c_str(), o.keys.c_str(), base.fill_phase == SIEVE_PHASE_PREFILL ? "prefill" : "decode");
  std::printf("%8s %5s %-44s %10s %10s %8s %10s %10s %9s %9s %9s\n", "ctx", "batch", "chain", "step ms", "dense ms",
              "x dense", "core ms", "select ms", "attended", "resident", "x SDPA");
  nlohmann::json rows = nlohmann::json::array();
  bool failed = false;
  for (const Shape& s : shapes) {
    const double need = estimate_bytes(s, true), have = available_bytes(s.device) * o.memory_fraction;
    auto row_json = [&](const Result& r, double dense_ms) {
      nlohmann::json j = {{"phase", o.phase}, {"chain", r.chain}, {"context", s.ctx}, {"batch", s.batch},
                          {"new_tokens", s.n_new}, {"layers", s.layers}, {"n_q_heads", s.hq}, {"n_kv_heads", s.hkv},
                          {"head_dim", s.d}, {"page_size", s.page}, {"dtype", o.dtype}, {"device", device_desc},
                          {"keys", o.keys}, {"shape", shape_name(s)}};
      if (!r.skipped.empty()) j["skipped"] = r.skipped;
      if (!r.error.empty()) j["error"] = r.error;
      if (r.skipped.empty() && r.error.empty()) {
        j["step_ms"] = r.step_ms;
        j["step_min_ms"] = r.step_min_ms;
        j["step_max_ms"] = r.step_max_ms;
        j["samples"] = r.samples;
        j["dense_step_ms"] = dense_ms;
        j["speedup_vs_dense"] = dense_ms > 0 ? dense_ms / r.step_ms : 0.0;
        j["core_ms"] = r.core_ms;
        j["core_dense_ms"] = r.core_dense_ms;
        j["selection_overhead_ms"] = r.step_ms - r.core_ms;
        j["attended_fraction"] = r.attended;
        j["resident_fraction"] = r.resident_fraction;
        j["kv_bytes"] = r.kv_bytes;
        j["selection"] = r.selection;
        auto it = sdpa.sdpa.find(shape_name(s));
        if (it != sdpa.sdpa.end() && it->second.best_ms > 0) {
          j["sdpa_ms"] = it->second.best_ms;
          j["sdpa_variant"] = it->second.best_variant;
          j["sdpa_per_layer"] = true;
          j["speedup_vs_sdpa"] = it->second.best_ms * s.layers / r.step_ms;
        }
        nlohmann::json m = nlohmann::json::object();
        for (const auto& [name, v] : r.metrics) m[name] = {{"mean", v.mean()}, {"min", v.min}, {"max", v.max}, {"count", v.count}};
        if (!m.empty()) j["metrics"] = m;
      }
      return j;
    };
    if (need > have) {
      char why[256];
      std::snprintf(why, sizeof why, "needs ~%.1f GB, %.1f GB usable on %s", need / 1e9, have / 1e9, device_desc.c_str());
      std::printf("%8d %5d %-44s skipped: %s\n", s.ctx, s.batch, "(all chains)", why);
      for (const auto& [label, spec] : chains) {
        Result r;
        r.chain = label;
        r.skipped = why;
        rows.push_back(row_json(r, 0));
      }
      continue;
    }
    // --keys similar: every sequence's context generated once (host), shared by the chains.
    std::vector<SimilarContext> similar;
    if (s.similar) {
      const auto t0 = Clock::now();
      // One thread per sequence (the generator is serial); a period of --similar-period tokens.
      const int32_t n = s.n_fill() + s.n_new, period = o.similar_period > 0 ? std::min(n, o.similar_period) : n;
      similar.resize(size_t(s.batch));
      std::vector<std::string> errors(size_t(s.batch));
      std::vector<std::thread> workers;
      for (int32_t b = 0; b < s.batch; ++b) {
        workers.emplace_back([&, b] {
          try {
            similar[size_t(b)] = make_similar(s, b, period);
          } catch (const std::exception& e) {
            errors[size_t(b)] = e.what();
          }
        });
        if (int(workers.size()) >= std::max(1, host_threads()) || b + 1 == s.batch) {
          for (auto& w : workers) w.join();
          workers.clear();
        }
      }
      for (const auto& e : errors)
        if (!e.empty()) return bad(std::string("--keys ") + o.keys + ": " + e);
      std::fprintf(stderr, "similar-key context for ctx %d x batch %d generated in %.1f s\n", s.ctx, s.batch,
                   std::chrono::duration<double>(Clock::now() - t0).count());
    }
    double dense_ms = 0;
    for (const auto& [label, spec] : chains) {
      Result r = measure(s, label, spec, registry, *services, o, s.similar ? &similar : nullptr);
      if (label == "dense" && r.error.empty()) dense_ms = r.step_ms;
      rows.push_back(row_json(r, dense_ms));
      if (!r.error.empty()) {
        failed = true;
        std::printf("%8d %5d %-44s FAILED: %s\n", s.ctx, s.batch, label.c_str(), r.error.c_str());
        continue;
      }
      const nlohmann::json& j = rows.back();
      std::printf("%8d %5d %-44s %10.4f %10.4f %8s %10.4f %10.4f %8.2f%% %8.2f%% %9s\n", s.ctx, s.batch,
                  label.size() > 44 ? (label.substr(0, 41) + "...").c_str() : label.c_str(), r.step_ms, dense_ms,
                  dense_ms > 0 ? fmt("%.2fx", dense_ms / r.step_ms).c_str() : "-", r.core_ms, r.step_ms - r.core_ms,
                  100 * r.attended, 100 * r.resident_fraction,
                  j.contains("speedup_vs_sdpa") ? fmt("%.2fx", j["speedup_vs_sdpa"].get<double>()).c_str() : "-");
    }
  }
  std::printf(
      "step ms: median over %d %s of every layer's run_layer (append + hooks + attention) + end_step; core ms: the core\n"
      "kernel alone on the selection the chain used (dense: on all keys); select ms = step - core (estimate, top-k,\n"
      "append, host work); attended: attended / causal keys; resident: tokens kept / appended (eviction).%s\n",
      base.prefill() ? o.samples : o.steps, base.prefill() ? "calls (--samples)" : "steps", o.sdpa ? " x SDPA: PyTorch SDPA (one layer, dense) x layers / step." : "");

  if (!o.json_out.empty()) {
    nlohmann::json meta = {{"benchmark", "policy_step"}, {"device", device_desc}, {"date", today_utc()},
                           {"command", o.command}, {"phase", o.phase}, {"layers", o.layers},
                           {"n_q_heads", o.hq}, {"n_kv_heads", o.hkv}, {"head_dim", o.d}, {"page_size", o.page},
                           {"dtype", o.dtype}, {"keys", o.keys},
                           {"fill_phase", base.fill_phase == SIEVE_PHASE_PREFILL ? "prefill" : "decode"},
                           {"steps", o.steps}, {"warmup", o.warmup}, {"samples", o.samples}, {"runner_checks", o.check},
                           {"decode_store_growth_tokens", base.prefill() ? 0 : o.warmup + o.steps + 1},
                           {"host_threads", host_threads()}};
    if (!sdpa.sdpa_meta.empty()) meta["sdpa"] = sdpa.sdpa_meta;
    if (!sdpa_note.is_null()) meta["sdpa_note"] = sdpa_note;
    std::ofstream f(o.json_out);
    f << nlohmann::json{{"meta", meta}, {"results", rows}}.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "sieve_bench --policy: cannot write %s\n", o.json_out.c_str());
      return 1;
    }
  }
  return failed ? 1 : 0;
}

}  // namespace sieve::bench
