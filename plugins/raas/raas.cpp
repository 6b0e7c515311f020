// raas: RaaS (Hu et al., "Efficient Long-Decode Inference with Reasoning-Aware Attention
// Sparsity", page-based version, §3.3 and appendix) as a decode policy that evicts KV.
//
// Method: every resident page carries a timestamp, time = tokens of the sequence so far (prefill
// + decode, evicted ones included); a new page gets the time it was created. At each decode step
// the pages are scored with the Quest bound (core/selection: the same min/max sidecar and bound
// as the quest plugin, sidecar "raas.minmax"), the scores of each query head are normalised by a
// softmax over the sequence's pages (logits scaled by 1/sqrt(head_dim), as attention would), and
// a page whose normalised score exceeds `alpha` for any query head — i.e. for any head of any KV
// group, since eviction drops a page for every head — gets the current time. With top_ratio > 0
// the top ceil(top_ratio x pages) pages of each head are stamped instead (the paper's r).
// After every layer of a step ran (end_step), while the resident pages exceed the budget the
// page with the oldest timestamp (ties: the earliest page) is evicted — kv_api->evict, so the
// store really frees it and resident KV bytes stop growing: memory O(budget), not O(length).
// Prompt pages (written in the prefill phase) are pinned (pin_prefill) and never evicted; the
// last page never is (appends continue there).
//
// Budget: token_budget counts every resident page, pinned ones included (the paper's cache
// budget: with a long prompt most of it goes to the prompt). Attention runs densely over the
// resident pages (the selection is ALL).
//
// prefill_policy=quest — the paper's advice for long prompts, "Quest on prefill tokens, RaaS on
// decode tokens": the pinned prompt pages are then attended through a Quest selection (per query
// head, the last prompt page + the best prefill_budget/page_size - 1 others by the same bound)
// while every resident decode page is attended; token_budget then counts the decode pages only.
// The chain grammar cannot say this with two plugins (docs/methods/raas.md says why).
//
// Hooks: on_append (min/max + page bookkeeping), select (bound, softmax, stamps; the Quest part
// of the selection), end_step (eviction). CPU only: the timestamps and eviction decisions live on
// the host, and a CUDA version would need the page scores on the host every step.
#include <sieve/plugin/policy_api.hpp>
#include <sieve/selection/minmax_sidecar.hpp>
#include <sieve/selection/page_bound.hpp>
#include <sieve/selection/top_k.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

namespace {

namespace sp = sieve::plugin;
namespace sel = sieve::selection;

// Host bookkeeping of one (layer, sequence): one entry per resident page, in page-table order.
struct SeqPages {
  int64_t time = 0;              // tokens so far, evicted ones included
  int32_t resident_tokens = 0;   // what the store holds (to detect a sequence we did not follow)
  std::vector<int64_t> stamp;    // last time the page mattered (creation time at first)
  std::vector<uint8_t> pinned;   // prompt pages
  int32_t pinned_pages() const {
    return int32_t(std::find(pinned.begin(), pinned.end(), uint8_t(0)) - pinned.begin());
  }
};

class RaasPolicy final : public sp::PolicyBase {
 public:
  static constexpr sieve_param_spec kParams[] = {
      sp::int_param("token_budget", "1024", 1, INT32_MAX,
                    "resident tokens per sequence and layer (pinned prompt pages included; "
                    "decode pages only with prefill_policy=quest)"),
      sp::float_param("alpha", "0.0001", 0.0, 1.0,
                      "a page whose softmax-normalised bound exceeds this for any head is stamped"),
      sp::float_param("top_ratio", "0", 0.0, 1.0,
                      "> 0: stamp the top ratio of pages of each head instead of using alpha"),
      sp::bool_param("pin_prefill", "true", "never evict the prompt's pages"),
      sp::enum_param("prefill_policy", "all", "all|quest",
                     "attention over the pinned prompt pages: all of them, or a Quest selection"),
      sp::int_param("prefill_budget", "1024", 1, INT32_MAX,
                    "prefill_policy=quest: prompt tokens each query head attends"),
  };
  static constexpr sieve_policy_descriptor kDescriptor = {
      .hdr = SIEVE_HEADER_INIT(sieve_policy_descriptor),
      .name = "raas",
      .vendor = "sieve",
      .version_major = 1,
      .version_minor = 0,
      .version_patch = 0,
      .summary = "RaaS: page timestamps from the Quest bound, evict the oldest beyond the budget",
      .phases = SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE,
      .devices = SIEVE_DEVICE_CPU,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_Q_HEAD,
      .needs = SIEVE_NEEDS_SIDECARS,
      .evicts_kv = 1,
      .cuda_graph = SIEVE_CUDA_GRAPH_NONE,
  };

  static void validate(const sieve_geometry& g, const sp::Params& p, sp::Reasons& r) {
    if (p.integer("token_budget") < g.page_size)
      r.invalid("token_budget = ", p.integer("token_budget"), " is below one page (page_size = ",
                g.page_size, ")");
    if (p.text("prefill_policy") == "quest" && p.integer("prefill_budget") < g.page_size)
      r.invalid("prefill_budget = ", p.integer("prefill_budget"),
                " is below one page (page_size = ", g.page_size, ")");
    if (p.text("prefill_policy") == "quest" && !p.boolean("pin_prefill"))
      r.invalid("prefill_policy = quest selects among the pinned prompt pages: it needs "
                "pin_prefill = true");
  }

  explicit RaasPolicy(const sp::CreateContext& ctx)
      : PolicyBase(ctx),
        budget_pages_(int32_t(ctx.params.integer("token_budget") / geometry().page_size)),
        alpha_(ctx.params.real("alpha")),
        top_ratio_(ctx.params.real("top_ratio")),
        pin_prefill_(ctx.params.boolean("pin_prefill")),
        prefill_quest_(ctx.params.text("prefill_policy") == "quest"),
        prefill_budget_pages_(int32_t(ctx.params.integer("prefill_budget") / geometry().page_size)) {
    const sieve_geometry& g = geometry();
    sidecar_ = sel::MinMaxSidecar(ctx.kv, ctx.kv_api, g, "raas.minmax");
    const int64_t max_pages = (int64_t(g.max_seq_len) + g.page_size - 1) / g.page_size;
    scores_.assign(size_t(g.max_batch) * size_t(max_pages) * size_t(g.n_q_heads), 0.0f);
    bound_scratch_.assign(size_t(g.n_q_heads + 2) * size_t(g.head_dim), 0.0f);
    row_scratch_.assign(size_t(max_pages) + 1, 0);
    row_out_.assign(size_t(max_pages) + 1, 0);
    evict_list_.reserve(size_t(max_pages));
    seqs_.assign(size_t(std::max(g.n_layers, 1)), std::vector<SeqPages>(size_t(std::max(g.max_batch, 1))));
    log_debug("token_budget = ", budget_pages_, " pages, alpha = ", alpha_, ", top_ratio = ",
              top_ratio_, ", pin_prefill = ", pin_prefill_, ", prefill_policy = ",
              prefill_quest_ ? "quest" : "all");
  }

  void on_append(const sieve_layer_call& call, const sieve_kv_append&) override {
    sidecar_.on_append(call, nullptr);
    const sieve_paged_kv& view = *call.kv_view;  // checked by the sidecar
    const int32_t ps = view.page_size;
    for (int32_t b = 0; b < call.batch; ++b) {
      SeqPages& s = state(call.layer, call.seq_ids[b]);
      const int32_t pages = view.indptr_host[b + 1] - view.indptr_host[b];
      const int32_t len = pages == 0 ? 0 : (pages - 1) * ps + view.last_page_len_host[b];
      const int32_t n_new = call.qo_indptr_host[b + 1] - call.qo_indptr_host[b];
      const bool prompt = call.phase == SIEVE_PHASE_PREFILL;
      if (len - n_new == 0 || s.resident_tokens != len - n_new ||
          int32_t(s.stamp.size()) != (len - n_new + ps - 1) / ps) {
        // A new sequence, or tokens we never saw (not in the prefill chain): those are the prompt.
        const int32_t old_pages = (len - n_new + ps - 1) / ps;
        s.time = len - n_new;
        s.stamp.assign(size_t(old_pages), s.time);
        s.pinned.assign(size_t(old_pages), uint8_t(pin_prefill_));
      }
      s.time += n_new;
      s.resident_tokens = len;
      while (int32_t(s.stamp.size()) < pages) {
        s.stamp.push_back(s.time);
        s.pinned.push_back(uint8_t(prompt && pin_prefill_));
      }
    }
  }

  void select(const sieve_layer_call& call, sieve_selection& selection, uint32_t&) override {
    if (call.phase == SIEVE_PHASE_PREFILL) return;  // prefill: bookkeeping only
    const sieve_geometry& g = geometry();
    sel::check_decode_call(call, g);
    const sieve_paged_kv& view = *call.kv_view;
    const int32_t H = g.n_q_heads;
    const sel::ScoreLayout layout{H, 1};  // [nnz pages, H]
    sel::page_bounds_cpu(view, sidecar_.tensor(call), *call.q, call.qo_indptr_host, H, false,
                         scores_.data(), layout, bound_scratch_.data());
    const float scale = 1.0f / std::sqrt(float(g.head_dim));
    for (int32_t b = 0; b < call.batch; ++b) {
      SeqPages& s = state(call.layer, call.seq_ids[b]);
      const int32_t n = view.indptr_host[b + 1] - view.indptr_host[b];
      if (int32_t(s.stamp.size()) != n)
        sp::fail(SIEVE_ERR_INTERNAL, "raas lost track of sequence ", call.seq_ids[b], " in layer ",
                 call.layer, ": ", s.stamp.size(), " pages tracked, ", n, " resident");
      const float* seq_scores = scores_.data() + int64_t(view.indptr_host[b]) * H;
      for (int32_t h = 0; h < H; ++h) stamp_head(s, seq_scores + h, H, n, scale);
    }
    if (prefill_quest_) write_prefill_quest(call, selection, layout);
    else selection.kind = SIEVE_SEL_ALL;
  }

  void end_step(const sieve_step_end& step) override {
    if (step.phase != SIEVE_PHASE_DECODE) return;  // the prompt is pinned: nothing to evict
    if (!step.kv || !step.kv_api || !step.kv_api->evict || (step.n_layers > 0 && !step.layers) ||
        (step.batch > 0 && !step.seq_ids))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "end_step: no KV store with evict, or no layers/seq_ids");
    const int32_t ps = geometry().page_size;
    for (int32_t li = 0; li < step.n_layers; ++li) {
      const int32_t layer = step.layers[li];
      for (int32_t b = 0; b < step.batch; ++b) {
        SeqPages& s = state(layer, step.seq_ids[b]);
        const int32_t n = int32_t(s.stamp.size());
        const int32_t pinned = prefill_quest_ ? s.pinned_pages() : 0;  // not budgeted
        const int32_t over = (n - pinned) - budget_pages_;
        if (over <= 0) continue;
        evict_list_.clear();
        for (int32_t j = 0; j + 1 < n; ++j)  // never the last page
          if (!s.pinned[size_t(j)]) evict_list_.push_back(j);
        const size_t take = std::min(evict_list_.size(), size_t(over));
        if (take == 0) continue;
        std::partial_sort(evict_list_.begin(), evict_list_.begin() + ptrdiff_t(take), evict_list_.end(),
                          [&](int32_t a, int32_t c) {
                            return s.stamp[size_t(a)] != s.stamp[size_t(c)]
                                       ? s.stamp[size_t(a)] < s.stamp[size_t(c)]
                                       : a < c;
                          });
        evict_list_.resize(take);
        uint64_t freed = 0;
        const sieve_status st = step.kv_api->evict(step.kv, layer, step.seq_ids[b],
                                                   evict_list_.data(), int32_t(take), &freed);
        if (st != SIEVE_OK)
          sp::fail(st, "evict of ", take, " pages of sequence ", step.seq_ids[b], ", layer ", layer,
                   ": ", step.kv_api->last_error ? step.kv_api->last_error(step.kv) : "");
        std::sort(evict_list_.begin(), evict_list_.end(), std::greater<>());
        for (int32_t j : evict_list_) {  // erase from the back so indices stay valid
          s.stamp.erase(s.stamp.begin() + j);
          s.pinned.erase(s.pinned.begin() + j);
        }
        s.resident_tokens -= int32_t(take) * ps;  // evicted pages are full (never the last)
        sidecar_.evicted(layer, step.seq_ids[b], int32_t(take) * ps);
        if (services().metric)
          services().metric(services().host_ctx, "evicted_pages", layer, -1, double(take));
      }
    }
  }

 private:
  SeqPages& state(int32_t layer, int32_t seq) {
    if (layer < 0 || size_t(layer) >= seqs_.size() || seq < 0)
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "layer ", layer, " / sequence ", seq, " out of range");
    auto& per_layer = seqs_[size_t(layer)];
    if (size_t(seq) >= per_layer.size()) per_layer.resize(size_t(seq) + 1);  // rare: ids >= max_batch
    return per_layer[size_t(seq)];
  }

  // Stamp the pages of one query head: softmax over the n pages of the scaled bounds, then alpha
  // (or the top ratio).
  void stamp_head(SeqPages& s, const float* scores, int64_t stride, int32_t n, float scale) {
    if (n == 0) return;
    if (top_ratio_ > 0.0) {
      const int32_t k = int32_t(std::ceil(top_ratio_ * n));
      const int32_t m = sel::top_k_row({n, 0, 0, k}, scores, stride, row_out_.data(), row_scratch_.data());
      for (int32_t i = 0; i < m; ++i) s.stamp[size_t(row_out_[size_t(i)])] = s.time;
      return;
    }
    float top = -INFINITY;
    for (int32_t j = 0; j < n; ++j) top = std::max(top, scores[j * stride] * scale);
    double sum = 0.0;
    for (int32_t j = 0; j < n; ++j) sum += std::exp(double(scores[j * stride] * scale - top));
    for (int32_t j = 0; j < n; ++j)
      if (std::exp(double(scores[j * stride] * scale - top)) / sum > alpha_) s.stamp[size_t(j)] = s.time;
  }

  // Rows per query head: the Quest choice among the pinned prompt pages (last prompt page kept),
  // then every decode page.
  void write_prefill_quest(const sieve_layer_call& call, sieve_selection& selection,
                           sel::ScoreLayout layout) {
    const sieve_paged_kv& view = *call.kv_view;
    const int32_t H = geometry().n_q_heads;
    int64_t nnz = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const SeqPages& s = state(call.layer, call.seq_ids[b]);
      const int32_t n = int32_t(s.stamp.size()), p = s.pinned_pages();
      nnz += int64_t(H) * (std::min(p, prefill_budget_pages_) + (n - p));
    }
    const int64_t n_rows = int64_t(call.batch) * H;
    sp::check_selection_storage(selection, n_rows, nnz, geometry().device);
    auto* indptr = sieve::data_ptr<int32_t>(selection.indptr);
    auto* indices = sieve::data_ptr<int32_t>(selection.indices);
    int64_t w = 0;
    int32_t r = 0;
    indptr[0] = 0;
    for (int32_t b = 0; b < call.batch; ++b) {
      const SeqPages& s = state(call.layer, call.seq_ids[b]);
      const int32_t n = int32_t(s.stamp.size()), p = s.pinned_pages();
      const float* seq_scores = scores_.data() + int64_t(view.indptr_host[b]) * layout.item_stride;
      for (int32_t h = 0; h < H; ++h) {
        w += sel::top_k_row({p, 0, 1, prefill_budget_pages_ - 1}, seq_scores + h, layout.item_stride,
                            indices + w, row_scratch_.data());
        for (int32_t j = p; j < n; ++j) indices[w++] = j;
        indptr[++r] = int32_t(w);
      }
    }
    selection.kind = SIEVE_SEL_BLOCKS;
    selection.heads = SIEVE_SEL_PER_Q_HEAD;
    selection.q_block = 1;
    selection.k_block_pages = 1;
    selection.n_rows = int32_t(n_rows);
  }

  int32_t budget_pages_;
  double alpha_;
  double top_ratio_;
  bool pin_prefill_;
  bool prefill_quest_;
  int32_t prefill_budget_pages_;
  sel::MinMaxSidecar sidecar_;
  std::vector<std::vector<SeqPages>> seqs_;  // [layer][seq_id]
  std::vector<float> scores_;                // [nnz pages, n_q_heads]
  std::vector<float> bound_scratch_;
  std::vector<int32_t> row_scratch_, row_out_, evict_list_;
};

}  // namespace

SIEVE_DEFINE_PLUGIN(RaasPolicy);
