// delta: DELTA (Dynamic Layer-Aware Token Attention, paper 000 §4) as one policy instance that
// serves every decode layer of a model.
//
// Method. Each layer has a role, set by the instance's parameters:
//   dense  (dense_layers)  full attention; the policy leaves the chain's selection alone;
//   select (select_layers) a Δ-layer: full attention, from which a new selection is made;
//   sparse (every other)   attends only the selection of the latest Δ-layer of this step.
// At a Δ-layer, select() asks the core kernel for page statistics computed in the same pass as
// the full attention: page_mass[u] = S_u = Σ_{t in page u} max_h p_h(t), each head normalised by
// its own log-sum-exp (SIEVE_STATS_PAGE_MASS_ALL_HEADS; PER_KV_HEAD with per_kv_head=true, the max
// then runs over one GQA group). observe() turns S_u into the selection: per sequence, the pages
// holding the last `recent` tokens plus the best earlier pages by S_u, budget_pages =
// token_budget / page_size pages in all (delta_page_plan.hpp gives the plan; the top-k is
// core/selection's, deterministic ties). While a sequence fits in the budget every page is kept.
// The selection lives in buffers the instance owns and is written into the chain's selection at
// each following sparse layer. It is refreshed at every Δ-layer of every step and dropped at
// end_step: nothing is cached across steps. DELTA never evicts (the full cache stays resident).
//
// Hooks: select, observe, end_step. Core kernels: dense attention with page statistics (Δ-layers)
// and block-sparse attention over the selection (sparse layers), both through the host.
// CUDA: observe enqueues a score-preparation kernel and core/selection's batched top-k on the
// host's stream; sparse layers copy the stored CSR with one kernel on the same stream. No
// allocation or synchronisation in hooks. CUDA graphs: STATIC_SHAPES (launch shapes and the
// host-side capacity checks follow the batch and lengths of the captured call).
#include <sieve/plugin/policy_api.hpp>
#include <sieve/selection/top_k.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "delta_page_plan.hpp"
#if SIEVE_WITH_CUDA
#include "cuda/delta_select.hpp"
#endif

namespace {

namespace sp = sieve::plugin;
namespace sd = sieve::delta;

#if SIEVE_WITH_CUDA
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU;  // a CPU-only build cannot write CUDA selections
#endif

enum Role : uint8_t { kSparse = 0, kDense = 1, kSelect = 2 };

const char* role_name(uint8_t r) { return r == kDense ? "dense" : r == kSelect ? "select" : "sparse"; }

// The role of every layer from the two lists, reporting each problem. Both lists empty (the
// default) means dense [0, 1] and select [2] — clipped for models of fewer than 3 layers so that a
// Δ-layer always exists (1 layer: select [0]; 2 layers: dense [0], select [1]).
std::vector<uint8_t> layer_roles(const sieve_geometry& g, const sp::Params& p, sp::Reasons& r) {
  const int32_t n = g.n_layers;
  std::vector<uint8_t> roles(size_t(std::max(n, 0)), kSparse);
  auto dense = p.int_list("dense_layers");
  auto select = p.int_list("select_layers");
  if (n <= 0) return roles;  // the generic geometry checks report it
  if (dense.empty() && select.empty()) {
    const int32_t n_dense = std::min(2, n - 1);
    for (int32_t l = 0; l < n_dense; ++l) roles[size_t(l)] = kDense;
    roles[size_t(n_dense)] = kSelect;
    return roles;
  }
  bool ok = true;
  auto mark = [&](std::span<const int64_t> list, const char* name, Role role) {
    for (int64_t l : list) {
      if (l < 0 || l >= n) {
        r.invalid(name, ": layer ", l, " does not exist (the model has ", n, " layers, 0-", n - 1,
                  ")");
        ok = false;
        continue;
      }
      uint8_t& slot = roles[size_t(l)];
      if (slot == role) {
        r.invalid(name, " lists layer ", l, " twice");
        ok = false;
      } else if (slot != kSparse) {
        r.invalid("layer ", l, " is in both dense_layers and select_layers: a layer has one role");
        ok = false;
      } else {
        slot = uint8_t(role);
      }
    }
  };
  mark(dense, "dense_layers", kDense);
  mark(select, "select_layers", kSelect);
  if (!ok) return roles;
  if (select.empty()) {
    r.invalid("select_layers is empty: name at least one Δ-layer (e.g. select_layers=[",
              std::min<int64_t>(int64_t(dense.size()), n - 1),
              "]), or leave both lists empty for the default dense [0,1], select [2]");
    return roles;
  }
  int32_t first_select = 0;
  while (roles[size_t(first_select)] != kSelect) ++first_select;
  for (int32_t l = 0; l < first_select; ++l)
    if (roles[size_t(l)] == kSparse) {
      r.invalid("layer ", l,
                " is in neither dense_layers nor select_layers, so it is sparse, but no select "
                "layer precedes it (the first is ",
                first_select, "): add it to dense_layers");
      break;
    }
  return roles;
}

// Budget checks shared by validate and create.
void check_budget(const sieve_geometry& g, int64_t budget, int64_t recent, sp::Reasons& r) {
  const int32_t P = g.page_size;
  if (P <= 0) return;  // the generic geometry checks report it
  if (budget < recent) {
    r.invalid("token_budget = ", budget, " is smaller than recent = ", recent,
              ": the recency window must fit in the budget");
    return;
  }
  if (budget % P != 0) {
    r.invalid("token_budget = ", budget, " is not a multiple of page_size = ", P,
              " (DELTA selects whole pages): use ", (budget / P + 1) * P);
    return;
  }
  const int64_t need = sd::max_window_pages(recent, P);
  if (budget / P < need)
    r.invalid("token_budget = ", budget, " (", budget / P, " pages of ", P,
              ") cannot hold the recency window: the last recent = ", recent,
              " tokens can touch ", need, " pages; use token_budget >= ", need * P);
}

class DeltaPolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_param_spec kParams[] = {
      sp::int_param("token_budget", "1024", 1, INT32_MAX,
                    "K: tokens each sparse-layer row attends (a multiple of page_size)"),
      sp::int_param("recent", "32", 1, INT32_MAX,
                    "L: most recent tokens always kept (their pages), the query itself included"),
      sp::int_list_param("dense_layers", "", 0, INT32_MAX,
                         "layers with full attention, no selection (both lists empty: [0,1])"),
      sp::int_list_param("select_layers", "", 0, INT32_MAX,
                         "Δ-layers: full attention that refreshes the selection (both empty: [2])"),
      sp::bool_param("per_kv_head", "false",
                     "one selection per KV head (max over its query group) instead of per sequence"),
  };
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "delta",
      .vendor = "sieve",
      .version_major = 1,
      .version_minor = 0,
      .version_patch = 0,
      .summary = "DELTA: Δ-layers pick top pages by max-over-heads attention + a recency window; "
                 "later layers reuse them",
      .phases = SIEVE_PHASE_DECODE,
      .devices = kDevices,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_SEQUENCE,
      .needs = SIEVE_NEEDS_PAGE_STATS,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_STATIC_SHAPES,
      .conform_params = "token_budget=256,recent=16,dense_layers=[],select_layers=[0]",
      .selection_basis = SIEVE_SELECTION_BASIS_CONTENT,
      // Reads no K/V page itself (the core kernels do, honouring strides): any layout.
      .kv_layouts = SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
  };
#ifdef SIEVE_PLUGIN_TOOLS
  static constexpr sieve_tool kTools[] = {sp::module_tool<SIEVE_TOOL_MODULE, "sieve_delta_calibrate">(
      "calibrate", "per-layer attention shift between decode steps of a model; suggests the Δ-layers")};
#endif

  static void validate(const sieve_geometry& g, const sp::Params& p, sp::Reasons& r) {
    layer_roles(g, p, r);
    check_budget(g, p.integer("token_budget"), p.integer("recent"), r);
    const int64_t H = p.boolean("per_kv_head") ? g.n_kv_heads : 1;
    if (int64_t(g.max_batch) * H >= INT32_MAX)
      r.unsupported("max_batch x rows per sequence = ", int64_t(g.max_batch) * H,
                    " selection rows exceed the int32 row count");
  }

  explicit DeltaPolicy(const sp::CreateContext& ctx)
      : PolicyBase(ctx),
        budget_(ctx.params.integer("token_budget")),
        recent_(ctx.params.integer("recent")),
        per_kv_head_(ctx.params.boolean("per_kv_head")) {
    const sieve_geometry& g = geometry();
    sp::Reasons reasons;
    roles_ = layer_roles(g, ctx.params, reasons);
    if (!reasons.empty()) sp::fail(reasons.status(), reasons.joined());  // validate ran already
    heads_ = per_kv_head_ ? g.n_kv_heads : 1;
    budget_pages_ = int32_t(budget_ / g.page_size);
    max_pages_ = sd::ceil_pages(g.max_seq_len, g.page_size);
    row_capacity_ = std::min(budget_pages_, max_pages_);
    const int64_t max_rows = int64_t(g.max_batch) * heads_;
    const DLDevice dev = g.device;
    sel_indptr_ = allocate(dev, sizeof(int32_t) * size_t(max_rows + 1));
    sel_indices_ = allocate(dev, sizeof(int32_t) * size_t(std::max<int64_t>(max_rows * row_capacity_, 1)));
    if (dev.device_type == kDLCPU) {
      topk_scratch_ = allocate(dev, sizeof(int32_t) * size_t(std::max(max_pages_, 1)));
    } else {
#if SIEVE_WITH_CUDA
      // Scores with the straddling window page forced (+inf), then core/selection's top-k.
      scores_ = allocate(dev, sizeof(float) * size_t(std::max<int64_t>(
                                                  int64_t(g.max_batch) * max_pages_ * heads_, 1)));
      const size_t topk_bytes =
          sd::delta_topk_scratch_bytes(g.max_batch, heads_, max_pages_);
      if (topk_bytes) topk_scratch_ = allocate(dev, topk_bytes);
#endif
    }
    seq_ids_.reserve(size_t(g.max_batch));
    kv_pages_.reserve(size_t(g.max_batch));
    std::string layout;
    for (size_t l = 0; l < roles_.size(); ++l) {
      if (l) layout += ',';
      layout += role_name(roles_[l]);
    }
    log_debug("token_budget = ", budget_, " (", budget_pages_, " pages), recent = ", recent_,
              ", per_kv_head = ", per_kv_head_, ", layers: ", layout);
  }

  void select(const sieve_layer_call& call, sieve_selection& selection, uint32_t& stats) override {
    const uint8_t role = check_call(call);
    if (role == kDense) return;  // full attention: the chain's selection stays as it is
    if (role == kSelect) {
      // Full attention (the selection is left as the chain made it), with the page statistics.
      stats = per_kv_head_ ? SIEVE_STATS_PAGE_MASS_PER_KV_HEAD : SIEVE_STATS_PAGE_MASS_ALL_HEADS;
      return;
    }
    // Sparse: the selection of this step's latest Δ-layer, for the same sequences and lengths.
    if (!valid_ || step_ != call.step)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "layer ", call.layer,
               " is sparse but no Δ-layer made a selection in step ", call.step,
               ": the chain must route a select layer (", select_list(),
               ") before it through this instance");
    if (call.batch != int32_t(seq_ids_.size()))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "layer ", call.layer, " has ", call.batch,
               " sequences, the Δ-layer ", from_layer_, " of this step had ", seq_ids_.size());
    const sieve_paged_kv& view = *call.kv_view;
    for (int32_t b = 0; b < call.batch; ++b) {
      if (call.seq_ids[b] != seq_ids_[size_t(b)])
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "layer ", call.layer, ": sequence ", b, " is id ",
                 call.seq_ids[b], ", the Δ-layer ", from_layer_, " selected for id ",
                 seq_ids_[size_t(b)]);
      const int32_t pages = view.indptr_host[b + 1] - view.indptr_host[b];
      if (pages != kv_pages_[size_t(b)])
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "layer ", call.layer, ": sequence ", b, " has ",
                 pages, " pages, ", kv_pages_[size_t(b)], " at the Δ-layer ", from_layer_,
                 " (DELTA needs the same resident pages in every layer)");
    }
    const int32_t n_rows = call.batch * heads_;
    sp::check_selection_storage(selection, n_rows, nnz_, geometry().device);
    if (geometry().device.device_type == kDLCPU) {
      std::memcpy(sieve::data_ptr<int32_t>(selection.indptr), sel_indptr_.get<int32_t>(),
                  sizeof(int32_t) * size_t(n_rows + 1));
      std::memcpy(sieve::data_ptr<int32_t>(selection.indices), sel_indices_.get<int32_t>(),
                  sizeof(int32_t) * size_t(nnz_));
    } else {
      copy_cuda(selection, n_rows);
    }
    selection.kind = SIEVE_SEL_BLOCKS;
    selection.heads = per_kv_head_ ? SIEVE_SEL_PER_KV_HEAD : SIEVE_SEL_PER_SEQUENCE;
    selection.q_block = 1;
    selection.k_block_pages = 1;
    selection.n_rows = n_rows;
  }

  void observe(const sieve_layer_call& call, const sieve_attention_stats& stats) override {
    const uint8_t role = check_call(call);
    if (role != kSelect)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "observe at layer ", call.layer, ", a ",
               role_name(role), " layer: statistics are asked for only at select layers (",
               select_list(), ")");
    const uint32_t want =
        per_kv_head_ ? SIEVE_STATS_PAGE_MASS_PER_KV_HEAD : SIEVE_STATS_PAGE_MASS_ALL_HEADS;
    if (stats.request != want)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "statistics request ", stats.request, ", asked for ",
               want);
    const sieve_paged_kv& view = *call.kv_view;
    const DLTensor& mass = stats.page_mass;
    const int64_t nnz_pages = call.batch > 0 ? view.indptr_host[call.batch] : 0;
    const DLDevice dev = geometry().device;
    if (!mass.data || !sieve::same_dtype(mass.dtype, sieve::kF32) || mass.ndim != 2 ||
        mass.shape[0] < nnz_pages || mass.shape[1] != heads_ || !sieve::is_contiguous(mass) ||
        mass.device.device_type != dev.device_type || mass.device.device_id != dev.device_id)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "page_mass must be a contiguous f32 [", nnz_pages, ", ",
               heads_, "] tensor on ", sieve::device_name(dev));
    if (call.batch > 0 && view.indptr_host[0] != 0)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "the KV view's indptr starts at ", view.indptr_host[0],
               ", not 0");

    // Plan the rows on the host mirrors (their sizes are known without the scores).
    valid_ = false;
    seq_ids_.assign(call.seq_ids, call.seq_ids + call.batch);
    kv_pages_.clear();
    int64_t nnz = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const sd::RowPlan plan = plan_of(call, b);
      kv_pages_.push_back(plan.n);
      nnz += int64_t(plan.count()) * heads_;
    }
    if (dev.device_type == kDLCPU) {
      const float* scores = sieve::data_ptr<const float>(mass);
      auto* indptr = sel_indptr_.get<int32_t>();
      auto* indices = sel_indices_.get<int32_t>();
      int64_t w = 0;
      indptr[0] = 0;
      for (int32_t b = 0; b < call.batch; ++b) {
        const sd::RowPlan plan = plan_of(call, b);
        for (int32_t h = 0; h < heads_; ++h) {
          w += sieve::selection::top_k_row({plan.n, 0, plan.window, plan.k},
                                           scores + int64_t(view.indptr_host[b]) * heads_ + h,
                                           heads_, indices + w, topk_scratch_.get<int32_t>());
          indptr[b * heads_ + h + 1] = int32_t(w);
        }
      }
      nnz = w;  // equal to the plan unless a score was NaN/-inf (never picked)
    } else {
      observe_cuda(call, mass);
    }
    nnz_ = nnz;
    step_ = call.step;
    from_layer_ = call.layer;
    valid_ = true;
  }

  void end_step(const sieve_step_end&) override { valid_ = false; }

 private:
  // Checks every hook needs; returns the layer's role.
  uint8_t check_call(const sieve_layer_call& call) const {
    const sieve_geometry& g = geometry();
    if (call.phase != SIEVE_PHASE_DECODE)
      sp::fail(SIEVE_ERR_UNSUPPORTED, "phase ", call.phase, ": DELTA serves decode only");
    if (call.layer < 0 || call.layer >= int32_t(roles_.size()))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "layer ", call.layer, " does not exist (the model has ",
               roles_.size(), " layers)");
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
    if (call.batch > 0 && (!call.kv_len_host || !call.qo_indptr_host || !call.seq_ids ||
                           !view.indptr_host || !view.last_page_len_host))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT,
               "seq_ids, kv_len_host, qo_indptr_host or the view's host page table is NULL");
    for (int32_t b = 0; b < call.batch; ++b) {
      const int64_t n_new = int64_t(call.qo_indptr_host[b + 1]) - call.qo_indptr_host[b];
      if (n_new != 1)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "decode has one query per sequence, sequence ", b,
                 " has ", n_new);
      if (call.kv_len_host[b] != sp::view_tokens(view, b))
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "kv_len_host[", b, "] = ", call.kv_len_host[b],
                 " but the KV view holds ", sp::view_tokens(view, b), " tokens");
      if (call.kv_len_host[b] > g.max_seq_len)
        sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "sequence ", b, " has ", call.kv_len_host[b],
                 " tokens, more than max_seq_len = ", g.max_seq_len);
    }
    return roles_[size_t(call.layer)];
  }

  sd::RowPlan plan_of(const sieve_layer_call& call, int32_t b) const {
    return sd::plan_row(call.kv_len_host[b], recent_, budget_pages_, geometry().page_size);
  }

  std::string select_list() const {
    std::string s;
    for (size_t l = 0; l < roles_.size(); ++l)
      if (roles_[l] == kSelect) {
        if (!s.empty()) s += ',';
        s += std::to_string(l);
      }
    return "select layers [" + s + "]";
  }

#if SIEVE_WITH_CUDA
  static const int32_t* device_int32(const DLTensor* t, DLDevice dev, const char* what, int64_t n) {
    if (!t || !t->data || !sieve::same_dtype(t->dtype, sieve::kI32) || t->ndim != 1 ||
        t->shape[0] < n || !sieve::is_contiguous(*t) || t->device.device_type != dev.device_type ||
        t->device.device_id != dev.device_id)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, what, " must be a contiguous int32 [", n, "] tensor on ",
               sieve::device_name(dev));
    return sieve::data_ptr<const int32_t>(*t);
  }

  void observe_cuda(const sieve_layer_call& call, const DLTensor& mass) {
    const sieve_paged_kv& view = *call.kv_view;
    const DLDevice dev = geometry().device;
    sd::ObserveLaunch a{};
    a.page_mass = sieve::data_ptr<const float>(mass);
    a.kv_indptr = device_int32(&view.indptr, dev, "the KV view's indptr", call.batch + 1);
    a.last_page_len =
        device_int32(&view.last_page_len, dev, "the KV view's last_page_len", call.batch);
    a.batch = call.batch;
    a.heads = heads_;
    a.page_size = geometry().page_size;
    a.recent = recent_;
    a.budget_pages = budget_pages_;
    a.max_pages = max_pages_;
    a.nnz_pages = call.batch > 0 ? view.indptr_host[call.batch] : 0;
    a.max_seq_pages = 0;
    for (int32_t b = 0; b < call.batch; ++b)
      a.max_seq_pages = std::max(a.max_seq_pages, view.indptr_host[b + 1] - view.indptr_host[b]);
    a.scores = scores_.get<float>();
    a.topk_scratch = topk_scratch_.get();
    a.topk_scratch_bytes = topk_scratch_.bytes();
    a.sel_indptr = sel_indptr_.get<int32_t>();
    a.sel_indices = sel_indices_.get<int32_t>();
    a.capacity = int64_t(geometry().max_batch) * heads_ * row_capacity_;
    a.stream = cuda_stream();
    if (const char* error = sd::launch_delta_observe(a))
      sp::fail(SIEVE_ERR_DEVICE, "DELTA selection kernels failed to launch: ", error);
  }

  void copy_cuda(sieve_selection& selection, int32_t n_rows) const {
    if (const char* error = sd::copy_delta_selection(
            sieve::data_ptr<int32_t>(selection.indptr), sieve::data_ptr<int32_t>(selection.indices),
            sel_indptr_.get<int32_t>(), sel_indices_.get<int32_t>(), n_rows, nnz_, cuda_stream()))
      sp::fail(SIEVE_ERR_DEVICE, "copying the DELTA selection failed: ", error);
  }
#else
  [[noreturn]] void observe_cuda(const sieve_layer_call&, const DLTensor&) {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of delta has no CUDA code");
  }
  [[noreturn]] void copy_cuda(sieve_selection&, int32_t) const {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of delta has no CUDA code");
  }
#endif

  int64_t budget_;
  int64_t recent_;
  bool per_kv_head_;
  std::vector<uint8_t> roles_;
  int32_t heads_ = 1;         // selection rows per sequence
  int32_t budget_pages_ = 0;  // K / P
  int32_t max_pages_ = 0;     // pages of a max_seq_len sequence
  int32_t row_capacity_ = 0;  // most pages one row lists
  sp::HostBuffer sel_indptr_;   // int32 [max_batch * heads + 1] on the device: the selection
  sp::HostBuffer sel_indices_;  // int32 [max_batch * heads * row_capacity]
  sp::HostBuffer topk_scratch_;
#if SIEVE_WITH_CUDA
  sp::HostBuffer scores_;  // f32 [max_batch * max_pages * heads]
#endif
  // The stored selection: made at Δ-layer from_layer_ of step step_ for these sequences.
  bool valid_ = false;
  uint64_t step_ = 0;
  int32_t from_layer_ = -1;
  int64_t nnz_ = 0;
  std::vector<int32_t> seq_ids_, kv_pages_;
};

}  // namespace

SIEVE_DEFINE_PLUGIN(DeltaPolicy);
