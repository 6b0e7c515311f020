#include "sieve/workload/synthetic.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/reference/attention_ref.hpp"
#include "sieve/reference/fidelity.hpp"
#include "sieve/reference/long_context.hpp"
#include "sieve/reference/planted.hpp"
#include "sieve/reference/workload.hpp"
#include "sieve/runtime/host_copy.hpp"
#include "sieve/runtime/session.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/page_layout.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::runtime {

namespace {

// A tensor on the attention device, allocated through the services table (freed by it too).
class DeviceTensor {
 public:
  DeviceTensor(HostServices& s, const HostTensor& host) : s_(s), shape_(host.shape()) {
    const size_t bytes = std::max<size_t>(host.nbytes(), 1);
    void* p = s.table()->alloc(s.table()->host_ctx, s.device(), bytes, 256);
    require(p != nullptr, SIEVE_ERR_OUT_OF_MEMORY, "cannot allocate " + std::to_string(bytes) + " bytes on " +
                                                       device_name(s.device()));
    t_ = make_view(p, s.device(), host.dl().dtype, int(shape_.size()), shape_.data());
    std::string err;
    require(s.copy(p, s.device(), host.dl().data, kCpu, host.nbytes(), &err), SIEVE_ERR_DEVICE, err);
  }
  ~DeviceTensor() { s_.table()->free(s_.table()->host_ctx, s_.device(), t_.data); }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  DLTensor* get() { return &t_; }

 private:
  HostServices& s_;
  std::vector<int64_t> shape_;
  DLTensor t_{};
};

// Rows [from, to) of sequence b of a paged workload, gathered into [to-from, Hkv, D] (same dtype).
HostTensor gather_tokens(const reference::Workload& w, const HostTensor& pages, int32_t b, int32_t from,
                         int32_t to) {
  const auto& sp = w.spec;
  HostTensor t({to - from, sp.n_kv_heads, sp.head_dim}, pages.dl().dtype);
  const int32_t* indptr = w.kv_indptr.data<int32_t>();
  const int32_t* indices = w.kv_indices.data<int32_t>();
  const size_t eb = dtype_bytes(pages.dl().dtype);
  const PageStrides at = compact_hnd_strides(sp.n_kv_heads, sp.page_size, sp.head_dim);  // a Workload's pool
  for (int32_t tok = from; tok < to; ++tok) {
    int32_t page = indices[indptr[b] + tok / sp.page_size];
    for (int32_t h = 0; h < sp.n_kv_heads; ++h) {
      int64_t src = at.row(page, h, tok % sp.page_size);
      int64_t dst = (int64_t(tok - from) * sp.n_kv_heads + h) * sp.head_dim;
      std::memcpy(t.data<char>() + dst * eb, pages.data<char>() + src * eb, size_t(sp.head_dim) * eb);
    }
  }
  return t;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Keys attended / causal keys, averaged over the (token, head) rows that have causal keys.
double attended_fraction(const sieve_attention_args& args, int32_t n_q_tokens) {
  double sum = 0;
  int64_t rows = 0;
  sieve_attention_args dense_args = args;
  dense_args.selection = nullptr;
  for (int32_t t = 0; t < n_q_tokens; ++t)
    for (int32_t h = 0; h < args.n_q_heads; ++h) {
      auto got = reference::attended_keys(args, t, h);
      auto all = reference::attended_keys(dense_args, t, h);
      int64_t a = 0, c = 0;
      for (size_t i = 0; i < got.size(); ++i) a += got[i], c += all[i];
      if (c) sum += double(a) / double(c), ++rows;
    }
  return rows ? sum / double(rows) : 1.0;
}

// Per sequence, which logical pages of `before` (the view the layer's attention used) the store
// still holds now (after end_step's evictions): physical page ids are stable while resident.
std::vector<std::vector<uint8_t>> kept_pages(HostServices& services, Session& session, int32_t layer,
                                             const std::vector<int32_t>& seq_ids, const HostPagedView& before) {
  HostPagedView after;
  copy_view_to_host(services, session.view(layer, seq_ids.data(), int32_t(seq_ids.size())), &after);
  std::vector<std::vector<uint8_t>> kept(seq_ids.size());
  const int32_t* bi = before.view.indptr_host;
  const int32_t* ai = after.view.indptr_host;
  const int32_t* bp = before.indices.data<int32_t>();
  const int32_t* ap = after.indices.data<int32_t>();
  for (size_t b = 0; b < seq_ids.size(); ++b)
    for (int32_t j = bi[b]; j < bi[b + 1]; ++j)
      kept[b].push_back(uint8_t(std::find(ap + ai[b], ap + ai[b + 1], bp[j]) != ap + ai[b + 1]));
  return kept;
}

}  // namespace

bool run_synthetic(const SyntheticSpec& spec, const ChainSpec& chain_spec, const Registry& registry,
                   SyntheticReport* report, std::string* error) {
  auto failed = [&](const std::string& m) {
    if (error) *error = m;
    return false;
  };
  try {
    require(!spec.context.empty(), SIEVE_ERR_INVALID_ARGUMENT, "the workload has no sequence");
    const int32_t batch = int32_t(spec.context.size());
    const bool prefill = spec.phase == SIEVE_PHASE_PREFILL;
    // Sizes divide below (rows per sequence, tokens per page, heads per group): refuse a zero.
    require(!prefill || spec.new_tokens >= 1, SIEVE_ERR_INVALID_ARGUMENT,
            "prefill needs new_tokens >= 1, got " + std::to_string(spec.new_tokens));
    require(spec.n_q_heads >= 1 && spec.n_kv_heads >= 1 && spec.head_dim >= 1 && spec.page_size >= 1,
            SIEVE_ERR_INVALID_ARGUMENT, "heads, head_dim and page_size must be >= 1");
    require(spec.n_q_heads % spec.n_kv_heads == 0, SIEVE_ERR_INVALID_ARGUMENT,
            "n_q_heads must be a multiple of n_kv_heads");
    std::vector<int32_t> n_new(static_cast<size_t>(batch));
    int32_t max_context = 0;
    for (int32_t b = 0; b < batch; ++b) {
      require(spec.context[size_t(b)] >= 1, SIEVE_ERR_INVALID_ARGUMENT,
              "context of sequence " + std::to_string(b) + " must be >= 1 token");
      n_new[size_t(b)] = prefill ? std::min(spec.new_tokens, spec.context[size_t(b)]) : 1;
      max_context = std::max(max_context, spec.context[size_t(b)]);
    }

    // The workload: keys, values and queries (pages shuffled, ragged last pages).
    reference::WorkloadSpec ws;
    ws.n_q_heads = spec.n_q_heads;
    ws.n_kv_heads = spec.n_kv_heads;
    ws.head_dim = spec.head_dim;
    ws.page_size = spec.page_size;
    ws.kv_dtype = spec.kv_dtype;
    ws.q_dtype = kF32;
    ws.out_dtype = kF32;
    ws.phase = prefill ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
    ws.kv_lens = spec.context;
    ws.n_new = n_new;
    ws.seed = spec.seed;
    ws.spare_pages = 0;
    reference::Workload w(ws);
    if (spec.similar_keys) {
      reference::LongContextSpec lc;
      lc.seed = spec.seed;
      reference::fill_workload(w, lc);
    }
    const reference::PlantedKeys planted =
        spec.planted_keys > 0 ? reference::plant_keys(w, spec.planted_keys, spec.planted_logit, spec.seed)
                              : reference::PlantedKeys{};
    const int32_t run_layers = std::clamp(spec.run_layers, 1, std::max(1, spec.n_layers));

    HostServices services(spec.device);
    sieve_geometry g{};
    g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
    g.n_layers = std::max(1, spec.n_layers);
    g.n_q_heads = spec.n_q_heads;
    g.n_kv_heads = spec.n_kv_heads;
    g.head_dim = spec.head_dim;
    g.page_size = spec.page_size;
    g.max_batch = batch;
    g.max_seq_len = max_context;
    g.kv_dtype = spec.kv_dtype;
    g.device = spec.device;
    g.rope_theta = 10000.f;
    g.rope_dim = spec.head_dim;

    ResolvedChains chains;
    std::vector<std::string> errors;
    if (!resolve_chains(chain_spec, registry, g, &chains, &errors)) {
      std::string all;
      for (const auto& e : errors) all += (all.empty() ? "" : "\n") + e;
      return failed(all);
    }

    int32_t pages = 0;
    for (int32_t c : spec.context) pages += kernels::ceil_div(c, spec.page_size);
    Session::Options so;
    so.pages_per_layer = pages + batch;
    so.runner.check = spec.check;
    so.runner.record_selections = true;
    Session session(services, g, std::move(chains), so);
    const sieve_kv_store_api* store_api = session.store_api();
    sieve_kv_store* store = session.store();
    const bool keep_pre_rope_k = session.store_config().keep_pre_rope_k != 0;
    const uint32_t needs = session.needs();
    std::vector<int32_t> seq_ids(static_cast<size_t>(batch));
    for (auto& id : seq_ids) id = session.add_sequence();

    // The earlier context enters the store directly (no attention is computed for it), in every
    // layer the call runs.
    for (int32_t layer = 0; layer < run_layers; ++layer)
      for (int32_t b = 0; b < batch; ++b) {
        const int32_t before = spec.context[size_t(b)] - n_new[size_t(b)];
        if (before == 0) continue;
        HostTensor k = gather_tokens(w, w.k_pages, b, 0, before), v = gather_tokens(w, w.v_pages, b, 0, before);
        DeviceTensor dk(services, k), dv(services, v);
        int32_t indptr[2] = {0, before};
        sieve_kv_append a{};
        a.hdr = SIEVE_HEADER_INIT(sieve_kv_append);
        a.layer = layer;
        a.batch = 1;
        a.seq_ids = &seq_ids[size_t(b)];
        a.token_indptr = indptr;
        a.k = dk.get();
        a.v = dv.get();
        a.k_pre_rope = keep_pre_rope_k ? dk.get() : nullptr;  // synthetic: no rotation applied
        if (store_api->append(store, &a) != SIEVE_OK)
          return failed("KV store append: " + std::string(store_api->last_error(store)));
      }

    // The call's new tokens, laid out like a model layer sends them.
    int32_t total_new = 0;
    for (int32_t b = 0; b < batch; ++b) total_new += n_new[size_t(b)];
    HostTensor k_rows({total_new, spec.n_kv_heads, spec.head_dim}, spec.kv_dtype);
    HostTensor v_rows({total_new, spec.n_kv_heads, spec.head_dim}, spec.kv_dtype);
    std::vector<int32_t> qo_indptr(size_t(batch) + 1, 0), positions;
    for (int32_t b = 0, row = 0; b < batch; ++b) {
      const int32_t from = spec.context[size_t(b)] - n_new[size_t(b)];
      HostTensor k = gather_tokens(w, w.k_pages, b, from, spec.context[size_t(b)]);
      HostTensor v = gather_tokens(w, w.v_pages, b, from, spec.context[size_t(b)]);
      std::memcpy(k_rows.data<char>() + size_t(row) * k.nbytes() / size_t(n_new[size_t(b)]), k.data<char>(), k.nbytes());
      std::memcpy(v_rows.data<char>() + size_t(row) * v.nbytes() / size_t(n_new[size_t(b)]), v.data<char>(), v.nbytes());
      row += n_new[size_t(b)];
      qo_indptr[size_t(b) + 1] = row;
      for (int32_t i = 0; i < n_new[size_t(b)]; ++i) positions.push_back(from + i);
    }
    HostTensor qo({batch + 1}, kI32);
    std::memcpy(qo.data<int32_t>(), qo_indptr.data(), qo_indptr.size() * 4);
    HostTensor out_host({total_new, spec.n_q_heads, spec.head_dim}, kF32);
    for (int64_t i = 0; i < out_host.numel(); ++i) out_host.set(i, std::numeric_limits<float>::quiet_NaN());
    DeviceTensor dq(services, w.q), dk(services, k_rows), dv(services, v_rows), dqo(services, qo),
        dout(services, out_host);

    LayerRunner& runner = session.runner();
    LayerInputs in;
    in.phase = spec.phase;
    in.batch = batch;
    in.seq_ids = seq_ids.data();
    in.qo_indptr_host = qo_indptr.data();
    in.qo_indptr = dqo.get();
    in.positions_host = positions.data();
    in.q = dq.get();
    in.q_pre_rope = (needs & SIEVE_NEEDS_PRE_ROPE_Q) ? dq.get() : nullptr;
    in.k = dk.get();
    in.v = dv.get();
    in.k_pre_rope = keep_pre_rope_k ? dk.get() : nullptr;

    // Each layer's output and paged view as its attention saw them (before end_step may evict).
    std::vector<HostTensor> outs;
    std::vector<HostPagedView> views(static_cast<size_t>(run_layers));
    std::string err;
    const uint64_t allocs_before = services.allocation_count();
    report->chain_seconds = 0;
    outs.reserve(size_t(run_layers));
    for (int32_t layer = 0; layer < run_layers; ++layer) {
      in.layer = layer;
      // NaN again (out_host is never written): a row the next layer leaves unwritten shows.
      if (layer > 0)
        require(services.copy(dout.get()->data, spec.device, out_host.dl().data, kCpu, out_host.nbytes(), &err),
                SIEVE_ERR_DEVICE, err);
      const auto t0 = std::chrono::steady_clock::now();
      sieve_status st = runner.run_layer(in, dout.get(), &err);
      if (st == SIEVE_OK && !services.synchronize(&err)) st = SIEVE_ERR_DEVICE;
      report->chain_seconds += seconds_since(t0);
      if (st != SIEVE_OK) return failed(err);
      outs.emplace_back(HostTensor({total_new, spec.n_q_heads, spec.head_dim}, kF32));
      require(services.copy(outs.back().dl().data, kCpu, dout.get()->data, spec.device, out_host.nbytes(), &err),
              SIEVE_ERR_DEVICE, err);
      copy_view_to_host(services, session.view(layer, seq_ids.data(), batch), &views[size_t(layer)]);
    }
    const uint64_t bytes_before_end = session.bytes_in_use();
    if (runner.end_step(spec.phase, 0, seq_ids.data(), batch, &err) != SIEVE_OK) return failed(err);
    // The runner's own buffers grow on first use; what else was allocated came from hooks.
    report->hook_allocations = services.allocation_count() - allocs_before - runner.buffer_allocations();
    const uint64_t bytes = session.bytes_in_use();
    report->kv_bytes = bytes;
    report->evicted_bytes = bytes_before_end > bytes ? bytes_before_end - bytes : 0;

    bool output_rewritten = false;
    for (size_t i = 0; i < session.chains().instances.size(); ++i)
      output_rewritten |= (session.runner().hooks(i) & (SIEVE_HOOK_ATTEND | SIEVE_HOOK_CORRECT)) != 0;
    report->rel_err = 0;
    report->kernel_rel_err = output_rewritten ? -1 : 0;
    report->recall = 1;
    report->attended_fraction = 1;
    report->non_finite = 0;
    for (int32_t layer = 0; layer < run_layers; ++layer) {
      // Host copies of the layer's view and of the selection used, for the f64 reference.
      const HostPagedView& hv = views[size_t(layer)];
      HostTensor& out = outs[size_t(layer)];
      HostSelection hsel;
      selection_to_host(runner.selection_used(layer), &hsel);
      sieve_attention_args args =
          kernels::make_attention_args(spec.phase, spec.n_q_heads, spec.n_kv_heads, spec.head_dim, &w.q.dl(),
                                       &out.dl(), &qo.dl(), qo_indptr.data(), &hv.view);
      args.selection = hsel.get();

      reference::RefOptions dense_opt;
      dense_opt.ignore_selection = true;
      reference::RefAttention dense = reference::attend_reference(args, dense_opt);
      reference::OutputError e = reference::compare_output(dense, out.dl());
      report->rel_err = std::max(report->rel_err, e.rel_l2);
      report->non_finite += e.non_finite;
      if (!output_rewritten) {
        reference::RefAttention ref = reference::attend_reference(args);
        report->kernel_rel_err = std::max(report->kernel_rel_err, reference::compare_output(ref, out.dl()).rel_l2);
      }
      report->recall = std::min(report->recall, reference::attention_recall(args));
      report->attended_fraction = std::min(report->attended_fraction, attended_fraction(args, total_new));
      if (spec.planted_keys > 0) {
        const std::vector<std::vector<uint8_t>> kept = kept_pages(services, session, layer, seq_ids, hv);
        const double r = reference::planted_recall(args, planted, &kept);
        if (r >= 0) report->planted_recall = report->planted_recall < 0 ? r : std::min(report->planted_recall, r);
      }
    }
    const sieve_paged_kv view = session.view(0, seq_ids.data(), batch);

    // The dense core kernel alone on the same cache, for the speed ratio.
    {
      const sieve_attention_args dargs =
          kernels::make_attention_args(spec.phase, spec.n_q_heads, spec.n_kv_heads, spec.head_dim, dq.get(),
                                       dout.get(), dqo.get(), qo_indptr.data(), &view);
      std::vector<double> times;
      const sieve_host_services* s = services.table();
      for (int32_t r = 0; r < std::max(1, spec.timing_reps); ++r) {
        auto t1 = std::chrono::steady_clock::now();
        if (s->kernels->attend(s->host_ctx, &dargs) != SIEVE_OK)
          return failed(std::string("dense core kernel: ") + s->kernels->last_error(s->host_ctx));
        if (!services.synchronize(&err)) return failed(err);
        times.push_back(seconds_since(t1));
      }
      std::sort(times.begin(), times.end());
      report->dense_seconds = times[times.size() / 2];
    }
    report->device = device_name(spec.device);
    report->metrics = services.metrics();
    return true;
  } catch (const Error& e) {
    return failed(e.what());
  } catch (const std::exception& e) {
    return failed(e.what());
  }
}

}  // namespace sieve::runtime
