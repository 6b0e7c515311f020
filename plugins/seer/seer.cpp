// seer: SeerAttention-R (Gao et al., "Sparse attention adaptation for long reasoning", paper 002)
// as a decode selection policy with a learned, self-distilled AttnGate.
//
// Method (§2.2, §3): keys are grouped in blocks of `block` tokens. When a block completes, its
// pre-RoPE keys are pooled (max, min, mean -> 3d), projected by the layer's W_k, optionally
// RMS-normalised and rotated by RoPE at the block's first position: the block's entry in the
// K-compression cache. At each decode step the GQA group's pre-RoPE queries (g*d) are projected
// by W_q, optionally normalised and rotated at the query's position; the scores q_gate . k_gate /
// sqrt(d_gate) over the complete blocks pick, per KV head (shared by the group):
//   the last block (the one holding the current token; partial or just completed) always, and
//   mode=budget    the top token_budget/block - 1 other blocks by score (deterministic ties);
//   mode=threshold every complete block whose softmax probability exceeds `threshold`;
//   mode=oracle    as budget/threshold, but scored by the TRUE block attention (max over the
//                  group's heads of the max softmax probability inside the block, §2.3 / §4.2),
//                  computed densely from the post-RoPE q and K: the gate's upper bound. CPU only.
// The selection is a list of key blocks per (sequence, KV head): PER_KV_HEAD rows with
// k_block_pages = block / page_size (block must be a multiple of page_size).
//
// weights=builtin:mean (gate/builtin_gate.hpp) replaces the distilled gate by a training-free
// baseline on any geometry: what `sieve conform` runs with no arguments (conform_params).
//
// K-compression cache (§3.2): a KV-store sidecar "seer.kcomp" of gate_dim + 1 floats per
// (page, KV head). A block's vector lives in the sidecar of its FIRST page (a block spans
// block/page_size pages); the extra float is a "filled" flag (the store zeroes sidecars when it
// allocates a page). on_append fills every complete block whose flag is clear, scanning back from
// the newest complete block and stopping at the first filled one: a block becomes visible to the
// gate exactly when its last token is appended, prefill fills every complete block when seer is
// in the prefill chain (its prefill select is a no-op), and a decode-only chain catches up the
// prefill's blocks at its first step. Seer assumes no other policy evicts pages of the layer
// (select checks the view holds every token).
//
// Hooks: on_append (cache), select. Core kernels: block-sparse paged decode over the selection.
// CUDA: cuda/seer_driver.cpp (weights upload, scratch, launches) over cuda/seer_kernels.cu; this
// file holds the checks both devices share and the CPU path.
// Host services: alloc (CUDA scratch), cuda_stream, log. Shared code: the gate math
// (plugins/seer/gate), the top-k of core/selection (same items on CPU and CUDA).
#include <sieve/plugin/policy_api.hpp>
#include <sieve/selection/top_k.hpp>
#include <sieve/util/error.hpp>
#include <sieve/util/page_layout.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gate/block_truth.hpp"
#include "gate/builtin_gate.hpp"
#include "gate/gate_file.hpp"
#include "gate/gate_math.hpp"
#if SIEVE_WITH_CUDA
#include <memory>

#include "cuda/seer_driver.hpp"
#endif

namespace {

namespace sp = sieve::plugin;
namespace sg = sieve::seer;
namespace sel = sieve::selection;

#if SIEVE_WITH_CUDA
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU;
#endif

enum Mode : uint32_t { kBudget = 0, kThreshold = 1, kOracle = 2 };

class SeerPolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_param_spec kParams[] = {
      sp::string_param("weights", "",
                       "gate weights (safetensors from `sieve distill-gate`), or builtin:mean (a "
                       "training-free baseline: group-mean query . block-mean key, no RoPE); not "
                       "needed for mode=oracle"),
      sp::int_param("block", "64", 16, 128, "tokens per key block: 16, 32, 64 or 128 (a multiple of page_size)"),
      sp::enum_param("mode", "budget", "budget|threshold|oracle",
                     "budget: top token_budget/block-1 blocks; threshold: softmax score > threshold; "
                     "oracle: true block attention (CPU)"),
      sp::int_param("token_budget", "2048", 1, INT32_MAX, "tokens attended per KV head (mode budget/oracle)"),
      sp::float_param("threshold", "0.005", 0.0, 1.0, "softmax gate score a block must exceed (mode threshold)"),
      sp::bool_param("rmsnorm", "false", "RMSNorm inside the gate (must match the weights file)"),
      sp::bool_param("fused", "true",
                     "CUDA: the decode step's cache update and block offsets folded into the gate query "
                     "kernel (2 launches fewer); false: the first implementation (for comparison)"),
  };
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "seer",
      .vendor = "sieve",
      .version_major = 1,
      .version_minor = 0,
      .version_patch = 0,
      .summary = "SeerAttention-R: learned AttnGate over pooled pre-RoPE key blocks, per-KV-head block top-k",
      .phases = SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE,
      .devices = kDevices,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_KV_HEAD,
      .needs = SIEVE_NEEDS_PRE_ROPE_K | SIEVE_NEEDS_PRE_ROPE_Q | SIEVE_NEEDS_WEIGHTS_FILE | SIEVE_NEEDS_SIDECARS,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_STATIC_SHAPES,
      .conform_params = "weights=builtin:mean,block=64,token_budget=256",
      .selection_basis = SIEVE_SELECTION_BASIS_CONTENT,
      // Every CPU and CUDA path reads pages through the view's strides and byte_offset.
      .kv_layouts = SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
  };
#ifdef SIEVE_PLUGIN_TOOLS
  static constexpr sieve_tool kTools[] = {sp::module_tool<SIEVE_TOOL_MODULE, "sieve_seer_distill_gate">(
      "distill-gate", "self-distil a SeerAttention-R gate for a model (this plugin's weights file)")};
#endif

  static void validate(const sieve_geometry& g, const sp::Params& p, sp::Reasons& r) {
    const int64_t block = p.integer("block");
    const uint32_t mode = p.choice("mode");
    if (block != 16 && block != 32 && block != 64 && block != 128)
      r.invalid("block = ", block, " is not one of 16, 32, 64, 128");
    else if (block % g.page_size != 0)
      r.invalid("block = ", block, " is not a multiple of page_size = ", g.page_size,
                " (a key block is block/page_size whole pages)");
    if (mode == kOracle && g.device.device_type != kDLCPU)
      r.unsupported("mode=oracle runs on CPU only: it computes dense attention probabilities on the host "
                    "(use device cpu for the oracle upper bound)");
    const int64_t blocks = (int64_t(g.max_seq_len) + block - 1) / block;
    if (int64_t(g.max_batch) * g.n_kv_heads * blocks > INT32_MAX)
      r.unsupported("max_batch x n_kv_heads x blocks exceeds the int32 selection size");
    if (mode == kOracle) return;
    const std::string path(p.text("weights"));
    if (sg::is_builtin_gate(path)) {
      if (std::string why = sg::builtin_gate_problem(path); !why.empty()) r.invalid(why);
      return;
    }
    if (path.empty()) {
      r.invalid("weights is empty: mode=", p.text("mode"),
                " needs a gate file (make one with `sieve distill-gate --model M --out F`), or use mode=oracle");
      return;
    }
    try {
      const sg::GateShape shape = sg::read_gate_shape(path);
      for (const std::string& why : sg::gate_mismatch(shape, g, int32_t(block), p.boolean("rmsnorm"))) r.invalid(why);
    } catch (const sieve::Error& e) {
      r.add(e.status() == SIEVE_ERR_NOT_FOUND ? SIEVE_ERR_INVALID_ARGUMENT : e.status(), std::string("weights: ") + e.what());
    }
  }

  explicit SeerPolicy(const sp::CreateContext& ctx)
      : PolicyBase(ctx),
        block_(int32_t(ctx.params.integer("block"))),
        mode_(ctx.params.choice("mode")),
        token_budget_(ctx.params.integer("token_budget")),
        threshold_(float(ctx.params.real("threshold"))),
        rmsnorm_(ctx.params.boolean("rmsnorm")),
        fused_(ctx.params.boolean("fused")) {
    const sieve_geometry& g = geometry();
    block_pages_ = block_ / g.page_size;
    group_ = g.n_q_heads / g.n_kv_heads;
    max_blocks_ = (g.max_seq_len + block_ - 1) / block_;
    const int64_t k = token_budget_ / block_ - 1;
    top_k_ = int32_t(std::clamp<int64_t>(k, 0, max_blocks_));
    if (mode_ != kOracle) {
      const std::string weights(ctx.params.text("weights"));
      builtin_ = sg::is_builtin_gate(weights);
      weights_ = builtin_ ? sg::builtin_gate(weights, g, block_, rmsnorm_) : sg::read_gate(weights);
      gate_dim_ = weights_.shape.gate_dim;
      if (!ctx.kv || !ctx.kv_api || !ctx.kv_api->register_sidecar)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "seer keeps its K-compression cache in a KV-store sidecar: no store given");
      // One cache per instance: several seer instances on one store (e.g. a prefill and a decode
      // rule, or layer ranges with different budgets) each register their own sidecar.
      static std::atomic<int> instances{0};
      const int n = instances.fetch_add(1);
      sidecar_name_ = n == 0 ? "seer.kcomp" : "seer.kcomp." + std::to_string(n);
      sieve_sidecar_desc d{};
      d.hdr = SIEVE_HEADER_INIT(sieve_sidecar_desc);
      d.name = sidecar_name_.c_str();
      d.dtype = sieve::kF32;
      d.elems_per_head = gate_dim_ + 1;
      if (sieve_status st = ctx.kv_api->register_sidecar(ctx.kv, &d, &slot_); st != SIEVE_OK)
        sp::fail(st, "register_sidecar '", sidecar_name_, "': ",
                 ctx.kv_api->last_error ? ctx.kv_api->last_error(ctx.kv) : "(no message)");
    }
    // Host scratch, sized here so the hooks never allocate.
    const size_t rows = size_t(g.max_batch) * g.n_kv_heads;
    scores_.resize(rows * size_t(max_blocks_));
    block_indptr_.resize(size_t(g.max_batch) + 1);
    top_scratch_.resize(size_t(max_blocks_) + 1);
    pooled_.resize(size_t(3 * g.head_dim));
    q_group_.resize(size_t(group_ * g.head_dim));
    gate_vec_.resize(size_t(std::max(gate_dim_, 1)));
    truth_.resize(size_t(max_blocks_));
    filled_once_.assign(size_t(g.n_layers), 0);
    logits_.reserve(size_t(g.max_seq_len));
#if SIEVE_WITH_CUDA
    if (g.device.device_type == kDLCUDA && mode_ != kOracle) {  // validate refuses the oracle on CUDA
      sg::CudaGateConfig c;
      c.block = block_;
      c.gate_dim = gate_dim_;
      c.top_k = top_k_;
      c.rmsnorm = rmsnorm_;
      c.fused = fused_;
      c.threshold = mode_ == kThreshold;
      c.threshold_value = threshold_;
      c.rope_theta = gate_theta();
      cuda_ = std::make_unique<sg::SeerCuda>(g, weights_, c, max_blocks_,
                                             [this](size_t bytes) { return allocate(geometry().device, bytes); });
    }
#endif
    log_debug("block = ", block_, " (", block_pages_, " pages), mode = ", ctx.params.text("mode"),
              ", top-k = ", top_k_, ", gate_dim = ", gate_dim_);
  }

  void on_append(const sieve_layer_call& call, const sieve_kv_append&) override {
    if (mode_ == kOracle) return;
#if SIEVE_WITH_CUDA
    // A decode step's one token per sequence completes at most one block, which select's gate
    // query kernel fills before the scores (select always follows on_append in a step; a host
    // that only appends has its blocks filled by the next select). The layer's first call still
    // launches the parallel fill: a decode-only chain catches up the prefill's blocks there,
    // not one block after the other in select.
    if (geometry().device.device_type == kDLCUDA && fused_cuda() && call.phase == SIEVE_PHASE_DECODE &&
        one_token_each(call) && call.layer >= 0 && call.layer < geometry().n_layers &&
        filled_once_[size_t(call.layer)])
      return;
#endif
    const sieve_paged_kv& view = checked_view(call);
    if (!view.k_pre_rope_pages.data)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT,
               "the KV store keeps no pre-RoPE keys (seer declares SIEVE_NEEDS_PRE_ROPE_K; create the store with "
               "keep_pre_rope_k = 1)");
    DLTensor side = sidecar(call.layer);
#if SIEVE_WITH_CUDA
    if (geometry().device.device_type == kDLCUDA) {
      filled_once_[size_t(call.layer)] = 1;
      return cuda_->fill_cache(call, side, cuda_stream());
    }
#endif
    fill_cache_cpu(call, view, side);
  }

  void select(const sieve_layer_call& call, sieve_selection& selection, uint32_t&) override {
    if (call.phase == SIEVE_PHASE_PREFILL) return;  // prefill runs the chain's selection; on_append filled the cache
    if (call.phase != SIEVE_PHASE_DECODE)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "phase ", call.phase, " is neither prefill nor decode");
    const sieve_geometry& g = geometry();
    const sieve_paged_kv& view = checked_view(call);
    for (int32_t b = 0; b < call.batch; ++b)
      if (call.qo_indptr_host[b + 1] - call.qo_indptr_host[b] != 1)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "decode has one query per sequence, sequence ", b, " has ",
                 call.qo_indptr_host[b + 1] - call.qo_indptr_host[b]);
    if (mode_ != kOracle) {
      if (!call.q_pre_rope)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT,
                 "the host passed no pre-RoPE queries (seer declares SIEVE_NEEDS_PRE_ROPE_Q)");
      if (std::string e = sieve::check_tensor(call.q_pre_rope, "q_pre_rope", 3,
                                              {call.qo_indptr_host[call.batch], g.n_q_heads, g.head_dim});
          !e.empty())
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    }
    // Blocks per sequence (the selection's key blocks) as a CSR over the batch.
    block_indptr_[0] = 0;
    for (int32_t b = 0; b < call.batch; ++b)
      block_indptr_[size_t(b) + 1] = block_indptr_[size_t(b)] + int32_t((call.kv_len_host[b] + block_ - 1) / block_);
    const int32_t hkv = g.n_kv_heads;
    const int64_t n_rows = int64_t(call.batch) * hkv;

#if SIEVE_WITH_CUDA
    if (g.device.device_type == kDLCUDA) {
      cuda_->select(call, sidecar(call.layer), block_indptr_.data(),
                    sel::top_k_capacity_needed(topk_batch(call.batch)), selection, n_rows, cuda_stream());
      finish(selection, n_rows);
      return;
    }
#endif
    if (mode_ == kOracle) oracle_scores_cpu(call, view);
    else gate_scores_cpu(call, view);

    auto* indptr = sieve::data_ptr<int32_t>(selection.indptr);
    auto* indices = sieve::data_ptr<int32_t>(selection.indices);
    if (mode_ == kThreshold) {
      int64_t nnz = 0;
      for (int pass = 0; pass < 2; ++pass) {  // count (capacity check before writing), then write
        int64_t offset = 0;
        if (pass == 1) indptr[0] = 0;
        for (int32_t b = 0; b < call.batch; ++b)
          for (int32_t h = 0; h < hkv; ++h) {
            const int32_t nb = block_indptr_[size_t(b) + 1] - block_indptr_[size_t(b)];
            const float* s = scores_.data() + int64_t(block_indptr_[size_t(b)]) * hkv + h;
            for (int32_t j = 0; j < nb; ++j)
              if (j == nb - 1 || s[int64_t(j) * hkv] > threshold_) {
                if (pass == 1) indices[offset] = j;
                ++offset;
              }
            if (pass == 1) indptr[b * hkv + h + 1] = int32_t(offset);
          }
        if (pass == 0) {
          nnz = offset;
          sp::check_selection_storage(selection, n_rows, nnz, g.device);
        }
      }
    } else {
      const sel::TopKBatch batch = topk_batch(call.batch);
      sp::check_selection_storage(selection, n_rows, sel::top_k_capacity_needed(batch), g.device);
      sel::top_k_batch_cpu(batch, indptr, indices, top_scratch_.data());
    }
    finish(selection, n_rows);
  }

 private:
  bool fused_cuda() const { return fused_ && mode_ != kOracle; }

  static bool one_token_each(const sieve_layer_call& call) {
    if (!call.qo_indptr_host) return false;
    for (int32_t b = 0; b < call.batch; ++b)
      if (call.qo_indptr_host[b + 1] - call.qo_indptr_host[b] != 1) return false;
    return true;
  }

  sel::TopKBatch topk_batch(int32_t batch) const {
    sel::TopKBatch t{};
    t.scores = scores_.data();
    t.layout = {geometry().n_kv_heads, 1};  // scores [blocks of the batch, n_kv_heads]
    t.seg_indptr = block_indptr_.data();
    t.n_segments = batch;
    t.rows_per_segment = geometry().n_kv_heads;
    t.head = 0;
    t.tail = 1;  // the block holding the current token
    t.k = top_k_;
    return t;
  }

  void finish(sieve_selection& selection, int64_t n_rows) const {
    selection.kind = SIEVE_SEL_BLOCKS;
    selection.heads = SIEVE_SEL_PER_KV_HEAD;
    selection.q_block = 1;
    selection.k_block_pages = block_pages_;
    selection.n_rows = int32_t(n_rows);
  }

  const sieve_paged_kv& checked_view(const sieve_layer_call& call) const {
    const sieve_geometry& g = geometry();
    if (call.batch < 0 || call.batch > g.max_batch)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "batch = ", call.batch, " is outside [0, max_batch = ", g.max_batch, "]");
    if (call.layer < 0 || call.layer >= g.n_layers)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "layer ", call.layer, " is outside [0, ", g.n_layers, ")");
    sp::require_struct(call.kv_view, "KV view");
    const sieve_paged_kv& view = *call.kv_view;
    if (view.page_size != g.page_size)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV view has page_size ", view.page_size, ", the policy was created for ",
               g.page_size);
    if (view.batch != call.batch)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV view has ", view.batch, " sequences, the call has ", call.batch);
    if (call.batch > 0 && (!call.kv_len_host || !call.qo_indptr_host || !view.indptr_host || !view.last_page_len_host ||
                           !call.positions_host))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "kv_len_host, qo_indptr_host, positions_host or the view's host page table is NULL");
    for (int32_t b = 0; b < call.batch; ++b) {
      if (call.kv_len_host[b] != sp::view_tokens(view, b))
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "kv_len_host[", b, "] = ", call.kv_len_host[b], " but the KV view holds ",
                 sp::view_tokens(view, b), " tokens (seer's blocks assume no page of the layer was evicted)");
      if (call.kv_len_host[b] > g.max_seq_len)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sequence ", b, " holds ", call.kv_len_host[b], " tokens, max_seq_len is ",
                 g.max_seq_len);
    }
    return view;
  }

  DLTensor sidecar(int32_t layer) const {
    DLTensor t{};
    if (!kv() || !kv_api() || !kv_api()->sidecar)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "no KV store: seer's K-compression cache lives in a store sidecar");
    if (sieve_status st = kv_api()->sidecar(kv(), layer, slot_, &t); st != SIEVE_OK)
      sp::fail(st, "sidecar '", sidecar_name_, "' of layer ", layer, ": ", kv_api()->last_error ? kv_api()->last_error(kv()) : "");
    const sieve_geometry& g = geometry();
    if (!t.data || t.ndim != 3 || t.shape[1] != g.n_kv_heads || t.shape[2] != gate_dim_ + 1 ||
        !sieve::same_dtype(t.dtype, sieve::kF32) || !sieve::is_contiguous(t))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sidecar '", sidecar_name_, "' of layer ", layer, " is not a contiguous f32 [pages, ",
               g.n_kv_heads, ", ", gate_dim_ + 1, "] tensor");
    return t;
  }

  // ---- CPU ------------------------------------------------------------------------------------
  // Where (physical page, KV head, slot) of a view's page tensor lives: its strides and
  // byte_offset in any layout kv_store.h allows (seer declares them all), one line otherwise.
  static sieve::PageStrides strides_of(const DLTensor& pages, const char* what) {
    sieve::PageStrides at;
    if (std::string e = sieve::page_strides(pages, what, &at); !e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    return at;
  }

  void fill_cache_cpu(const sieve_layer_call& call, const sieve_paged_kv& view, const DLTensor& side) {
    const sieve_geometry& g = geometry();
    const int32_t d = g.head_dim, P = g.page_size, hkv = g.n_kv_heads;
    const int32_t* pages = sieve::data_ptr<const int32_t>(view.indices);
    const void* kpre = sieve::data_ptr<const void>(view.k_pre_rope_pages);
    const DLDataType dt = view.k_pre_rope_pages.dtype;
    const sieve::PageStrides at = strides_of(view.k_pre_rope_pages, "the pre-RoPE key pages");
    float* cache = sieve::data_ptr<float>(side);
    const int32_t stride = gate_dim_ + 1;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int32_t* seq_pages = pages + view.indptr_host[b];
      const int64_t complete = call.kv_len_host[b] / block_;
      for (int64_t j = complete - 1; j >= 0; --j) {
        const int32_t first_page = seq_pages[j * block_pages_];
        bool all_filled = true;
        for (int32_t h = 0; h < hkv; ++h) {
          float* entry = cache + (int64_t(first_page) * hkv + h) * stride;
          if (entry[gate_dim_] == 1.f) continue;
          all_filled = false;
          auto key = [&](int32_t t, int32_t c) {
            const int64_t tok = j * block_ + t;
            return sieve::load_float(kpre, dt, at.row(seq_pages[tok / P], h, tok % P) + c);
          };
          sg::pool_block(key, block_, d, pooled_.data());
          sg::gate_key(weights_.wk_at(call.layer, h), pooled_.data(), d, gate_dim_, rmsnorm_, j * block_,
                       gate_theta(), entry);
          entry[gate_dim_] = 1.f;
        }
        if (all_filled) break;  // blocks fill in order: everything before is filled too
      }
    }
  }

  // scores_[(block_indptr[b] + j) * hkv + h] = gate score of complete block j; the last block of
  // a sequence is forced (tail) and gets -inf (never ranked). Threshold mode: softmax probability.
  void gate_scores_cpu(const sieve_layer_call& call, const sieve_paged_kv& view) {
    const sieve_geometry& g = geometry();
    const int32_t d = g.head_dim, hkv = g.n_kv_heads, gd = group_ * d;
    const DLTensor& qt = *call.q_pre_rope;
    const void* q = sieve::data_ptr<const void>(qt);
    const int32_t* pages = sieve::data_ptr<const int32_t>(view.indices);
    const float* cache = sieve::data_ptr<const float>(sidecar(call.layer));
    const int32_t stride = gate_dim_ + 1;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int32_t token = call.qo_indptr_host[b];
      const int32_t nb = block_indptr_[size_t(b) + 1] - block_indptr_[size_t(b)];
      const int64_t complete = call.kv_len_host[b] / block_;
      for (int32_t h = 0; h < hkv; ++h) {
        for (int32_t i = 0; i < gd; ++i)
          q_group_[size_t(i)] = sieve::load_float(q, qt.dtype, (int64_t(token) * g.n_q_heads + h * group_) * d + i);
        sg::gate_query(weights_.wq_at(call.layer, h), q_group_.data(), gd, gate_dim_, rmsnorm_,
                       call.positions_host[token], gate_theta(), gate_vec_.data());
        float* s = scores_.data() + int64_t(block_indptr_[size_t(b)]) * hkv + h;
        float mx = -INFINITY;
        for (int32_t j = 0; j < nb; ++j) {
          float v = -INFINITY;
          if (j < complete) {
            const float* entry = cache + (int64_t(pages[view.indptr_host[b] + j * block_pages_]) * hkv + h) * stride;
            if (entry[gate_dim_] != 1.f)
              sp::fail(SIEVE_ERR_INTERNAL, "layer ", call.layer, " sequence ", b, " block ", j,
                       " is complete but not in the K-compression cache (on_append did not run for this chain?)");
            v = sg::gate_score(gate_vec_.data(), entry, gate_dim_);
            mx = std::max(mx, v);
          }
          s[int64_t(j) * hkv] = v;
        }
        if (mode_ == kThreshold) softmax_complete(s, int32_t(complete), hkv, mx);
        if (nb > 0) s[int64_t(nb - 1) * hkv] = -INFINITY;  // forced, not ranked
      }
    }
  }

  static void softmax_complete(float* s, int32_t n, int32_t stride, float mx) {
    double sum = 0.0;
    for (int32_t j = 0; j < n; ++j) sum += std::exp(double(s[int64_t(j) * stride]) - mx);
    for (int32_t j = 0; j < n; ++j) s[int64_t(j) * stride] = float(std::exp(double(s[int64_t(j) * stride]) - mx) / sum);
  }

  // The true block attention (block_truth.hpp) from the post-RoPE q and K. Budget: ranked as is;
  // threshold: renormalised over the blocks other than the forced last one.
  void oracle_scores_cpu(const sieve_layer_call& call, const sieve_paged_kv& view) {
    const sieve_geometry& g = geometry();
    const int32_t d = g.head_dim, hkv = g.n_kv_heads, P = g.page_size;
    if (std::string e = sieve::check_tensor(call.q, "q", 3, {call.qo_indptr_host[call.batch], g.n_q_heads, d}); !e.empty())
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    const DLTensor& qt = *call.q;
    const void* q = sieve::data_ptr<const void>(qt);
    const int32_t* pages = sieve::data_ptr<const int32_t>(view.indices);
    const void* k = sieve::data_ptr<const void>(view.k_pages);
    const DLDataType kd = view.k_pages.dtype;
    const sieve::PageStrides at = strides_of(view.k_pages, "k_pages");
    for (int32_t b = 0; b < call.batch; ++b) {
      const int32_t token = call.qo_indptr_host[b];
      const int32_t nb = block_indptr_[size_t(b) + 1] - block_indptr_[size_t(b)];
      const int32_t* seq_pages = pages + view.indptr_host[b];
      for (int32_t h = 0; h < hkv; ++h) {
        auto qf = [&](int32_t gh, int32_t c) {
          return sieve::load_float(q, qt.dtype, (int64_t(token) * g.n_q_heads + h * group_ + gh) * d + c);
        };
        auto key = [&](int64_t t, int32_t c) {
          return sieve::load_float(k, kd, at.row(seq_pages[t / P], h, t % P) + c);
        };
        sg::block_truth(qf, key, group_, d, call.kv_len_host[b], block_, truth_.data(), nullptr, logits_);
        float* s = scores_.data() + int64_t(block_indptr_[size_t(b)]) * hkv + h;
        double sum = 0.0;
        for (int32_t j = 0; j + 1 < nb; ++j) sum += truth_[size_t(j)];
        for (int32_t j = 0; j < nb; ++j)
          s[int64_t(j) * hkv] = j + 1 == nb ? -INFINITY
                                : mode_ == kThreshold ? float(truth_[size_t(j)] / (sum > 0 ? sum : 1.0))
                                                      : truth_[size_t(j)];
      }
    }
  }

#if SIEVE_WITH_CUDA
  std::unique_ptr<sg::SeerCuda> cuda_;  // the CUDA path (cuda/seer_driver.hpp), on a CUDA geometry
#endif

  int32_t block_;
  uint32_t mode_;
  int64_t token_budget_;
  float threshold_;
  bool rmsnorm_;
  bool fused_;
  bool builtin_ = false;  // weights=builtin:...: a training-free gate without RoPE
  // RoPE base of the gate: the model's, or 0 (no rotation, gate_math.hpp) for a built-in gate.
  float gate_theta() const { return builtin_ ? 0.f : geometry().rope_theta; }
  int32_t block_pages_ = 1, group_ = 1, max_blocks_ = 1, top_k_ = 0, gate_dim_ = 0;
  int32_t slot_ = -1;
  std::string sidecar_name_;
  sg::GateWeights weights_;
  std::vector<float> scores_, pooled_, q_group_, gate_vec_, truth_;
  std::vector<int32_t> block_indptr_, top_scratch_;
  std::vector<char> filled_once_;  // per layer: a CUDA fill_cache has run (fused: later decode steps skip it)
  std::vector<double> logits_;
};

}  // namespace

SIEVE_DEFINE_PLUGIN(SeerPolicy);
