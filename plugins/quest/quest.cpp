// quest: Quest (Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM
// Inference", ICML 2024) as a decode selection policy.
//
// Method: every page keeps, per KV head, the channel-wise min and max of its post-RoPE keys
// (sidecar "quest.minmax", maintained incrementally in on_append). At a decode step each page is
// scored for each query head by the upper bound Σ_d max(q_d·min_d, q_d·max_d) of its largest
// logit; each row keeps the last (partial) page plus the (budget_pages − 1) best other pages,
// budget_pages = token_budget / page_size; a sequence with no more pages than that attends
// densely. Rows are per query head (SIEVE_SEL_PER_Q_HEAD, as the paper); with gqa_share one row
// per KV head scored by the max over the group's query heads (SIEVE_SEL_PER_KV_HEAD), so the
// group shares its K/V loads. The selection replaces whatever the chain selected before.
//
// Phases: decode selects; in prefill the policy only maintains the page metadata (its select
// leaves the selection alone), so a chain `2-=quest(...)` (both phases) sees every token as it
// arrives. In a decode-only chain the prompt's pages are caught up from the pages at the first
// decode step (minmax_sidecar.hpp), with a warning.
//
// Hooks: on_append (min/max), select (bound + top-k). Shared code: core/selection (page_bound,
// top_k; the same code serves raas). CPU: loops; CUDA: the fused append kernel, the bound kernel
// and the batched top-k, all on the host's stream with scratch allocated here in create.
// CUDA graphs: STATIC_SHAPES (grid sizes follow the batch and the lengths of the captured call).
#include <sieve/plugin/policy_api.hpp>
#include <sieve/selection/minmax_sidecar.hpp>
#include <sieve/selection/page_bound.hpp>
#include <sieve/selection/top_k.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <vector>

#if SIEVE_WITH_CUDA
#include <sieve/selection/page_bounds_call.hpp>
#include <sieve/selection/top_k_cuda.hpp>
#endif

namespace {

namespace sp = sieve::plugin;
namespace sel = sieve::selection;

#if SIEVE_WITH_CUDA
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU;
#endif

class QuestPolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_param_spec kParams[] = {
      sp::int_param("token_budget", "1024", 1, INT32_MAX,
                    "tokens each row attends (token_budget / page_size pages, the last included)"),
      sp::bool_param("gqa_share", "false",
                     "one selection per KV head (score = max over its query heads) instead of "
                     "one per query head"),
  };
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "quest",
      .vendor = "sieve",
      .version_major = 1,
      .version_minor = 0,
      .version_patch = 0,
      .summary = "Quest: pages ranked by the min/max bound of q.k, last page + top pages per head",
      .phases = SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE,
      .devices = kDevices,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_Q_HEAD,
      .needs = SIEVE_NEEDS_SIDECARS,
      .evicts_kv = 0,
      .cuda_graph = SIEVE_CUDA_GRAPH_STATIC_SHAPES,
      .conform_params = "token_budget=64",
      .selection_basis = SIEVE_SELECTION_BASIS_CONTENT,
      // Pages are read by core/selection's min/max (CPU and CUDA honour strides): any layout.
      .kv_layouts = SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
  };

  static void validate(const sieve_geometry& g, const sp::Params& p, sp::Reasons& r) {
    if (p.integer("token_budget") < g.page_size)
      r.invalid("token_budget = ", p.integer("token_budget"), " is below one page (page_size = ",
                g.page_size, "): the last page alone needs page_size tokens");
    const int64_t rows = int64_t(g.max_batch) * g.n_q_heads;
    const int64_t pages = (int64_t(g.max_seq_len) + g.page_size - 1) / g.page_size;
    if (rows * pages > INT32_MAX)
      r.unsupported("max_batch x n_q_heads x pages = ", rows * pages,
                    " selection entries exceed the int32 offsets");
  }

  explicit QuestPolicy(const sp::CreateContext& ctx)
      : PolicyBase(ctx),
        budget_pages_(int32_t(ctx.params.integer("token_budget") / geometry().page_size)),
        gqa_share_(ctx.params.boolean("gqa_share")),
        heads_(gqa_share_ ? geometry().n_kv_heads : geometry().n_q_heads),
        max_pages_(int32_t((int64_t(geometry().max_seq_len) + geometry().page_size - 1) /
                           geometry().page_size)) {
    const sieve_geometry& g = geometry();
    sidecar_ = sel::MinMaxSidecar(ctx.kv, ctx.kv_api, g, "quest.minmax");
    const size_t score_count = size_t(g.max_batch) * size_t(max_pages_) * size_t(heads_);
    if (g.device.device_type == kDLCPU) {
      scores_.assign(score_count, 0.0f);
      topk_scratch_.assign(size_t(max_pages_) + 1, 0);
      bound_scratch_.assign(size_t(sel::page_bounds_scratch_floats(g.n_q_heads, g.head_dim)), 0.0f);
    } else {
#if SIEVE_WITH_CUDA
      scores_dev_ = allocate(g.device, sizeof(float) * std::max<size_t>(score_count, 1));
      topk_dev_ = allocate(g.device, sel::top_k_cuda_scratch_bytes(int64_t(g.max_batch) * heads_));
#endif
    }
    log_debug("token_budget = ", budget_pages_ * g.page_size, " (", budget_pages_,
              " pages), gqa_share = ", gqa_share_, ", sidecar '", sidecar_.name(), "'");
  }

  void on_append(const sieve_layer_call& call, const sieve_kv_append&) override {
    const bool caught_up = sidecar_.on_append(call, cuda_stream());
    if (caught_up && !warned_catch_up_) {
      warned_catch_up_ = true;
      log_warn("layer ", call.layer, ": a sequence held tokens this instance never saw (quest is "
               "not in the prefill chain?); its page min/max were recomputed from the pages. "
               "Write the rule for both phases, e.g. '2-=quest(...)'.");
    }
  }

  void select(const sieve_layer_call& call, sieve_selection& selection, uint32_t&) override {
    if (call.phase == SIEVE_PHASE_PREFILL) return;  // prefill: metadata only, attention unchanged
    const sieve_geometry& g = geometry();
    const int32_t max_pages = sel::check_decode_call(call, g);
    const sieve_paged_kv& view = *call.kv_view;
    if (max_pages <= budget_pages_) {  // every sequence fits the budget: dense
      selection.kind = SIEVE_SEL_ALL;
      return;
    }
    const int64_t n_rows = int64_t(call.batch) * heads_;
    int64_t nnz = 0, total = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const int32_t pages = view.indptr_host[b + 1] - view.indptr_host[b];
      nnz += int64_t(heads_) * std::min(pages, budget_pages_);
      total += int64_t(heads_) * pages;
    }
    sp::check_selection_storage(selection, n_rows, nnz, g.device);
    if (g.device.device_type == kDLCPU) select_cpu(call, selection);
    else select_cuda(call, selection, max_pages);
    selection.kind = SIEVE_SEL_BLOCKS;
    selection.heads = gqa_share_ ? SIEVE_SEL_PER_KV_HEAD : SIEVE_SEL_PER_Q_HEAD;
    selection.q_block = 1;
    selection.k_block_pages = 1;
    selection.n_rows = int32_t(n_rows);
    if (services().metric && total > 0)
      services().metric(services().host_ctx, "density", call.layer, -1, double(nnz) / double(total));
  }

 private:
  sel::TopKBatch batch_of(const sieve_layer_call& call, const float* scores, sel::ScoreLayout layout,
                          const int32_t* seg_indptr) const {
    // Last page forced (tail = 1), the best budget_pages - 1 of the others.
    return sel::TopKBatch{scores, layout, seg_indptr, call.batch, heads_, 0, 1, budget_pages_ - 1};
  }

  void select_cpu(const sieve_layer_call& call, sieve_selection& selection) {
    const sieve_paged_kv& view = *call.kv_view;
    const sel::ScoreLayout layout{heads_, 1};  // [nnz pages, H]
    sel::page_bounds_cpu(view, sidecar_.tensor(call), *call.q, call.qo_indptr_host,
                         geometry().n_q_heads, gqa_share_, scores_.data(), layout,
                         bound_scratch_.data());
    sel::top_k_batch_cpu(batch_of(call, scores_.data(), layout, view.indptr_host),
                         sieve::data_ptr<int32_t>(selection.indptr),
                         sieve::data_ptr<int32_t>(selection.indices), topk_scratch_.data());
  }

#if SIEVE_WITH_CUDA
  void select_cuda(const sieve_layer_call& call, sieve_selection& selection, int32_t max_pages) {
    const sieve_paged_kv& view = *call.kv_view;
    const sieve_geometry& g = geometry();
    const int64_t nnz_pages = view.indptr_host[call.batch];
    const sel::ScoreLayout layout{1, nnz_pages};  // [H, nnz pages]: top-k rows read contiguously
    float* scores = scores_dev_.get<float>();
    sel::launch_page_bounds_for_call(call, sidecar_.tensor(call), g, max_pages, gqa_share_, scores,
                                     layout, cuda_stream());
    sel::TopKCudaLaunch t{};
    const sel::TopKBatch batch = batch_of(call, scores, layout, nullptr);
    t.scores = batch.scores;
    t.layout = layout;
    t.seg_indptr = sieve::data_ptr<const int32_t>(view.indptr);
    t.n_segments = call.batch;
    t.rows_per_segment = heads_;
    t.head = batch.head;
    t.tail = batch.tail;
    t.k = batch.k;
    t.scratch = topk_dev_.get();
    t.sel_indptr = sieve::data_ptr<int32_t>(selection.indptr);
    t.sel_indices = sieve::data_ptr<int32_t>(selection.indices);
    t.capacity = selection.capacity;
    t.stream = cuda_stream();
    t.max_row_items = max_pages;  // sizes the top-k's shared key buffer to the longest row
    if (const char* e = sel::launch_top_k_cuda(t))
      sp::fail(SIEVE_ERR_DEVICE, "quest top-k kernel launch failed: ", e);
  }
#else
  [[noreturn]] void select_cuda(const sieve_layer_call&, sieve_selection&, int32_t) {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of quest has no CUDA code");
  }
#endif

  int32_t budget_pages_;
  bool gqa_share_;
  int32_t heads_;      // rows per sequence: n_q_heads, or n_kv_heads with gqa_share
  int32_t max_pages_;  // pages of a max_seq_len sequence
  sel::MinMaxSidecar sidecar_;
  bool warned_catch_up_ = false;
  std::vector<float> scores_;         // CPU [max_batch * max_pages, H]
  std::vector<int32_t> topk_scratch_;
  std::vector<float> bound_scratch_;
#if SIEVE_WITH_CUDA
  sp::HostBuffer scores_dev_;  // device f32 [H, max_batch * max_pages]
  sp::HostBuffer topk_dev_;    // device kept counts per row
#endif
};

}  // namespace

SIEVE_DEFINE_PLUGIN(QuestPolicy);
