// delta_correction: the Δ-correction of a sparse prefill towards dense attention (paper 003,
// "Δ Attention"; the method as the authors' public code implements it, restated in issue 9).
//
// Method (prefill `correct` hook, after whatever sparse prefill the chain ran, output O*): for a
// sequence with s query rows, rows 0, γ, 2γ, ... < s_p (anchors) and every row of the tail
// [s_p, s) are recomputed with DENSE attention by the core kernel (query-row-sparse: q_rows,
// selection NULL), s_p = s − (s mod γ + max(tail, γ)) (correction_rows.hpp). Then
//   mode=delta:     Δ_a = O_dense(a) − O*(a) for each anchor a; every row j in [a, a+γ) becomes
//                   O*(j) + Δ_a (optionally blended linearly towards the next anchor's Δ with
//                   `interpolate`); tail rows are the dense rows;
//   mode=recompute: only the dense anchor and tail rows are swapped in (the paper's ablation:
//                   recomputing a sparse set of rows without propagating their correction).
// Δ is kept and applied in f32 whatever the output's dtype.
//
// How: O*(anchor) is saved into an f32 scratch [anchors, n_q_heads, head_dim] first; the dense
// call then writes straight into `out` (the kernel leaves rows outside q_rows untouched, so the
// anchors and the tail come out dense and every other row still holds O*); Δ = out − saved is
// formed in the scratch and added to the corrected rows. No full-size copy of the output.
//
// CUDA, anchor_kernel=tiled (default): the core's row kernel reads every key once per anchor row
// (memory-bound: Δ that way is only 2.2x faster than dense at 128K on an H100), so the far keys go through
// the core's tiled tensor-core prefill kernel instead — the anchors compacted into one causal
// prefill, a block of 32 anchors sharing every K/V tile over a block-sparse selection of the key
// blocks before the block's first anchor — and only their near keys through the row kernel; the
// two parts are merged by log-sum-exp; the tail runs as a compacted causal prefill (8.3x faster
// than dense at 128K; cuda/delta_apply.hpp). anchor_kernel=rows keeps the plain q_rows call.
//
// Hooks: correct (prefill). Core kernels: dense paged attention over q_rows; on CUDA also causal
// block-sparse prefill with lse (through the host). Host services: alloc/free (scratch, in
// create), kernels->attend, cuda_stream, metric ("dense_row_fraction"), log.
// CUDA (cuda/delta_apply.cu): row lists, selections, gathers, the merge, Δ and the update are
// kernels on the host's stream reading the lengths from the device qo_indptr and page table; no
// allocation or synchronisation in hooks.
// CUDA graphs: STATIC_SHAPES (launch sizes and the three core calls follow the host mirrors).
#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#include "correction_rows.hpp"
#if SIEVE_WITH_CUDA
#include "cuda/delta_apply.hpp"
#endif

namespace {

namespace sp = sieve::plugin;
namespace dc = sieve::delta_correction;

#if SIEVE_WITH_CUDA
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU;  // a CPU-only build has no CUDA correction kernels
#endif

enum Mode : uint32_t { kDelta = 0, kRecompute = 1 };

// Upper bound of dense rows (anchors + tail) of one sequence of at most `max_s` query rows.
int64_t max_dense_rows(int64_t max_s, int64_t gamma, int64_t tail) {
  const int64_t bound = max_s / gamma + 1 + gamma + std::max(tail, gamma);
  return std::min(max_s, bound);
}

class DeltaCorrectionPolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_param_spec kParams[] = {
      sp::int_param("gamma", "64", 1, INT32_MAX,
                    "anchor stride: every gamma-th query row is recomputed densely and corrects "
                    "the gamma rows from it"),
      sp::int_param("tail", "128", 0, INT32_MAX,
                    "last query rows recomputed densely (at least gamma + s mod gamma)"),
      sp::enum_param("mode", "delta", "delta|recompute",
                     "delta: add the anchor's correction to its rows; recompute: only swap in "
                     "the dense anchor and tail rows"),
      sp::bool_param("interpolate", "false",
                     "blend the corrections of consecutive anchors linearly across each block"),
      sp::enum_param("anchor_kernel", "tiled", "tiled|rows",
                     "CUDA: tiled = the anchors' far keys through the tiled prefill kernel, near "
                     "keys through the row kernel, merged by lse; rows = the row kernel over all "
                     "keys (the CPU always computes rows)"),
  };
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "delta_correction",
      .vendor = "sieve",
      .version_major = 1,
      .version_minor = 0,
      .version_patch = 0,
      .summary = "Δ-correction of a sparse prefill: dense anchor rows every gamma queries, their "
                 "output difference added to the rows they stand for, dense tail",
      .phases = SIEVE_PHASE_PREFILL,
      .devices = kDevices,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_SEQUENCE,
      .needs = 0,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_STATIC_SHAPES,
      .conform_params = nullptr,
      .selection_basis = SIEVE_SELECTION_BASIS_NONE,
      // Reads no K/V page itself (the core kernels do, honouring strides): any layout.
      .kv_layouts = SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
  };
#ifdef SIEVE_PLUGIN_TOOLS
  static constexpr sieve_tool kTools[] = {sp::module_tool<SIEVE_TOOL_MODULE, "sieve_delta_correction_diag">(
      "diag", "output cosine and attention-row Spearman of sparse / recompute / Δ prefill vs dense, per layer")};
#endif

  static void validate(const sieve_geometry& g, const sp::Params&, sp::Reasons& r) {
    // q_rows and the query-token indices are int32.
    const int64_t tokens = int64_t(g.max_batch) * g.max_seq_len;
    if (tokens > INT32_MAX)
      r.unsupported("max_batch x max_seq_len = ", tokens,
                    " query tokens exceed the int32 query-row indices");
  }

  explicit DeltaCorrectionPolicy(const sp::CreateContext& ctx)
      : PolicyBase(ctx),
        gamma_(ctx.params.integer("gamma")),
        tail_(ctx.params.integer("tail")),
        mode_(ctx.params.choice("mode")),
        interpolate_(ctx.params.boolean("interpolate")) {
    const sieve_geometry& g = geometry();
    const int64_t max_s = g.max_seq_len;
    max_dense_rows_ = int64_t(g.max_batch) * max_dense_rows(max_s, gamma_, tail_);
    max_anchors_ = int64_t(g.max_batch) * ((max_s + gamma_ - 1) / gamma_);
    row_elems_ = int64_t(g.n_q_heads) * g.head_dim;
    const DLDevice dev = g.device;
    q_rows_ = allocate(dev, sizeof(int32_t) * size_t(std::max<int64_t>(max_dense_rows_, 1)));
    if (mode_ == kDelta)
      saved_ = allocate(dev, sizeof(float) * size_t(std::max<int64_t>(max_anchors_, 1)) *
                                 size_t(row_elems_));
#if SIEVE_WITH_CUDA
    if (dev.device_type == kDLCUDA) {
      anchor_tokens_ = allocate(dev, sizeof(int32_t) * size_t(std::max<int64_t>(max_anchors_, 1)));
      seq_offsets_ = allocate(dev, sizeof(int32_t) * 2 * (size_t(g.max_batch) + 1));
      if (ctx.params.choice("anchor_kernel") == 0) allocate_tiled();
    }
#endif
    log_debug("gamma = ", gamma_, ", tail = ", tail_, ", mode = ", ctx.params.text("mode"),
              ", interpolate = ", interpolate_, ", scratch: ", max_dense_rows_, " rows, ",
              max_anchors_, " anchors");
  }

  void correct(const sieve_layer_call& call, const sieve_selection&, DLTensor& out) override {
    const sieve_geometry& g = geometry();
    if (call.phase != SIEVE_PHASE_PREFILL)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "delta_correction corrects prefill only (phase ",
               call.phase, ")");
    if (call.batch < 0 || call.batch > g.max_batch)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "batch = ", call.batch,
               " is outside [0, max_batch = ", g.max_batch, "]");
    if (call.batch > 0 && !call.qo_indptr_host)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "qo_indptr_host is NULL");
    sp::require_struct(call.kv_view, "KV view");
    const int32_t n_tokens = call.batch > 0 ? call.qo_indptr_host[call.batch] : 0;
    check_tensor(call.q, "q", n_tokens);
    check_tensor(&out, "out", n_tokens);

    // Dense rows and anchors of the batch, from the host mirror (sizes the launches).
    int64_t n_dense = 0, n_anchors = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t s = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      if (s < 0 || s > g.max_seq_len)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sequence ", b, " has ", s,
                 " query rows, outside [0, max_seq_len = ", g.max_seq_len, "]");
      const dc::SeqRows r = dc::seq_rows(s, gamma_, tail_);
      n_dense += r.dense_rows();
      n_anchors += r.anchors;
    }
    if (n_dense > max_dense_rows_ || n_anchors > max_anchors_)
      sp::fail(SIEVE_ERR_INTERNAL, n_dense, " dense rows / ", n_anchors,
               " anchors exceed the scratch sized at create (", max_dense_rows_, " / ",
               max_anchors_, ")");
    if (n_dense == 0) return;
    report_fraction(call, double(n_dense) / double(n_tokens));

    if (g.device.device_type == kDLCPU) correct_cpu(call, out, n_dense, n_anchors);
    else correct_cuda(call, out, n_dense, n_anchors);
  }

 private:
  void check_tensor(const DLTensor* t, const char* what, int32_t n_tokens) const {
    const sieve_geometry& g = geometry();
    if (!t || !t->data || t->ndim != 3 || t->shape[0] != n_tokens || t->shape[1] != g.n_q_heads ||
        t->shape[2] != g.head_dim || !sieve::is_float_storage(t->dtype) ||
        !sieve::is_contiguous(*t) || t->device.device_type != g.device.device_type ||
        t->device.device_id != g.device.device_id)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, what, " must be a contiguous f32/f16/bf16 [", n_tokens,
               ", ", g.n_q_heads, ", ", g.head_dim, "] tensor on ", sieve::device_name(g.device));
  }

  void report_fraction(const sieve_layer_call& call, double fraction) const {
    const sieve_host_services& s = services();
    if (SIEVE_HAS_FIELD(&s, sieve_host_services, metric) && s.metric)
      s.metric(s.host_ctx, "dense_row_fraction", call.layer, -1, fraction);
  }

  // Dense attention of the listed query rows straight into `out` (other rows untouched).
  void attend_rows(const sieve_layer_call& call, DLTensor& out, int64_t n_rows) const {
    int64_t shape[1] = {n_rows};
    DLTensor rows = sieve::make_view(q_rows_.get(), geometry().device, sieve::kI32, 1, shape);
    core_attend(call.q, &out, call.qo_indptr, call.qo_indptr_host, call.kv_view, nullptr, &rows,
                nullptr, "dense attention of " + std::to_string(n_rows) + " anchor/tail rows failed");
  }

  void correct_cpu(const sieve_layer_call& call, DLTensor& out, int64_t n_dense,
                   int64_t n_anchors) const {
    auto* rows = q_rows_.get<int32_t>();
    int64_t n = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int32_t first = call.qo_indptr_host[b];
      const dc::SeqRows r = dc::seq_rows(call.qo_indptr_host[b + 1] - first, gamma_, tail_);
      for (int64_t j = 0; j < r.dense_rows(); ++j) rows[n++] = int32_t(first + r.dense_row(j, gamma_));
    }
    (void)n_dense;
    void* o = out.data;
    const DLDataType dt = out.dtype;
    const int64_t E = row_elems_;
    float* saved = saved_.get<float>();
    if (mode_ == kDelta) {  // O*(anchor), before the dense call overwrites it
      int64_t a = 0;
      for (int32_t b = 0; b < call.batch; ++b) {
        const dc::SeqRows r =
            dc::seq_rows(call.qo_indptr_host[b + 1] - call.qo_indptr_host[b], gamma_, tail_);
        for (int64_t k = 0; k < r.anchors; ++k, ++a) {
          const int64_t tok = call.qo_indptr_host[b] + k * gamma_;
          for (int64_t e = 0; e < E; ++e) saved[a * E + e] = sieve::load_float(o, dt, tok * E + e);
        }
      }
    }
    attend_rows(call, out, n);
    if (mode_ != kDelta) return;
    int64_t a0 = 0;  // first anchor of the sequence in `saved`
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t first = call.qo_indptr_host[b];
      const dc::SeqRows r = dc::seq_rows(call.qo_indptr_host[b + 1] - first, gamma_, tail_);
      for (int64_t k = 0; k < r.anchors; ++k) {  // Δ_a = O_dense(a) − O*(a)
        const int64_t tok = first + k * gamma_;
        float* d = saved + (a0 + k) * E;
        for (int64_t e = 0; e < E; ++e) d[e] = sieve::load_float(o, dt, tok * E + e) - d[e];
      }
      for (int64_t l = 0; l < r.s_p; ++l) {
        if (dc::row_role(r, l, gamma_) != dc::RowRole::kCorrected) continue;
        const float w = dc::next_anchor_weight(r, l, gamma_, interpolate_);
        const float* d0 = saved + (a0 + l / gamma_) * E;
        const float* d1 = w > 0.f ? d0 + E : d0;
        const int64_t base = (first + l) * E;
        for (int64_t e = 0; e < E; ++e) {
          const float delta = (1.f - w) * d0[e] + w * d1[e];
          sieve::store_float(o, dt, base + e, sieve::load_float(o, dt, base + e) + delta);
        }
      }
      a0 += r.anchors;
    }
    (void)n_anchors;
  }

  // One core-kernel call of this plugin (prefill, dense unless `sel`).
  void core_attend(const DLTensor* q, DLTensor* out, const DLTensor* qo, const int32_t* qo_host,
              const sieve_paged_kv* kv, const sieve_selection* sel, const DLTensor* q_rows,
              DLTensor* lse, std::string_view what) const {
    sieve_attention_args a{};
    a.phase = SIEVE_PHASE_PREFILL;  // scale 0: 1/sqrt(head_dim), as the runner's own call
    a.q = q;
    a.out = out;
    a.qo_indptr = qo;
    a.qo_indptr_host = qo_host;
    a.kv = kv;
    a.selection = sel;
    a.q_rows = q_rows;
    a.lse = lse;
    core_kernel_attend(a, what);
  }

#if SIEVE_WITH_CUDA
  // Anchors per bulk row: one tensor-core CTA holds 128 (query, head) rows of a GQA group.
  static constexpr int64_t kAnchorBlock = 32;
  static constexpr int64_t kBulkBlockPages = 8;       // pages per key block of the bulk selection
  static constexpr int64_t kIndexBudget = 32 << 20;   // entries per selection index buffer

  void allocate_tiled() {
    const sieve_geometry& g = geometry();
    const DLDevice dev = g.device;
    const int64_t max_s = g.max_seq_len, P = g.page_size, B = g.max_batch;
    const int64_t max_m = (max_s + gamma_ - 1) / gamma_;
    qa_ = std::clamp<int64_t>(kAnchorBlock, 1, INT32_MAX / gamma_);
    kb_ = kBulkBlockPages;
    const int64_t blocks_per_seq = (max_m + qa_ - 1) / qa_;
    max_bulk_rows_ = B * blocks_per_seq;
    const int64_t key_blocks = ((max_s + P - 1) / P + kb_ - 1) / kb_;
    bulk_capacity_ = std::min(max_bulk_rows_ * key_blocks, kIndexBudget);
    max_near_rows_ = B * ((max_s + qa_ * gamma_ - 1) / (qa_ * gamma_));
    near_capacity_ = std::min(max_bulk_rows_ * (((qa_ - 1) * gamma_) / P + kb_ + 2), kIndexBudget);
    max_tail_ = B * std::min(max_s, gamma_ - 1 + std::max(tail_, gamma_));
    q_elem_ = sieve::dtype_bytes(g.kv_dtype);
    const size_t E = size_t(row_elems_), hq = size_t(g.n_q_heads);
    auto n1 = [](int64_t n) { return size_t(std::max<int64_t>(n, 1)); };
    tail_tokens_ = allocate(dev, 4 * n1(max_tail_));
    qo_anchor_ = allocate(dev, 4 * (size_t(B) + 1));
    qo_tail_ = allocate(dev, 4 * (size_t(B) + 1));
    row_bases_ = allocate(dev, 4 * 2 * (size_t(B) + 1));
    bulk_indptr_ = allocate(dev, 4 * (size_t(max_bulk_rows_) + 1));
    bulk_indices_ = allocate(dev, 4 * n1(bulk_capacity_));
    near_indptr_ = allocate(dev, 4 * (size_t(max_near_rows_) + 1));
    near_indices_ = allocate(dev, 4 * n1(near_capacity_));
    q_anchor_ = allocate(dev, q_elem_ * n1(max_anchors_) * E);
    out_bulk_ = allocate(dev, 4 * n1(max_anchors_) * E);
    lse_bulk_ = allocate(dev, 4 * n1(max_anchors_) * hq);
    lse_near_ = allocate(dev, 4 * n1(B * max_s) * hq);
    q_tail_ = allocate(dev, q_elem_ * n1(max_tail_) * E);
    out_tail_ = allocate(dev, 4 * n1(max_tail_) * E);
    qo_anchor_host_.assign(size_t(B) + 1, 0);
    qo_tail_host_.assign(size_t(B) + 1, 0);
    tiled_ = true;
  }

  const int32_t* device_int32(const DLTensor* t, const char* what, int64_t n) const {
    const DLDevice dev = geometry().device;
    if (!t || !t->data || !sieve::same_dtype(t->dtype, sieve::kI32) || t->ndim != 1 || t->shape[0] < n ||
        !sieve::is_contiguous(*t) || t->device.device_type != dev.device_type ||
        t->device.device_id != dev.device_id)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, what, " must be a contiguous int32 [", n, "] tensor on ",
               sieve::device_name(dev));
    return sieve::data_ptr<const int32_t>(*t);
  }

  void correct_cuda(const sieve_layer_call& call, DLTensor& out, int64_t n_dense,
                    int64_t n_anchors) const {
    dc::ApplyLaunch a{};
    a.qo_indptr = device_int32(call.qo_indptr, "qo_indptr", call.batch + 1);
    a.batch = call.batch;
    a.n_tokens = call.qo_indptr_host[call.batch];
    a.gamma = gamma_;
    a.tail = tail_;
    a.interpolate = interpolate_;
    a.row_elems = row_elems_;
    a.out = out.data;
    a.out_dtype = sieve::require_storage(out.dtype, "out");
    a.q_rows = q_rows_.get<int32_t>();
    a.n_dense = n_dense;
    a.anchor_tokens = anchor_tokens_.get<int32_t>();
    a.n_anchors = n_anchors;
    a.seq_offsets = seq_offsets_.get<int32_t>();
    a.saved = saved_.get<float>();
    a.stream = cuda_stream();
    if (tiled_ && correct_tiled(call, out, a)) return;
    if (const char* e = dc::launch_rows(a)) sp::fail(SIEVE_ERR_DEVICE, "row-list kernel: ", e);
    if (mode_ == kDelta && n_anchors > 0)
      if (const char* e = dc::launch_save_anchors(a))
        sp::fail(SIEVE_ERR_DEVICE, "anchor gather kernel: ", e);
    attend_rows(call, out, n_dense);
    if (mode_ == kDelta && n_anchors > 0)
      if (const char* e = dc::launch_apply(a)) sp::fail(SIEVE_ERR_DEVICE, "correction kernels: ", e);
  }

  // The tiled anchor path (cuda/delta_apply.hpp). False, having launched nothing, when this call
  // does not fit what it was sized for at create (then the row path runs).
  bool correct_tiled(const sieve_layer_call& call, DLTensor& out, const dc::ApplyLaunch& a) const {
    const sieve_geometry& g = geometry();
    const sieve_paged_kv& view = *call.kv_view;
    if (!call.kv_len_host || sieve::dtype_bytes(call.q->dtype) > q_elem_) return false;
    int64_t n_tail = 0, bulk_rows = 0, near_rows = 0, bulk_nnz = 0, near_nnz = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const dc::SeqRows r = dc::seq_rows(call.qo_indptr_host[b + 1] - call.qo_indptr_host[b], gamma_, tail_);
      const int64_t kv_len = call.kv_len_host[b];
      if (kv_len != sp::view_tokens(view, b) || kv_len < r.s)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "kv_len_host[", b, "] = ", kv_len, " but the KV view holds ",
                 sp::view_tokens(view, b), " tokens and the sequence has ", r.s, " queries");
      qo_anchor_host_[size_t(b) + 1] = qo_anchor_host_[size_t(b)] + int32_t(r.anchors);
      qo_tail_host_[size_t(b) + 1] = qo_tail_host_[size_t(b)] + int32_t(r.tail_rows());
      n_tail += r.tail_rows();
      const int64_t nb = dc::anchor_blocks(r, qa_);
      for (int64_t t = 0; t < nb; ++t) {
        bulk_nnz += dc::bulk_blocks(r, kv_len, t, qa_, gamma_, g.page_size, kb_);
        near_nnz += dc::near_pages(r, kv_len, t, qa_, gamma_, g.page_size, kb_);
      }
      bulk_rows += nb;
      near_rows += dc::near_rows(r, qa_, gamma_);
    }
    if (bulk_nnz > bulk_capacity_ || near_nnz > near_capacity_ || bulk_rows > max_bulk_rows_ ||
        near_rows > max_near_rows_ || n_tail > max_tail_) {
      log_debug("tiled anchor path: this call needs ", bulk_nnz, "/", near_nnz, " selection entries (sized ",
                bulk_capacity_, "/", near_capacity_, "): row path");
      return false;
    }
    dc::TiledLaunch t{};
    t.base = a;
    t.kv_indptr = device_int32(&view.indptr, "the KV view's indptr", call.batch + 1);
    t.last_page_len = device_int32(&view.last_page_len, "the KV view's last_page_len", call.batch);
    t.page_size = g.page_size;
    t.anchor_block = int32_t(qa_);
    t.k_block_pages = int32_t(kb_);
    t.tail_tokens = tail_tokens_.get<int32_t>();
    t.n_tail = n_tail;
    t.qo_anchor = qo_anchor_.get<int32_t>();
    t.qo_tail = qo_tail_.get<int32_t>();
    t.bulk_indptr = bulk_indptr_.get<int32_t>();
    t.bulk_indices = bulk_indices_.get<int32_t>();
    t.n_bulk_rows = int32_t(bulk_rows);
    t.bulk_capacity = bulk_capacity_;
    t.near_indptr = near_indptr_.get<int32_t>();
    t.near_indices = near_indices_.get<int32_t>();
    t.n_near_rows = int32_t(near_rows);
    t.near_capacity = near_capacity_;
    t.row_bases = row_bases_.get<int32_t>();
    t.q = call.q->data;
    t.q_dtype = sieve::require_storage(call.q->dtype, "q");
    t.q_anchor = q_anchor_.get();
    t.q_tail = q_tail_.get();
    t.out_bulk = out_bulk_.get<float>();
    t.lse_bulk = lse_bulk_.get<float>();
    t.lse_near = lse_near_.get<float>();
    t.out_tail = out_tail_.get();
    t.n_q_heads = g.n_q_heads;
    t.head_dim = g.head_dim;
    t.delta = mode_ == kDelta;
    if (const char* e = dc::launch_tiled_setup(t)) sp::fail(SIEVE_ERR_DEVICE, "anchor setup kernels: ", e);
    if (mode_ == kDelta && a.n_anchors > 0)
      if (const char* e = dc::launch_save_anchors(a)) sp::fail(SIEVE_ERR_DEVICE, "anchor gather kernel: ", e);
    if (const char* e = dc::launch_tiled_gather(t)) sp::fail(SIEVE_ERR_DEVICE, "query gather kernel: ", e);

    const DLDevice dev = g.device;
    const int64_t B1 = call.batch + 1, hq = g.n_q_heads, d = g.head_dim;
    int64_t qo_shape[1] = {B1};
    DLTensor qo_anchor = sieve::make_view(qo_anchor_.get(), dev, sieve::kI32, 1, qo_shape);
    DLTensor qo_tail = sieve::make_view(qo_tail_.get(), dev, sieve::kI32, 1, qo_shape);
    if (a.n_anchors > 0) {
      // Far keys: the compacted anchors as one causal prefill over the bulk key blocks.
      int64_t qs[3] = {a.n_anchors, hq, d}, ls[2] = {a.n_anchors, hq};
      int64_t bi[1] = {bulk_rows + 1}, bx[1] = {std::max<int64_t>(bulk_capacity_, 1)};
      DLTensor q_c = sieve::make_view(q_anchor_.get(), dev, call.q->dtype, 3, qs);
      DLTensor o_c = sieve::make_view(out_bulk_.get(), dev, sieve::kF32, 3, qs);
      DLTensor l_c = sieve::make_view(lse_bulk_.get(), dev, sieve::kF32, 2, ls);
      sieve_selection bulk{};
      bulk.hdr = SIEVE_HEADER_INIT(sieve_selection);
      bulk.kind = SIEVE_SEL_BLOCKS;
      bulk.heads = SIEVE_SEL_PER_SEQUENCE;
      bulk.q_block = int32_t(qa_);
      bulk.k_block_pages = int32_t(kb_);
      bulk.n_rows = int32_t(bulk_rows);
      bulk.indptr = sieve::make_view(bulk_indptr_.get(), dev, sieve::kI32, 1, bi);
      bulk.indices = sieve::make_view(bulk_indices_.get(), dev, sieve::kI32, 1, bx);
      bulk.capacity = bx[0];
      core_attend(&q_c, &o_c, &qo_anchor, qo_anchor_host_.data(), &view, &bulk, nullptr, &l_c,
             "dense attention of the anchors' far keys");
      // Near keys: the row kernel on the original queries, into `out` at the anchors.
      int64_t ni[1] = {near_rows + 1}, nx[1] = {std::max<int64_t>(near_capacity_, 1)};
      int64_t ln[2] = {a.n_tokens, hq}, rs[1] = {a.n_anchors};
      DLTensor l_n = sieve::make_view(lse_near_.get(), dev, sieve::kF32, 2, ln);
      DLTensor rows = sieve::make_view(anchor_tokens_.get(), dev, sieve::kI32, 1, rs);
      sieve_selection near = bulk;
      near.q_block = int32_t(qa_ * gamma_);
      near.k_block_pages = 1;
      near.n_rows = int32_t(near_rows);
      near.indptr = sieve::make_view(near_indptr_.get(), dev, sieve::kI32, 1, ni);
      near.indices = sieve::make_view(near_indices_.get(), dev, sieve::kI32, 1, nx);
      near.capacity = nx[0];
      core_attend(call.q, &out, call.qo_indptr, call.qo_indptr_host, &view, &near, &rows, &l_n,
             "dense attention of the anchors' near keys");
    }
    if (n_tail > 0) {
      int64_t ts[3] = {n_tail, hq, d};
      DLTensor q_t = sieve::make_view(q_tail_.get(), dev, call.q->dtype, 3, ts);
      DLTensor o_t = sieve::make_view(out_tail_.get(), dev, out.dtype, 3, ts);
      core_attend(&q_t, &o_t, &qo_tail, qo_tail_host_.data(), &view, nullptr, nullptr, nullptr,
             "dense attention of the tail rows");
    }
    if (const char* e = dc::launch_tiled_finish(t)) sp::fail(SIEVE_ERR_DEVICE, "merge/correction kernels: ", e);
    return true;
  }
#else
  [[noreturn]] void correct_cuda(const sieve_layer_call&, DLTensor&, int64_t, int64_t) const {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of delta_correction has no CUDA code");
  }
#endif

  int64_t gamma_;
  int64_t tail_;
  uint32_t mode_;
  bool interpolate_;
  int64_t max_dense_rows_ = 0;
  int64_t max_anchors_ = 0;
  int64_t row_elems_ = 0;
  sp::HostBuffer q_rows_;  // int32 [max_dense_rows]: token indices of the anchors and tails
  sp::HostBuffer saved_;   // f32 [max_anchors, n_q_heads, head_dim]: O*(anchor), then Δ
#if SIEVE_WITH_CUDA
  sp::HostBuffer anchor_tokens_;  // device int32 [max_anchors]: token of each anchor
  sp::HostBuffer seq_offsets_;    // device int32 [2 (max_batch + 1)]: first dense row, first anchor
  // The tiled anchor path (allocate_tiled; sizes there).
  bool tiled_ = false;
  int64_t qa_ = 1, kb_ = 1, max_bulk_rows_ = 0, bulk_capacity_ = 0, max_near_rows_ = 0,
          near_capacity_ = 0, max_tail_ = 0;
  size_t q_elem_ = 4;
  sp::HostBuffer tail_tokens_, qo_anchor_, qo_tail_, row_bases_, bulk_indptr_, bulk_indices_,
      near_indptr_, near_indices_, q_anchor_, out_bulk_, lse_bulk_, lse_near_, q_tail_, out_tail_;
  mutable std::vector<int32_t> qo_anchor_host_, qo_tail_host_;  // host mirrors, sized at create
#endif
};

}  // namespace

SIEVE_DEFINE_PLUGIN(DeltaCorrectionPolicy);
