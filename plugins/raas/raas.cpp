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
// of the selection), end_step (eviction). The timestamps and the eviction decisions live on the
// host (the store's evict is a host call on its page table).
//
// CUDA (every mode): on_append runs core/selection's fused min/max append kernel, select the
// shared bound kernel and raas_cuda.cu's kernels, which turn the bounds into one "stamped this
// step" byte per resident page (prefill_policy=quest: the rows come from core/selection's batched
// top-k, the same TopKBatch as the CPU's, each sequence's forced tail uploaded from a pinned
// per-layer region; see prompt_batch). Those bytes are copied
// asynchronously into a pinned host mirror (one region per layer) and an event is recorded — no
// hook waits. end_step, the one point where the host needs them, waits on that event (the runtime
// does not synchronise the stream before end_step: LayerRunner::end_step is called right after
// the last layer's hooks were enqueued), applies the stamps and evicts exactly as the CPU path.
// The wait covers the last layer's estimate only, not its attention, and every decode loop reads
// the step's logits back right after end_step anyway. Same scores as the CPU (canonical bound
// order, rounded float ops, double softmax): the same stamps, so the same evictions.
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

#if SIEVE_WITH_CUDA
#include <sieve/selection/page_bounds_call.hpp>
#include <sieve/selection/top_k_cuda.hpp>

#include "cuda/raas_cuda.hpp"
#endif

namespace {

namespace sp = sieve::plugin;
namespace sel = sieve::selection;

#if SIEVE_WITH_CUDA
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA;
#else
constexpr uint32_t kDevices = SIEVE_DEVICE_CPU;
#endif

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
      .devices = kDevices,
      .dtypes = SIEVE_DTYPE_F32 | SIEVE_DTYPE_F16 | SIEVE_DTYPE_BF16,
      .head_dims = nullptr,
      .n_head_dims = 0,
      .page_sizes = nullptr,
      .n_page_sizes = 0,
      .selection_heads = SIEVE_SEL_PER_Q_HEAD,
      .needs = SIEVE_NEEDS_SIDECARS,
      .evicts_kv = 1,
      .cuda_graph = SIEVE_CUDA_GRAPH_NONE,
      .conform_params = "token_budget=256,pin_prefill=false",
      .selection_basis = SIEVE_SELECTION_BASIS_CONTENT,
      // Reads no K/V page itself (the core kernels do, honouring strides): any layout.
      .kv_layouts = SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED,
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
    const int64_t rows = int64_t(g.max_batch) * g.n_q_heads;
    const int64_t pages = (int64_t(g.max_seq_len) + g.page_size - 1) / g.page_size;
    if (p.text("prefill_policy") == "quest" && rows * pages > INT32_MAX)
      r.unsupported("prefill_policy = quest: max_batch x n_q_heads x pages = ", rows * pages,
                    " selection entries exceed the int32 offsets");
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
    const size_t score_count = size_t(g.max_batch) * size_t(max_pages) * size_t(g.n_q_heads);
    tails_.assign(size_t(std::max(g.max_batch, 1)), 0);
    if (g.device.device_type == kDLCPU) {
      scores_.assign(score_count, 0.0f);
      bound_scratch_.assign(size_t(sel::page_bounds_scratch_floats(g.n_q_heads, g.head_dim)), 0.0f);
      row_scratch_.assign(size_t(max_pages) + 1, 0);
      row_out_.assign(size_t(max_pages) + 1, 0);
    } else {
      create_cuda(max_pages, score_count);
    }
    evict_list_.reserve(size_t(max_pages));
    seqs_.assign(size_t(std::max(g.n_layers, 1)), std::vector<SeqPages>(size_t(std::max(g.max_batch, 1))));
    log_debug("token_budget = ", budget_pages_, " pages, alpha = ", alpha_, ", top_ratio = ",
              top_ratio_, ", pin_prefill = ", pin_prefill_, ", prefill_policy = ",
              prefill_quest_ ? "quest" : "all");
  }

  void on_append(const sieve_layer_call& call, const sieve_kv_append&) override {
    settle(call.layer);
    sidecar_.on_append(call, cuda_stream());
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
    settle(call.layer);
    const sieve_geometry& g = geometry();
    const int32_t max_pages = sel::check_decode_call(call, g);
    const sieve_paged_kv& view = *call.kv_view;
    const int32_t H = g.n_q_heads;
    if (prefill_quest_) prepare_prompt_rows(call, selection);  // checks the storage before any write
    if (g.device.device_type != kDLCPU) {
      select_cuda(call, max_pages, selection);
      if (prefill_quest_) mark_prompt_rows(call, selection);
      else selection.kind = SIEVE_SEL_ALL;
      return;
    }
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
    if (prefill_quest_) {
      sel::top_k_batch_cpu(prompt_batch(call, scores_.data(), layout, view.indptr_host, tails_.data()),
                           sieve::data_ptr<int32_t>(selection.indptr),
                           sieve::data_ptr<int32_t>(selection.indices), row_scratch_.data());
      mark_prompt_rows(call, selection);
    } else {
      selection.kind = SIEVE_SEL_ALL;
    }
  }

  void end_step(const sieve_step_end& step) override {
    if (step.phase != SIEVE_PHASE_DECODE) return;  // the prompt is pinned: nothing to evict
    settle_all();  // this step's stamps (CUDA: the one wait on the device, see the top)
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
  // ---- CUDA: stamps computed on the device, applied on the host at end_step ----------------
  // What a layer's select left in flight: the call's sequences, where their pages start in the
  // layer's mirror region, how many there are, and the time their stamps carry.
  struct Pending {
    bool on = false;
    int32_t batch = 0;
    std::vector<int32_t> seq, begin, n;
    std::vector<int64_t> time;
  };

#if SIEVE_WITH_CUDA
  void create_cuda(int64_t max_pages, size_t score_count) {
    const sieve_geometry& g = geometry();
    const size_t flag_count = std::max<size_t>(size_t(g.max_batch) * size_t(max_pages), 1);
    const size_t heads = std::max<size_t>(size_t(g.max_batch) * size_t(g.n_q_heads), 1);
    scores_dev_ = allocate(g.device, sizeof(float) * std::max<size_t>(score_count, 1));
    flags_dev_ = allocate(g.device, flag_count);
    head_max_dev_ = allocate(g.device, sizeof(float) * heads);
    head_sum_dev_ = allocate(g.device, sizeof(double) * heads);
    if (top_ratio_ > 0.0 || prefill_quest_)  // top_ratio: one sequence's rows; prompt rows: all
      topk_dev_ = allocate(g.device, sel::top_k_cuda_scratch_bytes(int64_t(g.max_batch) * g.n_q_heads));
    if (prefill_quest_) tails_dev_ = allocate(g.device, sizeof(int32_t) * size_t(std::max(g.max_batch, 1)));
    if (top_ratio_ > 0.0) {  // one sequence's rows at a time (k depends on its page count)
      rows_indptr_dev_ = allocate(g.device, sizeof(int32_t) * size_t(g.n_q_heads + 1));
      rows_capacity_ = int64_t(g.n_q_heads) * std::max<int64_t>(max_pages, 1);
      rows_indices_dev_ = allocate(g.device, sizeof(int32_t) * size_t(rows_capacity_));
    }
    // One region of flags per layer: end_step applies every layer's stamps after one wait. Then,
    // with prefill_policy=quest, one region of prompt-row tails per layer (uploaded by select):
    // a layer's region is rewritten at its next select, after the wait that settled its stamps.
    // Whole pages, page-aligned: a pinned range never shares an OS page with another one.
    const size_t layers = size_t(std::max(g.n_layers, 1));
    mirror_stride_ = flag_count;
    tails_offset_ = (mirror_stride_ * layers + alignof(int32_t) - 1) / alignof(int32_t) * alignof(int32_t);
    tails_stride_ = prefill_quest_ ? sizeof(int32_t) * tails_.size() : 0;
    const size_t mirror_bytes = (tails_offset_ + tails_stride_ * layers + 4095) / 4096 * 4096;
    mirror_host_ = allocate(DLDevice{kDLCPU, 0}, mirror_bytes, 4096);
    mirror_ = sieve::raas::StampMirror(mirror_host_.get(), mirror_host_.bytes());
    if (const char* e = mirror_.error())
      sp::fail(SIEVE_ERR_DEVICE, "raas: pinning the host mirror of the page stamps (",
               mirror_host_.bytes(), " bytes) failed: ", e);
    Pending empty;
    empty.seq.assign(size_t(g.max_batch), 0);
    empty.begin = empty.n = empty.seq;
    empty.time.assign(size_t(g.max_batch), 0);
    pending_.assign(size_t(std::max(g.n_layers, 1)), empty);
  }

  void select_cuda(const sieve_layer_call& call, int32_t max_pages, sieve_selection& selection) {
    const sieve_paged_kv& view = *call.kv_view;
    const sieve_geometry& g = geometry();
    const int32_t H = g.n_q_heads;
    const int64_t nnz = view.indptr_host[call.batch];
    if (call.layer < 0 || size_t(call.layer) >= pending_.size() || nnz > int64_t(mirror_stride_))
      sp::fail(SIEVE_ERR_INVALID_ARGUMENT, "layer ", call.layer, " with ", nnz,
               " resident pages is outside the geometry (", pending_.size(), " layers, ",
               mirror_stride_, " pages of max_batch x max_seq_len)");
    const sel::ScoreLayout layout{1, nnz};  // [H, nnz pages]: a head's row is contiguous
    float* scores = scores_dev_.get<float>();
    sel::launch_page_bounds_for_call(call, sidecar_.tensor(call), g, max_pages, false, scores, layout,
                                     cuda_stream());
    auto* flags = flags_dev_.get<uint8_t>();
    if (top_ratio_ > 0.0) {
      if (const char* e = sieve::raas::zero_async(flags, size_t(nnz), cuda_stream()))
        sp::fail(SIEVE_ERR_DEVICE, "raas flags memset: ", e);
      const int32_t* seg = sieve::data_ptr<const int32_t>(view.indptr);
      for (int32_t s = 0; s < call.batch; ++s) {
        const int32_t n = view.indptr_host[s + 1] - view.indptr_host[s];
        if (n == 0) continue;
        sel::TopKCudaLaunch t{};
        t.scores = scores;
        t.layout = layout;
        t.seg_indptr = seg + s;  // item j of this sequence's rows: page indptr[s] + j
        t.n_segments = 1;
        t.rows_per_segment = H;
        t.k = int32_t(std::ceil(top_ratio_ * n));  // as stamp_head
        t.scratch = topk_dev_.get();
        t.sel_indptr = rows_indptr_dev_.get<int32_t>();
        t.sel_indices = rows_indices_dev_.get<int32_t>();
        t.capacity = rows_capacity_;
        t.stream = cuda_stream();
        if (const char* e = sel::launch_top_k_cuda(t)) sp::fail(SIEVE_ERR_DEVICE, "raas top-k kernel: ", e);
        sieve::raas::MarkRowsLaunch m{t.sel_indptr, t.sel_indices, H, seg + s, flags, cuda_stream()};
        if (const char* e = sieve::raas::launch_mark_rows(m)) sp::fail(SIEVE_ERR_DEVICE, "raas mark kernel: ", e);
      }
    } else {
      sieve::raas::AlphaFlagsLaunch a{};
      a.scores = scores;
      a.nnz = nnz;
      a.kv_indptr = sieve::data_ptr<const int32_t>(view.indptr);
      a.batch = call.batch;
      a.n_q_heads = H;
      a.max_pages = max_pages;
      a.scale = 1.0f / std::sqrt(float(g.head_dim));  // as select's CPU path
      a.alpha = alpha_;
      a.head_max = head_max_dev_.get<float>();
      a.head_sum = head_sum_dev_.get<double>();
      a.flags = flags;
      a.stream = cuda_stream();
      if (const char* e = sieve::raas::launch_alpha_flags(a)) sp::fail(SIEVE_ERR_DEVICE, "raas stamp kernels: ", e);
    }
    if (prefill_quest_) select_prompt_rows_cuda(call, max_pages, selection, scores, layout);
    // Recorded after the prompt rows' upload too: the wait before the next rewrite covers it.
    if (const char* e = mirror_.copy_async(size_t(call.layer) * mirror_stride_, flags, size_t(nnz), cuda_stream()))
      sp::fail(SIEVE_ERR_DEVICE, "raas stamp copy: ", e);
    Pending& p = pending_[size_t(call.layer)];
    p.on = true;
    p.batch = call.batch;
    for (int32_t s = 0; s < call.batch; ++s) {
      const SeqPages& st = state(call.layer, call.seq_ids[s]);
      const int32_t n = view.indptr_host[s + 1] - view.indptr_host[s];
      if (int32_t(st.stamp.size()) != n)
        sp::fail(SIEVE_ERR_INTERNAL, "raas lost track of sequence ", call.seq_ids[s], " in layer ",
                 call.layer, ": ", st.stamp.size(), " pages tracked, ", n, " resident");
      p.seq[size_t(s)] = call.seq_ids[s];
      p.begin[size_t(s)] = view.indptr_host[s];
      p.n[size_t(s)] = n;
      p.time[size_t(s)] = st.time;
    }
  }

  // prepare_prompt_rows' tails go to the device through this layer's pinned region, then
  // core/selection's batched top-k writes every row straight into the selection.
  void select_prompt_rows_cuda(const sieve_layer_call& call, int32_t max_pages, sieve_selection& selection,
                               const float* scores, sel::ScoreLayout layout) {
    const size_t at = tails_offset_ + size_t(call.layer) * tails_stride_;
    std::copy_n(tails_.data(), call.batch, reinterpret_cast<int32_t*>(static_cast<char*>(mirror_host_.get()) + at));
    if (const char* e = mirror_.upload_async(at, tails_dev_.get(), sizeof(int32_t) * size_t(call.batch), cuda_stream()))
      sp::fail(SIEVE_ERR_DEVICE, "raas prompt-row upload: ", e);
    const sel::TopKBatch b = prompt_batch(call, scores, layout, nullptr, nullptr);
    sel::TopKCudaLaunch t{};
    t.scores = scores;
    t.layout = layout;
    t.seg_indptr = sieve::data_ptr<const int32_t>(call.kv_view->indptr);
    t.n_segments = b.n_segments;
    t.rows_per_segment = b.rows_per_segment;
    t.head = b.head;
    t.tail = b.tail;
    t.k = b.k;
    t.seg_tail = tails_dev_.get<int32_t>();
    t.scratch = topk_dev_.get();
    t.sel_indptr = sieve::data_ptr<int32_t>(selection.indptr);
    t.sel_indices = sieve::data_ptr<int32_t>(selection.indices);
    t.capacity = selection.capacity;
    t.stream = cuda_stream();
    t.max_row_items = max_pages;
    if (const char* e = sel::launch_top_k_cuda(t)) sp::fail(SIEVE_ERR_DEVICE, "raas prompt top-k kernel: ", e);
  }

  void wait_for_stamps() {
    if (const char* e = mirror_.wait()) sp::fail(SIEVE_ERR_DEVICE, "raas: waiting for the page stamps: ", e);
  }
#else
  [[noreturn]] void create_cuda(int64_t, size_t) {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of raas has no CUDA code");
  }
  [[noreturn]] void select_cuda(const sieve_layer_call&, int32_t, sieve_selection&) {
    sp::fail(SIEVE_ERR_UNSUPPORTED, "this build of raas has no CUDA code");
  }
  void wait_for_stamps() {}
#endif

  // Apply a layer's stamps left in flight by its select (CUDA), after the wait.
  void apply_pending(int32_t layer) {
    Pending& p = pending_[size_t(layer)];
    p.on = false;
    const uint8_t* region = static_cast<const uint8_t*>(mirror_host_.get()) + size_t(layer) * mirror_stride_;
    for (int32_t i = 0; i < p.batch; ++i) {
      SeqPages& s = state(layer, p.seq[size_t(i)]);
      const uint8_t* f = region + p.begin[size_t(i)];
      const int32_t n = std::min<int32_t>(p.n[size_t(i)], int32_t(s.stamp.size()));
      for (int32_t j = 0; j < n; ++j)
        if (f[j]) s.stamp[size_t(j)] = p.time[size_t(i)];
    }
  }
  // A layer's stamps still in flight when its next step begins (the host skipped end_step):
  // wait and apply them before the page list changes. Never taken when end_step runs.
  void settle(int32_t layer) {
    if (layer < 0 || size_t(layer) >= pending_.size() || !pending_[size_t(layer)].on) return;
    wait_for_stamps();
    apply_pending(layer);
  }
  void settle_all() {
    bool any = false;
    for (const Pending& p : pending_) any = any || p.on;
    if (!any) return;
    wait_for_stamps();
    for (size_t l = 0; l < pending_.size(); ++l)
      if (pending_[l].on) apply_pending(int32_t(l));
  }

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

  // prefill_policy=quest, one row per (sequence, query head): the sequence's pages as top-k
  // items, the forced tail its last prompt page and every decode page (tails[b] = pages - prompt
  // pages + 1), the best prefill_budget_pages - 1 of the other prompt pages by the bound. A
  // sequence with no more prompt pages than the budget keeps every page. The same batch on the
  // CPU (top_k_batch_cpu) and on CUDA (launch_top_k_cuda): the same rows, bit for bit.
  sel::TopKBatch prompt_batch(const sieve_layer_call& call, const float* scores, sel::ScoreLayout layout,
                              const int32_t* seg_indptr, const int32_t* tails) const {
    sel::TopKBatch b{scores, layout, seg_indptr, call.batch, geometry().n_q_heads, 0, 1, prefill_budget_pages_ - 1};
    b.seg_tail = tails;
    return b;
  }
  // The tails of this call's sequences (tails_), and the selection storage checked for the
  // largest selection they give.
  void prepare_prompt_rows(const sieve_layer_call& call, sieve_selection& selection) {
    const sieve_paged_kv& view = *call.kv_view;
    for (int32_t b = 0; b < call.batch; ++b) {
      const SeqPages& s = state(call.layer, call.seq_ids[b]);
      const int32_t n = view.indptr_host[b + 1] - view.indptr_host[b];
      if (int32_t(s.stamp.size()) != n)
        sp::fail(SIEVE_ERR_INTERNAL, "raas lost track of sequence ", call.seq_ids[b], " in layer ",
                 call.layer, ": ", s.stamp.size(), " pages tracked, ", n, " resident");
      tails_[size_t(b)] = n - s.pinned_pages() + 1;
    }
    const int64_t nnz = sel::top_k_capacity_needed(prompt_batch(call, nullptr, {}, view.indptr_host, tails_.data()));
    sp::check_selection_storage(selection, int64_t(call.batch) * geometry().n_q_heads, nnz, geometry().device);
  }
  void mark_prompt_rows(const sieve_layer_call& call, sieve_selection& selection) const {
    selection.kind = SIEVE_SEL_BLOCKS;
    selection.heads = SIEVE_SEL_PER_Q_HEAD;
    selection.q_block = 1;
    selection.k_block_pages = 1;
    selection.n_rows = call.batch * geometry().n_q_heads;
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
  std::vector<int32_t> tails_;    // [max_batch] prefill_policy=quest: each sequence's forced tail
  std::vector<Pending> pending_;  // [layer], CUDA only
  size_t mirror_stride_ = 0;      // bytes of one layer's stamp region
  size_t tails_offset_ = 0, tails_stride_ = 0;  // the tails' regions (prefill_policy=quest)
  sp::HostBuffer mirror_host_;    // host: [n_layers, max_batch * max_pages] stamp bytes, then
                                  // [n_layers, max_batch] int32 tails (prefill_policy=quest)
#if SIEVE_WITH_CUDA
  sieve::raas::StampMirror mirror_;  // pins mirror_host_ (declared after it: unpinned first)
  sp::HostBuffer scores_dev_;        // device f32 [n_q_heads, max_batch * max_pages]
  sp::HostBuffer flags_dev_;         // device [max_batch * max_pages]
  sp::HostBuffer head_max_dev_, head_sum_dev_;                   // [max_batch * n_q_heads]
  sp::HostBuffer topk_dev_;  // top-k plans: max_batch x n_q_heads rows
  sp::HostBuffer rows_indptr_dev_, rows_indices_dev_;  // top_ratio: one sequence's rows
  sp::HostBuffer tails_dev_;                           // prefill_policy=quest: device tails_
  int64_t rows_capacity_ = 0;
#endif
};

}  // namespace

SIEVE_DEFINE_PLUGIN(RaasPolicy);
