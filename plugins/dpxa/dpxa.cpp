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
// mode=deltax (DeltaXAttention, §4.2): the same kept tiles, but attend computes them itself: the
// diagonal tiles, the sink and the `exact_top` highest-share other kept tiles exactly, every other
// kept tile over its Delta-KV packed keys (per key block, cosine `pack_threshold`) with ln(count)
// added to the logit, all in one softmax per query row. CPU: cpu/deltax.cpp. CUDA: the select also
// keeps the shares on the device and ranks the exact tiles there (dpxa_select.cu), attend packs
// each sequence's key blocks (core/packing's block_pack.cu) and runs cuda/deltax_attend.cu.
//
// Hooks: select (prefill), attend. A hook's presence is fixed per plugin, not per instance, so
// attend exists in both modes; mode=select hands the call to the host's core block-sparse kernel
// with the arguments the layer runner would have used (the same kernel, the same result).
// CPU: dpxa_math.cpp. CUDA: cuda/dpxa_select.cu (anchors, tile scores,
// per-row greedy, CSR), all on the host's stream with scratch allocated in create. Both paths
// share dpxa_tiles.hpp's arithmetic and produce the same selection, except that 16-bit Q/K are
// scored on tensor cores (f32 sums in the tensor core's order), which can flip a tile whose share
// ties another's, or τ, to ~1e-6 (docs/methods/dpxa.md).
// Host services: alloc/free, cuda_stream, log, kernels->attend (mode=select), metric
// ("dpxa_density": kept / causal tiles, "dpxa_sampled": sampled logits / causal logits; mode=deltax:
// "deltax_kv_reduction" per q head and layer, "deltax_packed" per layer; all CPU only: on CUDA
// they would need a stream synchronisation per layer).
#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "math/dpxa_math.hpp"
#include "cpu/deltax.hpp"
#if SIEVE_WITH_CUDA
#include "cuda/deltax_attend.hpp"
#include "cuda/dpxa_select.hpp"
#include "sieve/packing/block_pack_cuda.hpp"
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
  };

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
    cfg_.estimator = sd::Estimator(p.choice("estimator"));
    cfg_.block = int32_t(p.integer("block"));
    cfg_.q_threshold = cfg_.k_threshold = float(p.real("threshold"));
    const int32_t s = int32_t(p.integer("stride"));
    cfg_.stride = s ? s : cfg_.estimator == sd::kXattn ? 8 : 4;
    cfg_.scale = 1.0f / std::sqrt(float(g.head_dim));
    tau_ = float(p.real("tau"));
    per_kv_head_ = p.choice("rows") == 1;
    deltax_ = p.choice("mode") == kDeltax;
    exact_top_ = float(p.real("exact_top"));
    pack_threshold_ = float(p.real("pack_threshold"));
    const std::string path(p.text("thresholds"));
    if (!path.empty()) {
      const std::string e = sd::load_thresholds(path, g.n_layers, g.n_q_heads, thresholds_);
      if (!e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "thresholds: ", e);
    }
#if SIEVE_WITH_CUDA
    if (g.device.device_type == kDLCUDA) {
      const sd::ScratchSizes z = sd::scratch_sizes(g.max_seq_len, cfg_.block, g.n_q_heads, g.n_kv_heads);
      q_anchors_d_ = allocate(g.device, z.q_anchors);
      q_counts_d_ = allocate(g.device, z.q_counts);
      k_anchors_d_ = allocate(g.device, z.k_anchors);
      k_counts_d_ = allocate(g.device, z.k_counts);
      tiles_d_ = allocate(g.device, z.tiles);
      keep_d_ = allocate(g.device, z.keep);
      row_counts_d_ = allocate(g.device, z.row_counts);
      if (deltax_) {
        // What select leaves for attend: the shares of one sequence (ranked before the next
        // sequence's select), the exact bits of the whole batch, and one sequence's packing.
        const int64_t blocks = (int64_t(g.max_seq_len) + cfg_.block - 1) / cfg_.block;
        exact_words_ = int32_t((blocks + 31) / 32);
        shares_d_ = allocate(g.device, z.tiles / 2);  // (m, s) pairs -> one float
        exact_bits_d_ = allocate(g.device, size_t(g.max_batch) * size_t(blocks) * size_t(g.n_q_heads) *
                                               size_t(exact_words_) * 4);
        anchor_off_d_ = allocate(g.device, size_t(g.n_kv_heads) * size_t(blocks) * size_t(cfg_.block));
        n_anchors_d_ = allocate(g.device, size_t(g.n_kv_heads) * size_t(blocks) * 4);
      }
    }
#endif
    log_debug("estimator = ", sd::estimator_name(cfg_.estimator), ", block = ", cfg_.block,
              ", threshold = ", cfg_.q_threshold, ", stride = ", cfg_.stride, ", tau = ", tau_,
              path.empty() ? "" : ", thresholds = ", path, ", mode = ", p.text("mode"),
              deltax_ ? ", exact_top = " : "", deltax_ ? std::to_string(exact_top_) : "",
              deltax_ ? ", pack_threshold = " : "", deltax_ ? std::to_string(pack_threshold_) : "");
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
    const int32_t B = cfg_.block;
    const int32_t H = per_kv_head_ ? g.n_kv_heads : g.n_q_heads;
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
      select_cpu(call, view, int32_t(n_rows));
      int64_t nnz = 0;
      for (const auto& r : rows_) nnz += int64_t(r.size());
      sp::check_selection_storage(selection, n_rows, nnz, g.device);
      auto* indptr = sieve::data_ptr<int32_t>(selection.indptr);
      auto* indices = sieve::data_ptr<int32_t>(selection.indices);
      int64_t off = 0;
      indptr[0] = 0;
      for (size_t r = 0; r < size_t(n_rows); ++r) {
        for (int32_t j : rows_[r]) indices[off++] = j;
        indptr[r + 1] = int32_t(off);
      }
    } else {
      // The device writes the lists without telling the host their length, so the storage must
      // hold the worst case (every candidate kept).
      sp::check_selection_storage(selection, n_rows, worst_nnz, g.device);
      select_cuda(call, view, selection, int32_t(n_rows));
      if (deltax_) selected_layer_ = call.layer, selected_rows_ = int32_t(n_rows);
    }
    selection.kind = SIEVE_SEL_BLOCKS;
    selection.heads = per_kv_head_ ? SIEVE_SEL_PER_KV_HEAD : SIEVE_SEL_PER_Q_HEAD;
    selection.q_block = B;
    selection.k_block_pages = B / g.page_size;
    selection.n_rows = int32_t(n_rows);
  }

  // attend exists in both modes (hook presence is per plugin); see the file comment.
  void attend(const sieve_layer_call& call, const sieve_selection& selection,
              DLTensor& out) override {
    if (!deltax_) return core_attend(call, selection, out);
    check_deltax_call(call, selection);
    if (geometry().device.device_type == kDLCPU) attend_deltax(call, selection, out);
    else attend_deltax_cuda(call, selection, out);
  }

 private:
  // mode=select: the host's block-sparse kernel on the selection, as the layer runner calls it.
  void core_attend(const sieve_layer_call& call, const sieve_selection& selection,
                   DLTensor& out) const {
    sieve_attention_args a{};
    a.phase = call.phase;
    a.q = call.q;
    a.out = &out;
    a.qo_indptr = call.qo_indptr;
    a.qo_indptr_host = call.qo_indptr_host;
    a.kv = call.kv_view;
    a.selection = &selection;
    core_kernel_attend(a, "core block-sparse attention failed");
  }

  // mode=deltax, both devices: the selection must be this instance's own of this layer call.
  void check_deltax_call(const sieve_layer_call& call, const sieve_selection& sel) const {
    const sieve_geometry& g = geometry();
    const int32_t B = cfg_.block;
    if (call.phase != SIEVE_PHASE_PREFILL)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "dpxa attends prefill only, phase is ", call.phase);
    sp::require_struct(call.kv_view, "KV view");
    if (call.layer != selected_layer_)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "dpxa: mode=deltax attends the tiles its own select "
               "chose for this layer, but the last select was for layer ", selected_layer_,
               " (this is layer ", call.layer, ")");
    if (sel.kind != SIEVE_SEL_BLOCKS || sel.q_block != B || sel.k_block_pages != B / g.page_size ||
        sel.heads != uint32_t(per_kv_head_ ? SIEVE_SEL_PER_KV_HEAD : SIEVE_SEL_PER_Q_HEAD) ||
        sel.n_rows != selected_rows_)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "dpxa: mode=deltax needs its own block selection "
               "(q_block ", B, ", ", selected_rows_, " rows); the chain's has kind ", sel.kind,
               ", q_block ", sel.q_block, ", ", sel.n_rows, " rows");
  }

  // mode=deltax on the CPU: per (sequence, KV head) pack every key block, then each q head's
  // rows over the selection's kept tiles (exact or packed, cpu/deltax.cpp).
  void attend_deltax(const sieve_layer_call& call, const sieve_selection& sel, DLTensor& out) {
    const sieve_geometry& g = geometry();
    const int32_t B = cfg_.block, d = g.head_dim, group = g.n_q_heads / g.n_kv_heads;
    const int32_t H = per_kv_head_ ? g.n_kv_heads : g.n_q_heads;
    const sieve_paged_kv& view = *call.kv_view;
    check_cpu_tensors(call, view);
    const int64_t n_q = call.qo_indptr_host[call.batch];
    for (const auto& [t, what] : {std::pair<const DLTensor*, const char*>{&out, "out"},
                                  {&view.v_pages, "v_pages"}}) {
      const int64_t rows = t == &out ? n_q : -1;
      std::string e = t == &out ? sieve::check_tensor(t, what, 3, {rows, g.n_q_heads, d})
                                : sieve::check_tensor(t, what, 4, {-1, g.n_kv_heads, g.page_size, d});
      if (e.empty() && (!sieve::is_float_storage(t->dtype) || !sieve::is_contiguous(*t)))
        e = std::string(what) + " must be a contiguous f32/f16/bf16 tensor";
      if (!e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    }
    const int32_t* indptr = sieve::data_ptr<const int32_t>(sel.indptr);
    const int32_t* indices = sieve::data_ptr<const int32_t>(sel.indices);
    const void* qbase = sieve::data_ptr<const void>(*call.q);
    void* obase = sieve::data_ptr<void>(out);
    // KV loads per q head, for the kv reduction: block-sparse (every kept key) and saved.
    std::vector<double>& full = load_full_;
    std::vector<double>& saved = load_saved_;
    full.assign(size_t(g.n_q_heads), 0.0);
    saved.assign(size_t(g.n_q_heads), 0.0);
    int64_t tiles = 0, packed = 0;
    qrow_.resize(size_t(d));
    orow_.resize(size_t(d));
    int32_t row0 = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int32_t n = call.kv_len_host[b], q0 = call.qo_indptr_host[b];
      const int32_t n_new = call.qo_indptr_host[b + 1] - q0, blocks = (n_new + B - 1) / B;
      const int64_t first_pos = int64_t(n) - n_new;
      row_scores_.resize(size_t(std::max(n, 1)));
      for (int32_t kvh = 0; kvh < g.n_kv_heads; ++kvh) {
        gather_pages(view, view.k_pages, b, kvh, n, k_);
        gather_pages(view, view.v_pages, b, kvh, n, vf_);
        sd::deltax::pack_tiles(k_.data(), n, d, B, pack_threshold_, pack_);
        for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          for (int32_t t = 0; t < blocks; ++t) {
            const sd::RowSpan span = sd::row_span(n, n_new, B, t);
            const int64_t r = int64_t(row0 + t) * H + (per_kv_head_ ? kvh : h);
            const int32_t* kept = indices + indptr[r];
            const int32_t n_kept = indptr[r + 1] - indptr[r];
            for (int32_t i = 0; i < n_kept; ++i)
              if (kept[i] < 0 || kept[i] >= span.n_candidates || (i > 0 && kept[i] <= kept[i - 1]))
                sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "selection row ", r, " entry ", i, " = ",
                         kept[i], ": not an ascending key block in [0, ", span.n_candidates, ")");
            exact_.resize(size_t(n_kept));
            const float* shares = shares_.data() + share_start_[size_t(row0 + t) * g.n_q_heads + size_t(h)];
            packed += sd::deltax::exact_tiles(kept, n_kept, span.diag_first, shares, exact_top_,
                                              exact_.data(), rank_);
            tiles += n_kept;
            for (int32_t i = 0; i < n_kept; ++i) {
              const int32_t j = kept[i], keys = std::min(B, n - j * B);
              full[size_t(h)] += keys;
              if (!exact_[size_t(i)])
                saved[size_t(h)] += keys - (pack_.first[size_t(j) + 1] - pack_.first[size_t(j)]);
            }
            const int64_t nq = std::min<int64_t>(B, n_new - int64_t(t) * B);
            for (int64_t i = 0; i < nq; ++i) {
              const int64_t row = (int64_t(q0) + int64_t(t) * B + i) * g.n_q_heads + h;
              for (int32_t x = 0; x < d; ++x)
                qrow_[size_t(x)] = sieve::load_float(qbase, call.q->dtype, row * d + x);
              sd::deltax::attend_row(qrow_.data(), k_.data(), vf_.data(), d, cfg_.scale, B, n,
                                     pack_, kept, exact_.data(), n_kept,
                                     first_pos + int64_t(t) * B + i, row_scores_.data(),
                                     orow_.data());
              for (int32_t x = 0; x < d; ++x)
                sieve::store_float(obase, out.dtype, row * d + x, orow_[size_t(x)]);
            }
          }
        }
      }
      row0 += blocks;
    }
    // KV reduction relative to the block-sparse kernel (the paper's f·(1 - p)), per q head.
    double all_full = 0, all_saved = 0;
    for (int32_t h = 0; h < g.n_q_heads; ++h) {
      if (full[size_t(h)] > 0)
        metric("deltax_kv_reduction", call.layer, saved[size_t(h)] / full[size_t(h)], h);
      all_full += full[size_t(h)];
      all_saved += saved[size_t(h)];
    }
    if (all_full > 0) metric("deltax_kv_reduction", call.layer, all_saved / all_full);
    if (tiles > 0) metric("deltax_packed", call.layer, double(packed) / double(tiles));
  }

  // Copy one head of the call's queries (sequence b) / of the view's keys to contiguous f32.
  void gather_q(const sieve_layer_call& call, int32_t b, int32_t h, std::vector<float>& out) const {
    const sieve_geometry& g = geometry();
    const DLTensor& q = *call.q;
    const int64_t q0 = call.qo_indptr_host[b], n = call.qo_indptr_host[b + 1] - q0;
    const int32_t d = g.head_dim;
    out.resize(size_t(n * d));
    const void* base = sieve::data_ptr<const void>(q);
    for (int64_t i = 0; i < n; ++i)
      for (int32_t x = 0; x < d; ++x)
        out[size_t(i * d + x)] = sieve::load_float(base, q.dtype, ((q0 + i) * g.n_q_heads + h) * d + x);
  }
  void gather_k(const sieve_paged_kv& view, int32_t b, int32_t kvh, int64_t kv_len,
                std::vector<float>& out) const {
    gather_pages(view, view.k_pages, b, kvh, kv_len, out);
  }
  void gather_pages(const sieve_paged_kv& view, const DLTensor& pages_t, int32_t b, int32_t kvh,
                    int64_t kv_len, std::vector<float>& out) const {
    const sieve_geometry& g = geometry();
    const int32_t d = g.head_dim, ps = g.page_size;
    out.resize(size_t(kv_len * d));
    const int32_t* pages = sieve::data_ptr<const int32_t>(view.indices) + view.indptr_host[b];
    const void* base = sieve::data_ptr<const void>(pages_t);
    for (int64_t p = 0; p < kv_len; ++p) {
      const int64_t o = ((int64_t(pages[p / ps]) * g.n_kv_heads + kvh) * ps + p % ps) * d;
      for (int32_t x = 0; x < d; ++x)
        out[size_t(p * d + x)] = sieve::load_float(base, pages_t.dtype, o + x);
    }
  }

  void check_cpu_tensors(const sieve_layer_call& call, const sieve_paged_kv& view) const {
    const sieve_geometry& g = geometry();
    const int64_t n_q = call.qo_indptr_host[call.batch];
    if (std::string e = sieve::check_tensor(call.q, "q", 3, {n_q, g.n_q_heads, g.head_dim});
        !e.empty() || !sieve::is_float_storage(call.q->dtype) || !sieve::is_contiguous(*call.q))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e.empty() ? "q: not a contiguous f32/f16/bf16 tensor" : e);
    if (std::string e = sieve::check_tensor(&view.k_pages, "k_pages", 4,
                                            {-1, g.n_kv_heads, g.page_size, g.head_dim});
        !e.empty() || !sieve::is_contiguous(view.k_pages))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e.empty() ? "k_pages: not contiguous" : e);
    if (!view.indices.data) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the view's page indices are NULL");
  }

  void select_cpu(const sieve_layer_call& call, const sieve_paged_kv& view, int32_t n_rows) {
    const sieve_geometry& g = geometry();
    check_cpu_tensors(call, view);
    const int32_t B = cfg_.block, group = g.n_q_heads / g.n_kv_heads;
    const int32_t H = per_kv_head_ ? g.n_kv_heads : g.n_q_heads;
    rows_.resize(size_t(n_rows));
    for (auto& r : rows_) r.clear();
    int64_t kept = 0, causal = 0;
    double sampled = 0, logits = 0;
    if (deltax_) share_offsets(call);
    int32_t row0 = 0;  // first query block of sequence b (C_b)
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      const int64_t kv_len = call.kv_len_host[b];
      const int32_t blocks = int32_t((n_new + B - 1) / B);
      for (int32_t kvh = 0; kvh < g.n_kv_heads; ++kvh) {
        gather_k(view, b, kvh, kv_len, k_);
        if (cfg_.estimator == sd::kDpxa)
          sd::block_anchors(k_.data(), kv_len, g.head_dim, B, cfg_.k_threshold, k_anchors_);
        for (int32_t h = kvh * group; h < (kvh + 1) * group; ++h) {
          gather_q(call, b, h, q_);
          if (cfg_.estimator == sd::kDpxa)
            sd::block_anchors(q_.data(), n_new, g.head_dim, B, cfg_.q_threshold, q_anchors_);
          sd::score_head(cfg_, q_.data(), n_new, k_.data(), kv_len, g.head_dim, &q_anchors_,
                         &k_anchors_, scores_);
          const float tau = thresholds_.at(call.layer, h, tau_);
          for (int32_t t = 0; t < blocks; ++t) {
            const sd::RowSpan& r = scores_.spans[size_t(t)];
            keep_.resize(size_t(r.n_candidates));
            const sd::TileLse* tiles = scores_.tiles.data() + scores_.row_start[size_t(t)];
            kept += sd::greedy_row(r, tiles, tau, keep_.data(), greedy_);
            if (deltax_) {  // this head's shares rank the kept tiles for attend
              sd::row_shares(r, tiles, row_shares_);
              std::copy(row_shares_.begin(), row_shares_.end(),
                        shares_.begin() + share_start_[size_t(row0 + t) * g.n_q_heads + size_t(h)]);
            }
            causal += r.n_candidates;
            std::vector<int32_t>& row =
                rows_[size_t(row0 + t) * H + size_t(per_kv_head_ ? kvh : h)];
            for (int32_t j = 0; j < r.n_candidates; ++j)
              if (keep_[size_t(j)]) row.push_back(j);
            if (per_kv_head_) {  // union with the group's earlier heads
              std::sort(row.begin(), row.end());
              row.erase(std::unique(row.begin(), row.end()), row.end());
            }
            // Sampled share of the causal logits, for the dpxa_sampled metric.
            const int64_t nq = std::min<int64_t>(B, n_new - int64_t(t) * B);
            for (int32_t j = 0; j < r.n_candidates; ++j) {
              const int64_t nk = std::min<int64_t>(B, kv_len - int64_t(j) * B);
              logits += double(nq) * double(nk);
              if (cfg_.estimator == sd::kDpxa)
                sampled += double(q_anchors_.counts[size_t(t)]) * k_anchors_.counts[size_t(j)];
            }
          }
        }
      }
      row0 += blocks;
    }
    if (causal > 0) metric("dpxa_density", call.layer, double(kept) / double(causal));
    if (cfg_.estimator == sd::kDpxa && logits > 0)
      metric("dpxa_sampled", call.layer, sampled / logits);
    if (deltax_) selected_layer_ = call.layer, selected_rows_ = n_rows;
  }

  // deltax: where each (query block, q head)'s candidate shares start in shares_ (row order of
  // a per-q-head selection).
  void share_offsets(const sieve_layer_call& call) {
    const sieve_geometry& g = geometry();
    const int32_t B = cfg_.block;
    share_start_.clear();
    int64_t off = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      for (int32_t t = 0; t * int64_t(B) < n_new; ++t) {
        const int32_t nc = sd::row_span(call.kv_len_host[b], n_new, B, t).n_candidates;
        for (int32_t h = 0; h < g.n_q_heads; ++h, off += nc) share_start_.push_back(off);
      }
    }
    share_start_.push_back(off);
    shares_.resize(size_t(off));
  }

  void metric(const char* name, int32_t layer, double value, int32_t head = -1) const {
    if (services().metric) services().metric(services().host_ctx, name, layer, head, value);
  }

#if SIEVE_WITH_CUDA
  // One launch sequence per sequence of the batch (scratch is sized for one sequence).
  void select_cuda(const sieve_layer_call& call, const sieve_paged_kv& view,
                   sieve_selection& selection, int32_t) {
    const sieve_geometry& g = geometry();
    const DLDevice dev = g.device;
    auto on_device = [&](const DLTensor& t, const char* what) {
      if (!t.data || t.device.device_type != dev.device_type || t.device.device_id != dev.device_id ||
          !sieve::is_contiguous(t))
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, what, " must be a contiguous tensor on ",
                 sieve::device_name(dev));
    };
    const int64_t n_q = call.qo_indptr_host[call.batch];
    if (std::string e = sieve::check_tensor(call.q, "q", 3, {n_q, g.n_q_heads, g.head_dim}); !e.empty())
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    on_device(*call.q, "q");
    on_device(view.k_pages, "k_pages");
    on_device(view.indices, "the view's page indices");
    if (g.n_q_heads > sd::kCudaMaxQHeads)
      sp::fail(SIEVE_ERR_UNSUPPORTED, "n_q_heads = ", g.n_q_heads, " > ", sd::kCudaMaxQHeads);
    sd::SequenceLaunch a{};
    a.estimator = cfg_.estimator;
    a.B = cfg_.block;
    a.S = cfg_.stride;
    a.d = g.head_dim;
    a.hq = g.n_q_heads;
    a.hkv = g.n_kv_heads;
    a.page_size = g.page_size;
    a.q_threshold = cfg_.q_threshold;
    a.k_threshold = cfg_.k_threshold;
    a.scale = cfg_.scale;
    a.scale_over_s = cfg_.scale / float(cfg_.stride);
    a.rows_per_kv_head = per_kv_head_;
    for (int32_t h = 0; h < g.n_q_heads; ++h) a.tau[h] = thresholds_.at(call.layer, h, tau_);
    a.q = sieve::data_ptr<const void>(*call.q);
    a.q_dtype = sieve::require_storage(call.q->dtype, "q");
    a.kv_dtype = sieve::require_storage(view.k_pages.dtype, "k_pages");
    a.k_pages = sieve::data_ptr<const void>(view.k_pages);
    a.q_anchors = q_anchors_d_.get<uint8_t>();
    a.q_counts = q_counts_d_.get<int32_t>();
    a.k_anchors = k_anchors_d_.get<uint8_t>();
    a.k_counts = k_counts_d_.get<int32_t>();
    a.tiles = tiles_d_.get<float>();
    a.keep = keep_d_.get<uint8_t>();
    a.row_counts = row_counts_d_.get<int32_t>();
    a.sel_indptr = sieve::data_ptr<int32_t>(selection.indptr);
    a.sel_indices = sieve::data_ptr<int32_t>(selection.indices);
    a.capacity = selection.capacity;
    a.stream = cuda_stream();
    a.shares = deltax_ ? shares_d_.get<float>() : nullptr;
    a.exact_words = exact_words_;
    a.exact_top = exact_top_;
    const int32_t B = cfg_.block, H = per_kv_head_ ? g.n_kv_heads : g.n_q_heads;
    int32_t row0 = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      if (deltax_ && call.kv_len_host[b] > g.max_seq_len)  // the deltax scratch's sizing
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sequence ", b, " has kv_len ", call.kv_len_host[b],
                 " > max_seq_len = ", g.max_seq_len);
      // deltax: this sequence's exact bits follow the earlier sequences' query blocks.
      a.exact_bits = deltax_ ? exact_bits_d_.get<uint32_t>() +
                                   int64_t(row0 / H) * g.n_q_heads * exact_words_
                             : nullptr;
      a.q_token0 = call.qo_indptr_host[b];
      a.n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      a.kv_len = call.kv_len_host[b];
      a.pages = sieve::data_ptr<const int32_t>(view.indices) + view.indptr_host[b];
      a.QB = int32_t((a.n_new + B - 1) / B);
      a.KB = int32_t((a.kv_len + B - 1) / B);
      a.tiles_per_head = 0;
      for (int32_t t = 0; t < a.QB; ++t)
        a.tiles_per_head += sd::row_span(a.kv_len, a.n_new, B, t).n_candidates;
      a.row0 = row0;
      if (const char* e = sd::launch_sequence(a))
        sp::fail(SIEVE_ERR_DEVICE, "dpxa selection kernels failed to launch: ", e);
      row0 += a.QB * H;
    }
    if (row0 == 0) {  // no queries at all: the CSR still needs indptr[0] = 0
      sd::SequenceLaunch empty = a;
      empty.QB = 0;
      if (const char* e = sd::launch_empty(empty))
        sp::fail(SIEVE_ERR_DEVICE, "dpxa selection kernels failed to launch: ", e);
    }
  }

  // mode=deltax on CUDA: per sequence, its key blocks packed (core/packing's block walk), then
  // the attention kernel over the selection with the exact bits its select left.
  void attend_deltax_cuda(const sieve_layer_call& call, const sieve_selection& sel, DLTensor& out) {
    const sieve_geometry& g = geometry();
    const DLDevice dev = g.device;
    const sieve_paged_kv& view = *call.kv_view;
    const int32_t B = cfg_.block, H = per_kv_head_ ? g.n_kv_heads : g.n_q_heads;
    const int64_t n_q = call.batch > 0 ? call.qo_indptr_host[call.batch] : 0;
    auto tensor = [&](const DLTensor* t, const char* what, std::initializer_list<int64_t> shape) {
      std::string e = sieve::check_tensor(t, what, int32_t(shape.size()), shape);
      if (e.empty() && (!t->data || t->device.device_type != dev.device_type ||
                        t->device.device_id != dev.device_id || !sieve::is_contiguous(*t)))
        e = std::string(what) + " must be a contiguous tensor on " + sieve::device_name(dev);
      if (!e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
      return sieve::require_storage(t->dtype, what);
    };
    const int32_t d = g.head_dim;
    sd::DeltaxLaunch a{};
    a.q_dtype = tensor(call.q, "q", {n_q, g.n_q_heads, d});
    a.out_dtype = tensor(&out, "out", {n_q, g.n_q_heads, d});
    a.kv_dtype = tensor(&view.k_pages, "k_pages", {-1, g.n_kv_heads, g.page_size, d});
    if (tensor(&view.v_pages, "v_pages", {-1, g.n_kv_heads, g.page_size, d}) != a.kv_dtype)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "k_pages and v_pages differ in dtype");
    if (call.batch > 0 && (!view.indices.data || !view.indptr_host))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the view's page table is NULL");
    a.B = B;
    a.d = d;
    a.hq = g.n_q_heads;
    a.hkv = g.n_kv_heads;
    a.page_size = g.page_size;
    a.H = H;
    a.rows_per_kv_head = per_kv_head_;
    a.scale = cfg_.scale;
    a.q = sieve::data_ptr<const void>(*call.q);
    a.k_pages = sieve::data_ptr<const void>(view.k_pages);
    a.v_pages = sieve::data_ptr<const void>(view.v_pages);
    a.out = sieve::data_ptr<void>(out);
    a.sel_indptr = sieve::data_ptr<const int32_t>(sel.indptr);
    a.sel_indices = sieve::data_ptr<const int32_t>(sel.indices);
    a.exact_words = exact_words_;
    a.anchor_off = anchor_off_d_.get<uint8_t>();
    a.n_anchors = n_anchors_d_.get<int32_t>();
    a.stream = cuda_stream();
    sieve::packing::BlockPackLaunch pk{};
    pk.k_pages = a.k_pages;
    pk.kv_dtype = a.kv_dtype;
    pk.hkv = g.n_kv_heads;
    pk.d = d;
    pk.page_size = g.page_size;
    pk.B = B;
    pk.threshold = pack_threshold_;
    pk.keep = nullptr;
    pk.anchor_off = anchor_off_d_.get<uint8_t>();
    pk.n_anchors = n_anchors_d_.get<int32_t>();
    pk.stream = a.stream;
    int64_t blocks0 = 0;  // query blocks of the earlier sequences
    for (int32_t b = 0; b < call.batch; ++b) {
      a.q_token0 = call.qo_indptr_host[b];
      a.n_new = int64_t(call.qo_indptr_host[b + 1]) - a.q_token0;
      a.kv_len = call.kv_len_host[b];
      a.QB = int32_t((a.n_new + B - 1) / B);
      a.KB = int32_t((a.kv_len + B - 1) / B);
      a.sel_row0 = blocks0 * H;
      a.exact_bits = exact_bits_d_.get<uint32_t>() + blocks0 * g.n_q_heads * exact_words_;
      blocks0 += a.QB;
      if (a.QB == 0) continue;
      a.pages = sieve::data_ptr<const int32_t>(view.indices) + view.indptr_host[b];
      pk.pages = a.pages;
      pk.n = a.kv_len;
      // The next sequence's packing reuses the scratch after this attention (one stream).
      if (const char* e = sieve::packing::launch_block_pack(pk))
        sp::fail(SIEVE_ERR_DEVICE, "dpxa deltax packing failed to launch: ", e);
      if (const char* e = sd::launch_deltax_attend(a))
        sp::fail(SIEVE_ERR_DEVICE, "dpxa deltax attention failed to launch: ", e);
    }
  }

  sp::HostBuffer q_anchors_d_, q_counts_d_, k_anchors_d_, k_counts_d_, tiles_d_, keep_d_,
      row_counts_d_;
  // mode=deltax (CUDA): select -> attend hand-over and attend's packing scratch.
  sp::HostBuffer shares_d_, exact_bits_d_, anchor_off_d_, n_anchors_d_;
  int32_t exact_words_ = 0;
#else
  [[noreturn]] void select_cuda(const sieve_layer_call&, const sieve_paged_kv&, sieve_selection&,
                                int32_t) {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of dpxa has no CUDA code");
  }
  [[noreturn]] void attend_deltax_cuda(const sieve_layer_call&, const sieve_selection&, DLTensor&) {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of dpxa has no CUDA code");
  }
#endif

  static constexpr uint32_t kDeltax = 1;  // mode's choice index

  sd::Config cfg_;
  float tau_ = 0.9f;
  bool per_kv_head_ = false;
  bool deltax_ = false;
  float exact_top_ = 0.1f, pack_threshold_ = 0.83f;
  // deltax: the select of this layer call left the shares attend ranks kept tiles by.
  std::vector<float> shares_, row_shares_;
  std::vector<int64_t> share_start_;
  int32_t selected_layer_ = -1, selected_rows_ = -1;
  // deltax CPU scratch (grown on the first calls, like the selection's).
  std::vector<float> vf_, qrow_, orow_, row_scores_;
  std::vector<uint8_t> exact_;
  std::vector<int32_t> rank_;
  std::vector<double> load_full_, load_saved_;
  sd::deltax::TilePack pack_;
  sd::Thresholds thresholds_;
  // CPU scratch, grown on the first calls and reused (the CPU path's only allocations).
  std::vector<float> q_, k_;
  sd::Anchors q_anchors_, k_anchors_;
  sd::HeadScores scores_;
  sd::GreedyScratch greedy_;
  std::vector<uint8_t> keep_;
  std::vector<std::vector<int32_t>> rows_;
};

}  // namespace

SIEVE_DEFINE_PLUGIN(DpxaPolicy);
