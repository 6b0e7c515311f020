// dpxa: block-sparse prefill whose tile mask comes from a cheap estimate of each tile's attention
// mass (paper 001 §4.3 "delta-based tile scoring", with XAttention §2.5 and naive striding as the
// baselines), as a prefill selection policy.
//
// Method, per sequence, query head h and query block t (B = `block` query tokens, positions
// [first, last]), over the candidate key blocks j = 0 .. last / B (B tokens = B / page_size pages):
//   1. score every candidate tile (t, j) from a sample of its logits (dpxa_tiles.hpp):
//        estimator=dpxa    delta anchors of the query block (per q head) and of the key block
//                          (per KV head), cosine threshold `threshold`; Σ e^(q_a·k_b/√d) over the
//                          anchor pairs (no dimension expansion);
//        estimator=xattn   XAttention's antidiagonal: groups of S = `stride` tokens concatenated
//                          along the head dimension, K reversed, logits scaled by 1/(√d·S);
//        estimator=stride  every S-th query against every S-th key (the paper's ablation);
//   2. normalise the row: w_j = tile mass / Σ_j' tile mass (a softmax over key blocks);
//   3. keep the sink block (j = 0) and the diagonal blocks (those holding [first, last]), then
//      the other tiles in decreasing w (ties: lower j first) until the kept w reaches τ.
// τ is per (layer, q head) from `thresholds` (a file `sieve calibrate dpxa` writes), `tau` where
// the file has no entry. rows=q_head: one selection row per q head (XAttention's per-head
// masks); rows=kv_head: one per KV head, the union of its group's masks (the core kernel then
// shares each K/V tile across the group). The core block-sparse prefill kernel computes the tiles.
//
// mode=deltax (DeltaXAttention, §4.2, its own unit: deltax_attention.hpp): the same kept tiles,
// but attend computes them itself, most of them over Delta-KV packed keys.
//
// Hooks: select (prefill), attend (mode=deltax only: a mode=select instance declares select alone
// through instance_hooks, so the host's core block-sparse kernel computes its tiles and the chain
// checks do not count it as replacing that kernel).
//
// This file is the policy: schema, checks, and the hooks' dispatch to the drivers. select on the
// CPU: cpu/select_cpu.cpp over math/dpxa_math.cpp; on CUDA: cuda/select_driver.cpp over
// cuda/dpxa_select.cu (anchors, tile scores, per-row greedy, CSR), all on the host's stream with
// scratch allocated in create. Both paths share dpxa_tiles.hpp's arithmetic and produce the
// same selection, except that 16-bit Q/K are scored on tensor cores (f32 sums in the tensor core's order), which can flip a tile whose share
// ties another's, or τ, to ~1e-6 (docs/methods/dpxa.md).
// Host services: alloc/free, cuda_stream, log, metric
// ("dpxa_density": kept / causal tiles, "dpxa_sampled": sampled logits / causal logits; mode=deltax:
// "deltax_kv_reduction" per q head and layer, "deltax_packed" per layer; all CPU only: on CUDA
// they would need a stream synchronisation per layer).
#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/tensor.hpp>

#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "call_data.hpp"
#include "cpu/select_cpu.hpp"
#include "deltax_attention.hpp"
#include "math/dpxa_math.hpp"
#if SIEVE_WITH_CUDA
#include "cuda/select_driver.hpp"
#endif

namespace {

namespace sp = sieve::plugin;
namespace sd = sieve::dpxa;

#if SIEVE_WITH_CUDA
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU;
#endif

constexpr int32_t kMaxBlock = 256;  // anchor offsets are bytes

class DpxaPolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_param_spec kParams[] = {
      sp::enum_param("estimator", "dpxa", "dpxa|xattn|stride",
                     "tile scorer: delta anchors, XAttention antidiagonal, or naive stride"),
      sp::int_param("block", "128", 16, kMaxBlock,
                    "query and key block tokens (a multiple of page_size)"),
      sp::float_param("threshold", "0.75", -1, 1,
                      "dpxa: cosine below which a query/key becomes a new anchor"),
      sp::int_param("stride", "0", 0, 64, "xattn/stride: S (0: 8 for xattn, 4 for stride)"),
      sp::float_param("tau", "0.9", 0, 1,
                      "kept share of the estimated row mass (where thresholds has no entry)"),
      sp::string_param("thresholds", "",
                       "file of `layer head tau` lines (sieve calibrate dpxa); empty: tau"),
      sp::enum_param("rows", "q_head", "q_head|kv_head",
                     "one selection row per query head, or per KV head (union of the group)"),
      sp::enum_param("mode", "select", "select|deltax",
                     "select: the core kernel computes the kept tiles; deltax: DeltaXAttention "
                     "(packed K/V in most kept off-diagonal tiles)"),
      sp::float_param("exact_top", "0.1", 0, 1,
                      "deltax: share of the kept off-diagonal tiles (by score) computed exactly "
                      "besides the diagonal and sink tiles"),
      sp::float_param("pack_threshold", "0.83", -1, 1,
                      "deltax: a key with cosine < pack_threshold to its run's anchor becomes an "
                      "anchor (Delta-KV's rule, per key block); in (-1, 1]"),
  };
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "dpxa",
      .vendor = "sieve",
      .version_major = 1,
      .version_minor = 0,
      .version_patch = 0,
      .summary = "DPXA block-sparse prefill: delta-anchor tile scores (or XAttention), greedy "
                 "mass cover",
      .phases = SIEVE_PHASE_PREFILL,
      .devices = kDevices,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_Q_HEAD,
      .needs = 0,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_STATIC_SHAPES,
      .conform_params = "block=64",
      .selection_basis = SIEVE_SELECTION_BASIS_CONTENT,
      // Every CPU and CUDA path reads pages through the view's strides and byte_offset.
      .kv_layouts = SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
  };
#ifdef SIEVE_PLUGIN_TOOLS
  static constexpr sieve_tool kTools[] = {sp::module_tool<SIEVE_TOOL_MODULE, "sieve_dpxa_calibrate">(
      "calibrate", "per-(layer, head) tau so the kept tiles cover a target share of the exact mass")};
#endif

  static void validate(const sieve_geometry& g, const sp::Params& p, sp::Reasons& r) {
    const int64_t block = p.integer("block");
    if (g.page_size > 0 && block % g.page_size)
      r.invalid("block = ", block, " is not a multiple of page_size = ", g.page_size,
                " (a key block is block / page_size whole pages)");
    const int64_t stride = p.integer("stride");
    if (stride > block) r.invalid("stride = ", stride, " exceeds block = ", block);
    if (g.device.device_type == kDLCUDA) {
      if (g.head_dim > 256) r.unsupported("head_dim = ", g.head_dim, " > 256 on CUDA");
      if (block * g.head_dim > 49152)
        r.unsupported("block x head_dim = ", block * g.head_dim,
                      " > 49152 on CUDA (a query block is staged in shared memory as f32)");
      if (g.n_q_heads > 256) r.unsupported("n_q_heads = ", g.n_q_heads, " > 256 on CUDA");
    }
    const std::string_view path = p.text("thresholds");
    if (!path.empty()) {
      sd::Thresholds t;
      const std::string e = sd::load_thresholds(std::string(path), g.n_layers, g.n_q_heads, t);
      if (!e.empty()) r.invalid("thresholds: ", e);
    }
    if (p.choice("mode") == kDeltax) {
      // At -1 the cosine rule could never start a run (cos >= -1 always): refuse it rather
      // than silently packing each block into one key.
      if (!(p.real("pack_threshold") > -1.0))
        r.invalid("pack_threshold = ", p.real("pack_threshold"), " is outside (-1, 1]");
    }
    const int64_t q_blocks = (int64_t(g.max_seq_len) + block - 1) / block + 1;
    if (int64_t(g.max_batch) * q_blocks * g.n_q_heads > INT32_MAX)
      r.unsupported("max_batch x query blocks x heads exceeds the int32 row count");
  }

  explicit DpxaPolicy(const sp::CreateContext& ctx) : PolicyBase(ctx) {
    const sieve_geometry& g = geometry();
    const sp::Params& p = ctx.params;
    sd::Config& cfg = select_.cfg;
    cfg.estimator = sd::Estimator(p.choice("estimator"));
    cfg.block = int32_t(p.integer("block"));
    cfg.q_threshold = cfg.k_threshold = float(p.real("threshold"));
    const int32_t s = int32_t(p.integer("stride"));
    cfg.stride = s ? s : cfg.estimator == sd::kXattn ? 8 : 4;
    cfg.scale = 1.0f / std::sqrt(float(g.head_dim));
    select_.tau = float(p.real("tau"));
    select_.per_kv_head = p.choice("rows") == 1;
    select_.thresholds = &thresholds_;
    const std::string path(p.text("thresholds"));
    if (!path.empty()) {
      const std::string e = sd::load_thresholds(path, g.n_layers, g.n_q_heads, thresholds_);
      if (!e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "thresholds: ", e);
    }
    const sd::Allocate device_memory = [this](size_t bytes) { return allocate(geometry().device, bytes); };
    const bool deltax = p.choice("mode") == kDeltax;
    if (deltax)
      deltax_ = std::make_unique<sd::DeltaXAttention>(g, cfg, select_.per_kv_head, float(p.real("exact_top")),
                                                      float(p.real("pack_threshold")), device_memory);
    // mode=select only selects: the host's core kernel computes its tiles (ABI 1.1).
    use_hooks(deltax ? SIEVE_HOOK_SELECT | SIEVE_HOOK_ATTEND : SIEVE_HOOK_SELECT);
#if SIEVE_WITH_CUDA
    if (g.device.device_type == kDLCUDA) cuda_ = std::make_unique<sd::CudaSelect>(g, cfg.block, device_memory);
#endif
    log_debug("estimator = ", sd::estimator_name(cfg.estimator), ", block = ", cfg.block,
              ", threshold = ", cfg.q_threshold, ", stride = ", cfg.stride, ", tau = ", select_.tau,
              path.empty() ? "" : ", thresholds = ", path, ", mode = ", p.text("mode"),
              deltax ? ", exact_top = " : "", deltax ? std::to_string(p.real("exact_top")) : "",
              deltax ? ", pack_threshold = " : "", deltax ? std::to_string(p.real("pack_threshold")) : "");
  }

  void select(const sieve_layer_call& call, sieve_selection& selection, uint32_t&) override {
    const sieve_geometry& g = geometry();
    if (call.phase != SIEVE_PHASE_PREFILL)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "dpxa selects prefill blocks only, phase is ",
               call.phase);
    if (call.batch < 0 || call.batch > g.max_batch)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "batch = ", call.batch, " is outside [0, max_batch = ",
               g.max_batch, "]");
    sp::require_struct(call.kv_view, "KV view");
    const sieve_paged_kv& view = *call.kv_view;
    if (view.page_size != g.page_size)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV view has page_size ", view.page_size,
               ", the policy was created for ", g.page_size);
    if (view.batch != call.batch)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV view has ", view.batch,
               " sequences, the call has ", call.batch);
    if (call.batch > 0 && (!call.kv_len_host || !call.qo_indptr_host || !view.indptr_host ||
                           !view.last_page_len_host || !call.q))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT,
               "q, kv_len_host, qo_indptr_host or the view's host page table is NULL");
    const int32_t B = select_.cfg.block;
    const int32_t H = select_.per_kv_head ? g.n_kv_heads : g.n_q_heads;
    int64_t n_rows = 0, worst_nnz = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      const int64_t kv_len = call.kv_len_host[b];
      if (n_new < 0 || n_new > kv_len)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sequence ", b, " has ", n_new,
                 " queries but kv_len ", kv_len);
      if (kv_len != sp::view_tokens(view, b))
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "kv_len_host[", b, "] = ", kv_len,
                 " but the KV view holds ", sp::view_tokens(view, b), " tokens");
      const int32_t blocks = int32_t((n_new + B - 1) / B);
      for (int32_t t = 0; t < blocks; ++t)
        worst_nnz += int64_t(sd::row_span(kv_len, n_new, B, t).n_candidates) * H;
      n_rows += int64_t(blocks) * H;
    }
    if (n_rows > INT32_MAX)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, n_rows, " selection rows exceed the int32 row count");

    if (g.device.device_type == kDLCPU) {
      cpu_.run(g, select_, call, view, int32_t(n_rows), services(), deltax_ ? &deltax_->cpu_shares() : nullptr);
      int64_t nnz = 0;
      for (const auto& r : cpu_.rows()) nnz += int64_t(r.size());
      sp::check_selection_storage(selection, n_rows, nnz, g.device);
      auto* indptr = sieve::data_ptr<int32_t>(selection.indptr);
      auto* indices = sieve::data_ptr<int32_t>(selection.indices);
      int64_t off = 0;
      indptr[0] = 0;
      for (size_t r = 0; r < size_t(n_rows); ++r) {
        for (int32_t j : cpu_.rows()[r]) indices[off++] = j;
        indptr[r + 1] = int32_t(off);
      }
    } else {
      // The device writes the lists without telling the host their length, so the storage must
      // hold the worst case (every candidate kept).
      sp::check_selection_storage(selection, n_rows, worst_nnz, g.device);
#if SIEVE_WITH_CUDA
      const sd::DeviceShares shares = deltax_ ? deltax_->device_shares() : sd::DeviceShares{};
      cuda_->run(g, select_, call, view, selection, cuda_stream(), deltax_ ? &shares : nullptr);
#else
      sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of dpxa has no CUDA code");
#endif
    }
    if (deltax_) deltax_->selected(call.layer, int32_t(n_rows));
    selection.kind = SIEVE_SEL_BLOCKS;
    selection.heads = select_.per_kv_head ? SIEVE_SEL_PER_KV_HEAD : SIEVE_SEL_PER_Q_HEAD;
    selection.q_block = B;
    selection.k_block_pages = B / g.page_size;
    selection.n_rows = int32_t(n_rows);
  }

  // mode=deltax only (instance_hooks): a host that calls it for mode=select breaks the ABI.
  void attend(const sieve_layer_call& call, const sieve_selection& selection, DLTensor& out) override {
    if (!deltax_)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "attend called on a mode=select instance, whose "
               "instance_hooks name select only");
    deltax_->attend(call, selection, out, services(), cuda_stream());
  }

 private:
  static constexpr uint32_t kDeltax = 1;  // mode's choice index

  sd::SelectConfig select_;
  sd::Thresholds thresholds_;
  sd::CpuSelect cpu_;
#if SIEVE_WITH_CUDA
  std::unique_ptr<sd::CudaSelect> cuda_;  // on a CUDA geometry
#endif
  std::unique_ptr<sd::DeltaXAttention> deltax_;  // mode=deltax
};

}  // namespace

SIEVE_DEFINE_PLUGIN(DpxaPolicy);
