// deltakv: Delta-KV compression (paper 001 §4.1) as a prefill `attend` override.
//
// Method, per sequence and KV head, over the layer's resident keys (post-RoPE, from the pages):
//  stage 1  keep mask: chunks of `chunk` keys, each starting with an anchor; walking a chunk, a key
//           becomes the new anchor when it differs from the current one (metric=cos: cosine <
//           threshold; metric=l2: distance > threshold), else it joins the anchor's run.
//           packing=periodic|random replace the rule by a content-blind one at a kept fraction
//           1 - reduction (the paper's Table 7 baselines).
//  stage 2  pack: the anchors' positions and reach (last position a run covers); counts are
//           reach - anchor + 1. K̂ and V̂ are the anchor rows of the pages, read in place (gathered
//           by position) instead of copied: same numbers, no second copy of the cache.
//  stage 3  count-weighted attention (the core kernel's attention variant: this plugin describes
//           the keys each row attends, sieve_attention_variant, and the host's kernel attends
//           them), per query at position p in the block of q_block positions
//           starting at qs = p - p mod q_block:
//             phase 1 over the *safe* anchors — those whose run ends before qs (reach < qs), a
//                     prefix of the anchors — with logit scale·q·k̂_j + ln(count_j) (f32);
//             phase 2 exactly over the original keys from just after the last safe anchor's
//                     reach to p (causal).
//           Every position 0..p is represented once; the softmax runs over both phases at once.
//           Ablations: count_weighting=false (no ln count), phase2=off (every anchor that starts
//           at or before p, its count clipped at p; no exact keys), phase2=only (no phase 1).
// The decode that follows is not this plugin's (phases = PREFILL): it reads the full cache.
//
// Reports kv_reduction = 1 - m/n per (layer, KV head) and per layer (head -1) through the host's
// metric callback, and one log line per layer. On CUDA that needs the counts on the host, i.e. a
// stream synchronisation: only with report=on (report=auto reports on the CPU only).
//
// Hooks: attend. Scratch (allocated in create, sized by max_seq_len × max_batch × n_kv_heads):
// keep mask, anchors, reach, their counts, anchor counts, the variant's rows and spans (CUDA: also
// per-chunk anchor counts and each anchor's physical page; CPU: an f32 copy of one head's K). Host
// services: alloc/free, cuda_stream, log, metric, kernels->attend with a variant (ABI 1.1,
// SIEVE_VARIANT_KEY_SPANS). CUDA graphs: STATIC_SHAPES (grid sizes follow the call's lengths;
// report=on synchronises and cannot be captured).
#include <sieve/plugin/attention_variant.hpp>
#include <sieve/plugin/policy_api.hpp>
#include <sieve/util/page_layout.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cpu/deltakv_cpu.hpp"
#include "deltakv_math.hpp"
#if SIEVE_WITH_CUDA
#include "cuda/deltakv_cuda.hpp"
#endif

namespace {

namespace sp = sieve::plugin;
namespace dk = sieve::deltakv;

#if SIEVE_WITH_CUDA
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU;
#endif

class DeltaKvPolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_param_spec kParams[] = {
      sp::float_param("threshold", "0.83", -1e9, 1e9,
                      "metric=cos: a key with cosine < threshold to its anchor becomes an anchor; "
                      "metric=l2: distance > threshold"),
      sp::enum_param("metric", "cos", "cos|l2", "similarity of a key to its run's anchor"),
      sp::int_param("chunk", "512", 1, 1 << 30, "keys per independent stage-1 chunk"),
      sp::int_param("q_block", "64", 1, 1 << 30,
                    "query block (positions) of the safe-anchor test: phase 1 takes anchors whose "
                    "run ends before the block"),
      sp::bool_param("count_weighting", "true", "add ln(count) to each anchor's logit"),
      sp::enum_param("phase2", "on", "on|off|only",
                     "exact critical diagonal: on, off (ablation), only (ablation: no phase 1)"),
      sp::enum_param("packing", "delta", "delta|periodic|random",
                     "keep rule: delta (threshold), or periodic/random at `reduction`"),
      sp::float_param("reduction", "0.5", 0, 0.999,
                      "packing=periodic|random: fraction of keys dropped (match a delta run's "
                      "kv_reduction)"),
      sp::int_param("seed", "0", 0, 1e15, "packing=random: seed of the keep hash"),
      sp::enum_param("report", "auto", "auto|on|off",
                     "kv_reduction metric + log line; auto: CPU only (on CUDA it synchronises)"),
  };
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "deltakv",
      .vendor = "sieve",
      .version_major = 1,
      .version_minor = 0,
      .version_patch = 0,
      .summary = "Delta-KV: prefill attention over delta-packed K/V (count-weighted) + exact diagonal",
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
      // Every CPU and CUDA path reads pages through the view's strides and byte_offset.
      .kv_layouts = SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
  };

  static void validate(const sieve_geometry& g, const sp::Params&, sp::Reasons& r) {
#if SIEVE_WITH_CUDA
    if (g.device.device_type == kDLCUDA && !dk::cuda_head_dim_supported(g.head_dim))
      r.unsupported("head_dim = ", g.head_dim, " on CUDA: the deltakv kernels take ",
                    dk::cuda_head_dims());
#endif
    const int64_t slots = int64_t(g.max_batch) * g.n_kv_heads * g.max_seq_len;
    if (slots > int64_t(INT32_MAX))
      r.unsupported("max_batch x n_kv_heads x max_seq_len = ", slots,
                    " anchor slots exceed the int32 index range");
  }

  explicit DeltaKvPolicy(const sp::CreateContext& ctx) : PolicyBase(ctx) {
    const sp::Params& p = ctx.params;
    rule_.packing = int32_t(p.choice("packing"));
    rule_.metric = int32_t(p.choice("metric"));
    rule_.threshold = float(p.real("threshold"));
    rule_.keep = 1.0 - p.real("reduction");
    rule_.seed = uint64_t(p.integer("seed"));
    rule_.chunk = int32_t(p.integer("chunk"));
    attend_.q_block = int32_t(p.integer("q_block"));
    attend_.phase2 = int32_t(p.choice("phase2"));
    attend_.count_weighting = p.boolean("count_weighting");
    attend_.scale = 1.f / std::sqrt(float(geometry().head_dim));
    const sieve_geometry& g = geometry();
    const bool cuda = g.device.device_type == kDLCUDA;
    const uint32_t report = p.choice("report");  // auto | on | off
    report_ = report == 1 || (report == 0 && !cuda);

    const size_t seqs = size_t(g.max_batch) * g.n_kv_heads;
    const size_t slots = seqs * size_t(g.max_seq_len);
    anchor_ = allocate(g.device, slots * sizeof(int32_t));
    reach_ = allocate(g.device, slots * sizeof(int32_t));
    count_ = allocate(g.device, slots * sizeof(int32_t));
    n_anchors_ = allocate(g.device, seqs * sizeof(int32_t));
    host_counts_ = allocate(sieve::kCpu, seqs * sizeof(int32_t));
    // Variant rows: at most one per (query token, KV head), two spans each.
    row_spans_ = allocate(g.device, slots * 2 * sizeof(int32_t));
    spans_ = allocate(g.device, slots * 6 * sizeof(int32_t));
    if (cuda) {
#if SIEVE_WITH_CUDA
      keep_ = allocate(g.device, slots);
      anchor_page_ = allocate(g.device, slots * sizeof(int32_t));
      const int32_t chunks = (g.max_seq_len + rule_.chunk - 1) / rule_.chunk;
      chunk_anchors_ = allocate(g.device, seqs * size_t(chunks) * sizeof(int32_t));
#endif
    } else {
      // One (sequence, KV head) at a time: f32 K and its keep mask.
      const size_t n = size_t(g.max_seq_len);
      keep_ = allocate(sieve::kCpu, n);
      kf_ = allocate(sieve::kCpu, n * size_t(g.head_dim) * sizeof(float));
    }
    log_debug("packing = ", p.text("packing"), ", metric = ", p.text("metric"), ", threshold = ",
              rule_.threshold, ", chunk = ", rule_.chunk, ", q_block = ", attend_.q_block,
              ", phase2 = ", p.text("phase2"), ", count_weighting = ", attend_.count_weighting);
  }

  void attend(const sieve_layer_call& call, const sieve_selection& selection,
              DLTensor& out) override {
    const sieve_geometry& g = geometry();
    if (call.phase != SIEVE_PHASE_PREFILL)
      sp::fail(SIEVE_ERR_UNSUPPORTED, "deltakv runs in prefill only (phase ", call.phase, ")");
    if (selection.kind != SIEVE_SEL_ALL)
      sp::fail(SIEVE_ERR_UNSUPPORTED,
               "deltakv attends every resident key in its own packed form; it cannot follow a "
               "block selection (selection kind ", selection.kind, ")");
    check_call(call, out);
    if (call.batch == 0) return;
    if (g.device.device_type == kDLCPU) attend_cpu(call, out);
    else attend_cuda(call, out);
  }

 private:
  void check_call(const sieve_layer_call& call, const DLTensor& out) const {
    const sieve_geometry& g = geometry();
    if (call.batch < 0 || call.batch > g.max_batch)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "batch = ", call.batch, " is outside [0, max_batch = ",
               g.max_batch, "]");
    sp::require_struct(call.kv_view, "KV view");
    const sieve_paged_kv& view = *call.kv_view;
    if (view.page_size != g.page_size || view.batch != call.batch)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV view (page_size ", view.page_size, ", batch ",
               view.batch, ") does not match the call (page_size ", g.page_size, ", batch ",
               call.batch, ")");
    if (call.batch > 0 && (!call.kv_len_host || !call.qo_indptr_host || !view.indptr_host ||
                           !view.last_page_len_host))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT,
               "kv_len_host, qo_indptr_host or the view's host page table is NULL");
    const int64_t n_q = call.batch > 0 ? call.qo_indptr_host[call.batch] : 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      const int64_t kv_len = call.kv_len_host[b];
      if (n_new < 0 || n_new > kv_len || kv_len > g.max_seq_len)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sequence ", b, " has ", n_new, " queries and kv_len ",
                 kv_len, " (max_seq_len ", g.max_seq_len, ")");
      if (kv_len != sp::view_tokens(view, b))
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "kv_len_host[", b, "] = ", kv_len,
                 " but the KV view holds ", sp::view_tokens(view, b), " tokens");
    }
    auto check_qo = [&](const DLTensor* t, const char* what) {
      std::string e = sieve::check_tensor(t, what, 3, {n_q, g.n_q_heads, g.head_dim});
      if (e.empty() && (!sieve::is_float_storage(t->dtype) || !sieve::is_contiguous(*t)))
        e = std::string(what) + " must be a contiguous f32/f16/bf16 tensor";
      if (e.empty() && (t->device.device_type != g.device.device_type ||
                        t->device.device_id != g.device.device_id))
        e = std::string(what) + " is on " + sieve::device_name(t->device) + ", the policy on " +
            sieve::device_name(g.device);
      if (!e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    };
    check_qo(call.q, "q");
    check_qo(&out, "out");
    if (!sieve::same_dtype(view.k_pages.dtype, g.kv_dtype) ||
        !sieve::same_dtype(view.v_pages.dtype, g.kv_dtype) || view.k_pages.ndim != 4 ||
        view.k_pages.shape[1] != g.n_kv_heads || view.k_pages.shape[2] != g.page_size ||
        view.k_pages.shape[3] != g.head_dim)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV view's pages are not [pages, ", g.n_kv_heads,
               ", ", g.page_size, ", ", g.head_dim, "] of ", sieve::dtype_name(g.kv_dtype));
  }

  // Where K/V rows live: the view's strides and byte_offset in any layout kv_store.h allows
  // (deltakv declares them all), one line otherwise.
  static sieve::PageStrides kv_strides(const sieve_paged_kv& view) {
    sieve::PageStrides at;
    if (std::string e = sieve::view_page_strides(view, &at); !e.empty()) sp::fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    return at;
  }

  // ---- CPU ----------------------------------------------------------------------------------
  void attend_cpu(const sieve_layer_call& call, DLTensor& out) {
    const sieve_geometry& g = geometry();
    const sieve_paged_kv& view = *call.kv_view;
    const int32_t d = g.head_dim, P = g.page_size, hkv = g.n_kv_heads;
    const int64_t n_pool = view.k_pages.shape[0];
    float* kf = kf_.get<float>();
    uint8_t* keep = keep_.get<uint8_t>();
    int32_t* counts = host_counts_.get<int32_t>();
    int32_t* row_spans = row_spans_.get<int32_t>();
    int32_t(*spans)[3] = reinterpret_cast<int32_t(*)[3]>(spans_.get<int32_t>());
    const int32_t* indices = sieve::data_ptr<const int32_t>(view.indices);
    const void* kbase = sieve::data_ptr<const void>(view.k_pages);
    const sieve::PageStrides at = kv_strides(view);
    const int32_t qb = dk::variant_q_block(attend_.phase2, attend_.q_block, g.max_seq_len, call.qo_indptr_host,
                                           call.kv_len_host, call.batch);
    int64_t c_b = 0;  // row blocks of the earlier sequences
    for (int32_t b = 0; b < call.batch; ++b) {
      const int32_t n = call.kv_len_host[b];
      const int32_t n_new = call.qo_indptr_host[b + 1] - call.qo_indptr_host[b];
      const int32_t blocks = (n_new + qb - 1) / qb;
      for (int32_t kvh = 0; kvh < hkv; ++kvh) {
        for (int32_t pos = 0; pos < n; ++pos) {  // this head's K in f32, by position
          const int32_t slot = view.indptr_host[b] + pos / P;
          const int32_t phys = indices[slot];
          if (phys < 0 || phys >= n_pool)
            sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sequence ", b, ": page table entry ", slot,
                     " = ", phys, " is outside the pool of ", n_pool, " pages");
          const int64_t src = at.row(phys, kvh, pos % P);
          for (int32_t i = 0; i < d; ++i) kf[int64_t(pos) * d + i] = sieve::load_float(kbase, g.kv_dtype, src + i);
        }
        const size_t sidx = size_t(b) * hkv + kvh;
        const int32_t base = int32_t(sidx * g.max_seq_len);
        int32_t* anchor = anchor_.get<int32_t>() + base;
        int32_t* reach = reach_.get<int32_t>() + base;
        int32_t* count = count_.get<int32_t>() + base;
        dk::keep_mask(rule_, call.layer, kvh, kf, n, d, keep);
        const int32_t m = dk::pack(keep, n, anchor, reach);
        counts[sidx] = m;
        for (int32_t j = 0; j < m; ++j) count[j] = reach[j] - anchor[j] + 1;
        for (int32_t t = 0; t < blocks; ++t) {  // the rows of (sequence b, KV head kvh)
          const int64_t row = (c_b + t) * hkv + kvh;
          const int32_t k = dk::variant_spans(attend_.phase2, reach, m, n - n_new + t * qb, attend_.q_block, base, n,
                                              spans + 2 * row);
          row_spans[2 * row] = int32_t(2 * row);
          row_spans[2 * row + 1] = int32_t(2 * row + k);
        }
      }
      c_b += blocks;
    }
    attend_variant(call, out, qb, int32_t(c_b * hkv));
    if (report_) report(call, counts);
  }

  // Stage 3: the host's core kernel over the rows and spans in row_spans_ / spans_ (on the
  // policy's device), the packed keys being the anchors with their counts.
  void attend_variant(const sieve_layer_call& call, DLTensor& out, int32_t rows_q_block, int32_t n_rows) {
    const sieve_geometry& g = geometry();
    const int64_t slots = int64_t(g.max_batch) * g.n_kv_heads * g.max_seq_len;
    const sp::AttentionVariant v(g.device, SIEVE_SEL_PER_KV_HEAD, rows_q_block, n_rows, row_spans_.get<int32_t>(),
                                 2 * int64_t(n_rows), spans_.get<int32_t>(), slots, anchor_.get<int32_t>(),
                                 attend_.count_weighting ? count_.get<int32_t>() : nullptr);
    core_kernel_attend(v.args(call, out, g, attend_.scale), "deltakv stage 3 (the core kernel's attention variant)");
  }

  // kv_reduction per KV head (over the batch) and for the layer, from the anchor counts.
  void report(const sieve_layer_call& call, const int32_t* counts) const {
    const int32_t hkv = geometry().n_kv_heads;
    int64_t n = 0, m_all = 0;
    for (int32_t b = 0; b < call.batch; ++b) n += call.kv_len_host[b];
    if (n == 0) return;
    const sieve_host_services& s = services();
    const bool has_metric = SIEVE_HAS_FIELD(&s, sieve_host_services, metric) && s.metric;
    std::string heads;
    for (int32_t kvh = 0; kvh < hkv; ++kvh) {
      int64_t m = 0;
      for (int32_t b = 0; b < call.batch; ++b) m += counts[size_t(b) * hkv + kvh];
      m_all += m;
      const double red = 1.0 - double(m) / double(n);
      if (has_metric) s.metric(s.host_ctx, "kv_reduction", call.layer, kvh, red);
      char buf[16];
      std::snprintf(buf, sizeof buf, " %.3f", red);
      heads += buf;
    }
    const double red = 1.0 - double(m_all) / (double(n) * hkv);
    if (has_metric) s.metric(s.host_ctx, "kv_reduction", call.layer, -1, red);
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.4f", red);
    log_info("layer ", call.layer, ": kv_reduction ", buf, " (", n, " keys x ", hkv,
             " KV heads; per KV head:", heads, ")");
  }

  // ---- CUDA -----------------------------------------------------------------------------------
#if SIEVE_WITH_CUDA
  void attend_cuda(const sieve_layer_call& call, DLTensor& out) {
    const sieve_geometry& g = geometry();
    const sieve_paged_kv& view = *call.kv_view;
    auto device_int32 = [&](const DLTensor* t, const char* what, int64_t n) -> const int32_t* {
      if (!t || !t->data || !sieve::same_dtype(t->dtype, sieve::kI32) || t->ndim != 1 ||
          t->shape[0] < n || !sieve::is_contiguous(*t) || t->device.device_type != kDLCUDA ||
          t->device.device_id != g.device.device_id)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, what, " must be a contiguous int32 [", n,
                 "] tensor on ", sieve::device_name(g.device));
      return sieve::data_ptr<const int32_t>(*t);
    };
    dk::CudaLaunch a{};
    a.qo_indptr = device_int32(call.qo_indptr, "qo_indptr", call.batch + 1);
    a.kv_indptr = device_int32(&view.indptr, "the KV view's indptr", call.batch + 1);
    a.last_page_len = device_int32(&view.last_page_len, "the KV view's last_page_len", call.batch);
    a.kv_indices = device_int32(&view.indices, "the KV view's indices", 0);
    a.kv_indices_len = view.indices.shape[0];
    a.k = sieve::data_ptr<const void>(view.k_pages);
    a.v = sieve::data_ptr<const void>(view.v_pages);
    a.kv_strides = kv_strides(view);
    a.page_capacity = view.k_pages.shape[0];
    a.kv_dt = sieve::require_storage(g.kv_dtype, "the KV pages");
    a.batch = call.batch;
    a.hq = g.n_q_heads;
    a.hkv = g.n_kv_heads;
    a.d = g.head_dim;
    a.page_size = g.page_size;
    a.max_seq_len = g.max_seq_len;
    a.layer = call.layer;
    int32_t max_len = 0, max_new = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      max_len = std::max(max_len, call.kv_len_host[b]);
      max_new = std::max(max_new, call.qo_indptr_host[b + 1] - call.qo_indptr_host[b]);
    }
    a.max_kv_len = max_len;
    a.keep_rule = rule_;
    a.keep = keep_.get<uint8_t>();
    a.chunk_anchors = chunk_anchors_.get<int32_t>();
    a.anchor = anchor_.get<int32_t>();
    a.reach = reach_.get<int32_t>();
    a.anchor_page = anchor_page_.get<int32_t>();
    a.n_anchors = n_anchors_.get<int32_t>();
    a.stream = cuda_stream();
    dk::CudaSpans spans{};
    spans.q_block = attend_.q_block;
    spans.phase2 = attend_.phase2;
    spans.rows_q_block = dk::variant_q_block(attend_.phase2, attend_.q_block, g.max_seq_len, call.qo_indptr_host,
                                             call.kv_len_host, call.batch);
    spans.count = count_.get<int32_t>();
    spans.row_spans = row_spans_.get<int32_t>();
    spans.spans = spans_.get<int32_t>();
    if (const char* error = dk::launch_deltakv_pack(a))
      sp::fail(SIEVE_ERR_DEVICE, "deltakv kernel launch failed: ", error);
    if (const char* error = dk::launch_deltakv_spans(a, spans, max_new))
      sp::fail(SIEVE_ERR_DEVICE, "deltakv kernel launch failed: ", error);
    int64_t n_rows = 0;
    for (int32_t b = 0; b < call.batch; ++b)
      n_rows += (call.qo_indptr_host[b + 1] - call.qo_indptr_host[b] + spans.rows_q_block - 1) / spans.rows_q_block;
    attend_variant(call, out, spans.rows_q_block, int32_t(n_rows * g.n_kv_heads));
    if (report_) {
      int32_t* counts = host_counts_.get<int32_t>();
      if (const char* error = dk::read_anchor_counts(a, counts))
        sp::fail(SIEVE_ERR_DEVICE, "deltakv: reading the anchor counts failed: ", error);
      report(call, counts);
    }
  }
#else
  [[noreturn]] void attend_cuda(const sieve_layer_call&, DLTensor&) {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of deltakv has no CUDA code");
  }
#endif

  dk::KeepRule rule_{};
  dk::AttendRule attend_{};
  bool report_ = true;
  sp::HostBuffer anchor_, reach_, count_, n_anchors_, host_counts_, keep_;
  sp::HostBuffer row_spans_, spans_;  // the variant's rows and spans (stage 3)
  sp::HostBuffer chunk_anchors_;  // CUDA: anchors per (sequence, KV head, chunk)
  sp::HostBuffer anchor_page_;    // CUDA: physical page of each anchor
  sp::HostBuffer kf_;             // CPU
};

}  // namespace

SIEVE_DEFINE_PLUGIN(DeltaKvPolicy);
