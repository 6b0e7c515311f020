// The policy benchmark's cases (policy_case.hpp). Per (context, batch) and chain: a
// runtime::Session of the device (its KV store, the chain's policies, the LayerRunner), and the
// context enters the store in chunks through LayerRunner::append_only — the store's append plus
// the chain's on_append hooks (Quest min/max, RaaS stamps, ...), no attention — with the same
// deterministic contents for every chain. docs/bench/policy.md says what each number means.
// Over an ENGINE_PAGES store (engine_pool) a stand-in engine (runtime::EnginePages) owns the pages,
// in shuffled order, and grows each sequence's table before every layer call; the store writes the
// new tokens into the pages the table names. The engine builds the tables of a timed call before
// the timer starts (an engine builds them for its own kernels anyway); binding them to the store
// (its id checks) is inside, as is everything else Sieve does.
#include "policy_case.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>

#include "sieve/reference/long_context.hpp"
#include "sieve/runtime/engine_pages.hpp"
#include "sieve/runtime/layer_runner.hpp"
#include "sieve/runtime/session.hpp"

namespace sieve::bench {

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

namespace {

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

}  // namespace

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

namespace {

class PolicyCase {
 public:
  // `similar`: with --keys similar, each sequence's generated context (n_fill + n_new tokens).
  PolicyCase(const Shape& s, const runtime::ChainSpec& spec, const runtime::Registry& registry, HostServices& services,
       const std::vector<SimilarContext>* similar)
      : s_(s), services_(services), similar_(similar) {
    const sieve_geometry g = g_ = geometry_of(s);
    runtime::ResolvedChains chains;
    if (std::string e = resolve(spec, registry, g, &chains); !e.empty()) fail(SIEVE_ERR_INVALID_ARGUMENT, e);
    needs_ = chains.needs;
    runtime::Session::Options opt;
    opt.pages_per_layer = s.batch * s.pages_per_seq() + s.batch;
    opt.runner.check = s.check;  // off unless --check: its host copies would be in the timings
    opt.runner.record_selections = false;
    opt.runner.min_selection_q_block = s.prefill() ? s.min_q_block : 1;
    if (chains.store.entry.api && (chains.store.entry.descriptor.features & SIEVE_KV_FEATURE_ENGINE_PAGES)) {
      engine_ = std::make_unique<runtime::EnginePages>(
          services, runtime::EnginePages::Shape::for_store(g, opt.pages_per_layer, chains.store.entry, chains.store.values));
      opt.release = engine_->sink();
      opt.binds_pages = true;
    }
    session_ = std::make_unique<runtime::Session>(services, g, std::move(chains), opt);
    runner_ = &session_->runner();
    seq_ids_.resize(size_t(s.batch));
    for (auto& id : seq_ids_) id = session_->add_sequence();
    logical_.assign(size_t(s.batch), 0);
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
        if (engine_) session_->bind_pages(engine_->step(L, seq_ids_, std::vector<int32_t>(size_t(s_.batch), c)));
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

  // Over an engine's pages: the engine's tables of the next call, every layer's sequences grown by
  // n_new tokens (untimed: the engine's own work); run_layer binds them. No-op over other stores.
  void prepare_step() {
    if (!engine_) return;
    tables_.assign(size_t(s_.layers), nullptr);
    for (int32_t L = 0; L < s_.layers; ++L)
      tables_[size_t(L)] = &engine_->step(L, seq_ids_, std::vector<int32_t>(size_t(s_.batch), s_.n_new));
  }

  // One step over all layers (the timed call; prepare_step first), then end_step.
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
    if (engine_) {
      require(size_t(L) < tables_.size() && tables_[size_t(L)], SIEVE_ERR_INTERNAL, "no engine table prepared");
      session_->bind_pages(*tables_[size_t(L)]);
      tables_[size_t(L)] = nullptr;  // one call per table: the next call's grows the sequences again
    }
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
    prepare_step();
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
      views[size_t(L)] = session_->view(L, seq_ids_.data(), s_.batch);
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
    r->kv_bytes = session_->bytes_in_use();
  }

  const Shape& shape() const { return s_; }
  runtime::LayerRunner& runner() { return *runner_; }

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
  std::unique_ptr<runtime::EnginePages> engine_;  // ENGINE_PAGES stores: the pages' owner (outlives the session)
  std::vector<const sieve_kv_pages*> tables_;      // its tables of the next call, per layer
  std::unique_ptr<runtime::Session> session_;
  runtime::LayerRunner* runner_ = nullptr;  // the session's
  std::vector<int32_t> seq_ids_, logical_, qo_host_, positions_;
  std::unique_ptr<Tensor> q_, out_, k_, v_, qo_;
  const std::vector<SimilarContext>* similar_ = nullptr;
};

}  // namespace

Result measure(const Shape& s, const std::string& label, const runtime::ChainSpec& spec,
               const runtime::Registry& registry, HostServices& services, const PolicyOptions& o,
               const std::vector<SimilarContext>* similar) {
  Result r;
  r.chain = label;
  services.clear_metrics();
  try {
    std::vector<double> ms;
    if (!s.prefill()) {
      PolicyCase c(s, spec, registry, services, similar);
      c.fill(s.ctx);
      c.make_inputs();
      Timer timer(services);
      uint64_t step = 1;
      for (int i = 0; i < o.warmup + o.steps; ++i, ++step) {
        c.prepare_step();
        timer.start();
        c.step(step);
        const double t = timer.stop_ms();
        if (i >= o.warmup) ms.push_back(t);
      }
      if (s.graph_steps()) {  // the same steps again, each layer's call replayed from its CUDA graph
        runtime::LayerRunner& runner = c.runner();
        runner.set_cuda_graphs(true);
        std::vector<double> gms;
        for (int i = 0; i < o.warmup + o.steps; ++i, ++step) {
          c.prepare_step();
          timer.start();
          c.step(step);
          const double t = timer.stop_ms();
          if (i >= o.warmup) gms.push_back(t);
        }
        runner.set_cuda_graphs(false);
        r.step_graph_ms = median(gms);
        r.step_graph_max_ms = *std::max_element(gms.begin(), gms.end());
        r.graph_replays = runner.graph_counts().replays;
        r.graph_captures = runner.graph_counts().captures;
        r.graph_eager_reason = runner.graph_eager_reason(0);
      }
      c.recorded_step(step, o.steps, &r);
    } else {
      for (int sample = 0; sample <= o.samples; ++sample) {
        PolicyCase c(s, spec, registry, services, similar);
        c.fill(s.n_fill());
        c.make_inputs();
        if (sample == 0) {  // warm-up: also records the selections for the core-only time
          c.recorded_step(0, o.samples, &r);
          continue;
        }
        Timer timer(services);
        c.prepare_step();
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

}  // namespace sieve::bench
