#include "sieve/runtime/layer_runner.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/runtime/policy_hooks.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/status.hpp"
#include "sieve/util/tensor.hpp"
#include "layer_step.hpp"

namespace sieve::runtime {

namespace {
std::string status_text(sieve_status s) { return status_name(s); }

void sink_to_string(void* ctx, const char* m) {
  auto* s = static_cast<std::string*>(ctx);
  if (!s->empty()) *s += "; ";
  *s += m ? m : "";
}

DLTensor tensor_1d(void* data, DLDevice dev, DLDataType dt, int64_t* shape) {
  return make_view(data, dev, dt, 1, shape);
}

// The store append of the layer's new tokens (their K/V, by qo_indptr).
sieve_kv_append append_of(const LayerInputs& in) {
  sieve_kv_append app{};
  app.hdr = SIEVE_HEADER_INIT(sieve_kv_append);
  app.layer = in.layer;
  app.batch = in.batch;
  app.seq_ids = in.seq_ids;
  app.token_indptr = in.qo_indptr_host;
  app.k = in.k;
  app.v = in.v;
  app.k_pre_rope = in.k_pre_rope;
  return app;
}
}  // namespace

sieve_layer_call LayerRunner::layer_call(const LayerInputs& in, sieve_paged_kv* view) {
  kv_len_.resize(size_t(in.batch));
  for (int32_t b = 0; b < in.batch; ++b) kv_len_[size_t(b)] = kernels::kv_len(*view, b);
  sieve_layer_call call{};
  call.hdr = SIEVE_HEADER_INIT(sieve_layer_call);
  call.layer = in.layer;
  call.phase = in.phase;
  call.step = in.step;
  call.batch = in.batch;
  call.seq_ids = in.seq_ids;
  call.qo_indptr = in.qo_indptr;
  call.qo_indptr_host = in.qo_indptr_host;
  call.kv_len_host = kv_len_.data();
  call.q = in.q;
  call.q_pre_rope = in.q_pre_rope;
  call.positions_host = in.positions_host;
  call.geometry = &geometry_;
  call.kv = kv_;
  call.kv_api = kv_api_;
  call.kv_view = view;
  return call;
}

LayerRunner::LayerRunner(HostServices& services, const sieve_geometry& geometry, sieve_kv_store* kv,
                         const sieve_kv_store_api* kv_api, ResolvedChains chains, Options options)
    : services_(services),
      geometry_(geometry),
      kv_(kv),
      kv_api_(kv_api),
      chains_(std::move(chains)),
      options_(options),
      timers_(services.table()),
      graphs_(geometry.n_layers) {
  for (auto& per_layer : chains_.chains) {
    require(per_layer.empty() || int32_t(per_layer.size()) == geometry_.n_layers,
            SIEVE_ERR_INVALID_ARGUMENT,
            "chains cover " + std::to_string(per_layer.size()) + " layers, the model has " +
                std::to_string(geometry_.n_layers));
    per_layer.resize(size_t(geometry_.n_layers));
    for (const auto& chain : per_layer)
      for (size_t i : chain)
        require(i < chains_.instances.size(), SIEVE_ERR_INVALID_ARGUMENT,
                "chain refers to instance " + std::to_string(i) + " of " + std::to_string(chains_.instances.size()));
  }
  for (size_t i = 0; i < chains_.instances.size(); ++i) {
    const sieve_policy_api* api = chains_.instances[i].plugin.policy();
    require(api && api->create, SIEVE_ERR_INVALID_ARGUMENT,
            "instance " + chains_.instances[i].label + ": plugin '" + chains_.instances[i].plugin.name() + "' has no policy");
    std::string reason;
    sieve_policy* p = nullptr;
    sieve_status st = api->create(services_.table(), &geometry_, chains_.instances[i].values.data(),
                                  chains_.instances[i].values.size(), kv_, kv_api_, &p,
                                  sieve_reason_sink{&reason, sink_to_string});
    if (st != SIEVE_OK || !p)
      abandon_instances(st != SIEVE_OK ? st : SIEVE_ERR_INTERNAL,
                        "plugin '" + std::string(chains_.instances[i].plugin.name()) + "' (instance " +
                            chains_.instances[i].label + "), hook create: " + status_text(st) +
                            (reason.empty() ? "" : ": " + reason));
    handles_.push_back(p);
  }
  // 1.1: each instance's own hooks, then the chain checks resolve_chains could not make for
  // tables that answer them only after create.
  std::vector<InstanceRole> roles(handles_.size());
  for (size_t i = 0; i < handles_.size(); ++i) {
    const sieve_policy_api& api = *chains_.instances[i].plugin.policy();
    std::string why;
    hooks_.push_back(instance_hooks(api, handles_[i], &why));
    if (!why.empty())
      abandon_instances(SIEVE_ERR_INVALID_ARGUMENT, "plugin '" + std::string(chains_.instances[i].plugin.name()) +
                                                        "' (instance " + chains_.instances[i].label + "): " + why);
    roles[i] = {chains_.instances[i].label, hooks_[i],
                (api.descriptor->needs & SIEVE_NEEDS_PAGE_STATS) != 0};
  }
  if (auto lines = chain_hook_conflicts(chains_.chains, roles); !lines.empty()) {
    std::string joined;
    for (const auto& l : lines) joined += (joined.empty() ? "" : "; ") + l;
    abandon_instances(SIEVE_ERR_INVALID_ARGUMENT, joined);
  }
  served_.assign(chains_.instances.size(), {});
  snapshots_.assign(size_t(geometry_.n_layers), {});
  for (int32_t L = 0; L < geometry_.n_layers; ++L) graph_eager_.push_back(graph_blocker(L));
  graph_warm_.assign(size_t(geometry_.n_layers), 0);
  graph_since_capture_.assign(size_t(geometry_.n_layers), INT32_MAX);
  graph_quick_recaptures_.assign(size_t(geometry_.n_layers), 0);
  options_.cuda_graphs = false;
  set_cuda_graphs(options.cuda_graphs);
}

void LayerRunner::abandon_instances(sieve_status status, const std::string& message) {
  for (size_t j = 0; j < handles_.size(); ++j) chains_.instances[j].plugin.policy()->destroy(handles_[j]);
  handles_.clear();
  hooks_.clear();
  fail(status, message);
}

LayerRunner::~LayerRunner() {
  std::string ignored;
  services_.synchronize(&ignored);  // no instance goes while device work may still use it
  for (size_t i = 0; i < handles_.size(); ++i)
    if (handles_[i]) chains_.instances[i].plugin.policy()->destroy(handles_[i]);
  auto memory = services_.device_memory();
  for (util::GrowBuffer* b : {&sel_indptr_, &sel_indices_, &lse_, &page_mass_}) b->release(memory);
}

void LayerRunner::ensure(util::GrowBuffer& b, size_t bytes) {
  auto memory = services_.device_memory();
  if (b.ensure(memory, bytes)) ++buffer_allocations_;
}

std::string LayerRunner::where(int32_t instance, int32_t layer, const char* hook) const {
  return "plugin '" + std::string(chains_.instances[size_t(instance)].plugin.name()) + "' (instance " +
         chains_.instances[size_t(instance)].label + "), layer " + std::to_string(layer) + ", hook " + hook;
}

sieve_status LayerRunner::plugin_failed(int32_t instance, int32_t layer, const char* hook,
                                        sieve_status st, std::string* error) const {
  const sieve_policy_api* api = chains_.instances[size_t(instance)].plugin.policy();
  const char* msg = api->last_error ? api->last_error(handles_[size_t(instance)]) : nullptr;
  if (error)
    *error = where(instance, layer, hook) + ": " + status_text(st) + (msg && *msg ? std::string(": ") + msg : "");
  return st;
}

// Copy device arrays to the host when needed and check the selection's contents.
std::string LayerRunner::check_selection(const sieve_attention_args& args) {
  const sieve_selection* sel = args.selection;
  if (!sel || sel->kind == SIEVE_SEL_ALL) return {};
  std::string e = kernels::check_attention_args(args);
  if (!e.empty()) return e;
  const int64_t n_indptr = int64_t(sel->n_rows) + 1;
  std::vector<int32_t> indptr(static_cast<size_t>(n_indptr));
  std::string err;
  if (!services_.copy(indptr.data(), kCpu, data_ptr<void>(sel->indptr), sel->indptr.device,
                      size_t(n_indptr) * 4, &err))
    return err;
  int64_t nnz = std::clamp<int64_t>(indptr.back(), 0, sel->capacity);
  std::vector<int32_t> indices(size_t(std::max<int64_t>(nnz, 1)));
  if (nnz > 0 && !services_.copy(indices.data(), kCpu, data_ptr<void>(sel->indices),
                                 sel->indices.device, size_t(nnz) * 4, &err))
    return err;
  if (std::string e = find_hole(indptr, indices, nnz); !e.empty()) return e;
  return kernels::check_selection_contents(args, indptr.data(), indices.data());
}

// An entry the policy never wrote still holds the poison fill: its row has a hole (rows written
// at fixed row * budget offsets while indptr counts them back to back, or the reverse).
std::string LayerRunner::find_hole(const std::vector<int32_t>& indptr, const std::vector<int32_t>& indices,
                                   int64_t nnz) {
  const auto hole = std::find(indices.begin(), indices.begin() + nnz, kUnwrittenIndex);
  if (hole == indices.begin() + nnz) return {};
  const int64_t e = hole - indices.begin();
  const int64_t row = std::upper_bound(indptr.begin(), indptr.end(), int32_t(e)) - indptr.begin() - 1;
  return "selection row " + std::to_string(row) + ": selection.indices[" + std::to_string(e) +
         "] was never written (rows span indptr[" + std::to_string(row) + "] = " + std::to_string(indptr[size_t(row)]) +
         " .. indptr[" + std::to_string(row + 1) + "] = " + std::to_string(indptr[size_t(row) + 1]) +
         "): rows must be packed back to back, without holes";
}

// Check mode: every index entry past what the chain's selection holds so far gets the poison,
// so a select that leaves holes in its rows is caught by find_hole.
std::string LayerRunner::poison_indices(const sieve_selection& sel, int64_t capacity) {
  int64_t from = 0;
  std::string err;
  if (sel.kind != SIEVE_SEL_ALL) {
    int32_t end = 0;
    if (!services_.copy(&end, kCpu, data_ptr<int32_t>(sel.indptr) + sel.n_rows, geometry_.device, 4, &err))
      return err;
    from = std::clamp<int64_t>(end, 0, capacity);
  }
  if (from >= capacity) return {};
  poison_.assign(size_t(capacity - from), kUnwrittenIndex);
  if (!services_.copy(static_cast<int32_t*>(sel_indices_.get()) + from, geometry_.device, poison_.data(), kCpu,
                      poison_.size() * 4, &err))
    return err;
  return {};
}

std::string LayerRunner::check_output(const DLTensor& out, const int32_t* rows, int64_t n_rows) {
  const int64_t row_elems = int64_t(geometry_.n_q_heads) * geometry_.head_dim;
  const size_t bytes = size_t(numel(out)) * dtype_bytes(out.dtype);
  const void* host = data_ptr<void>(out);
  if (out.device.device_type != kDLCPU) {
    host_scratch_.resize(bytes);
    std::string err;
    if (!services_.copy(host_scratch_.data(), kCpu, host, out.device, bytes, &err)) return err;
    host = host_scratch_.data();
  }
  const int64_t total_rows = out.shape[0];
  for (int64_t r = 0; r < (rows ? n_rows : total_rows); ++r) {
    int64_t row = rows ? rows[r] : r;
    for (int64_t j = 0; j < row_elems; ++j) {
      float v = load_float(host, out.dtype, row * row_elems + j);
      if (!std::isfinite(v))
        return "output is " + std::string(std::isnan(v) ? "NaN" : "Inf") + " at query token " +
               std::to_string(row) + ", head " + std::to_string(j / geometry_.head_dim);
    }
  }
  return {};
}

sieve_status LayerRunner::run_layer(const LayerInputs& in, DLTensor* out, std::string* error) {
  auto failed = [&](sieve_status st, const std::string& msg) {
    if (error) *error = msg;
    return st;
  };
  try {
    if (in.layer < 0 || in.layer >= geometry_.n_layers)
      return failed(SIEVE_ERR_INVALID_ARGUMENT, "layer " + std::to_string(in.layer) +
                                                    " does not exist (the model has " +
                                                    std::to_string(geometry_.n_layers) + " layers)");
    if (!out || !in.q || !in.qo_indptr_host || !in.qo_indptr || (in.batch > 0 && !in.seq_ids))
      return failed(SIEVE_ERR_INVALID_ARGUMENT, "run_layer: missing q, out, seq_ids or qo_indptr");
    LayerStep step;
    step.L = in.layer;
    step.n_new = in.qo_indptr_host[in.batch];
    step.chain = &chains_.chain(in.layer, in.phase);
    auto mark = timers_.start();
    sieve_status st = SIEVE_OK;
    // 1. The new tokens enter the store; the chain's on_append hooks see them.
    if ((st = append_new(in, step, error)) != SIEVE_OK) return st;
    timers_.lap("host_us.append", step.L, mark);
    if ((st = view_layer(in, step, error)) != SIEVE_OK) return st;
    timers_.lap("host_us.view", step.L, mark);
    const bool graphed = options_.cuda_graphs && in.phase == SIEVE_PHASE_DECODE && !options_.check &&
                         !options_.record_selections && graph_eager_[size_t(step.L)].empty();
    if (graphed) {
      st = run_graphed(in, out, step, error);
      timers_.lap("host_us.graph", step.L, mark);
      return st;
    }
    return run_hooks(in, out, step, error);
  } catch (const Error& e) {
    return failed(e.status(), e.what());
  } catch (const std::exception& e) {
    return failed(SIEVE_ERR_INTERNAL, std::string("runtime: ") + e.what());
  }
}

sieve_status LayerRunner::run_hooks(const LayerInputs& in, DLTensor* out, LayerStep& step, std::string* error) {
  auto mark = timers_.start();
  sieve_status st = SIEVE_OK;
  if ((st = run_on_append(step, error)) != SIEVE_OK) return st;
  timers_.lap("host_us.on_append", step.L, mark);
  // 2. Selection: the chain starts dense; each select may rewrite it within its capacity.
  if ((st = run_select(in, out, step, error)) != SIEVE_OK) return st;
  timers_.lap("host_us.select", step.L, mark);
  // 3. Attention: the chain's override, or the core kernel on the selection (+ observe).
  if ((st = run_attend(in, out, step, error)) != SIEVE_OK) return st;
  timers_.lap("host_us.attend", step.L, mark);
  // 4. Corrections, in chain order; then the selection used, when recorded.
  if ((st = run_correct(out, step, error)) != SIEVE_OK) return st;
  if ((st = record_selection(step, error)) != SIEVE_OK) return st;
  timers_.lap("host_us.correct", step.L, mark);
  return SIEVE_OK;
}

sieve_status LayerRunner::append_new(const LayerInputs& in, LayerStep& step, std::string* error) {
  step.app = append_of(in);
  if (step.n_new == 0) return SIEVE_OK;
  sieve_status st = kv_api_->append(kv_, &step.app);
  if (st != SIEVE_OK && error)
    *error = "KV store '" + std::string(kv_api_->name) + "', layer " + std::to_string(step.L) + ", append: " +
             status_text(st) + ": " + kv_api_->last_error(kv_);
  return st;
}

sieve_status LayerRunner::view_layer(const LayerInputs& in, LayerStep& step, std::string* error) {
  auto failed = [&](sieve_status st, const std::string& msg) {
    if (error) *error = msg;
    return st;
  };
  const int32_t L = step.L;
  sieve_status st = kv_api_->view(kv_, L, in.seq_ids, in.batch, &step.view);
  if (st != SIEVE_OK)
    return failed(st, "KV store '" + std::string(kv_api_->name) + "', layer " + std::to_string(L) +
                          ", view: " + status_text(st) + ": " + kv_api_->last_error(kv_));
  step.call = layer_call(in, &step.view);
  return SIEVE_OK;
}

sieve_status LayerRunner::run_on_append(LayerStep& step, std::string* error) {
  for (size_t ci : *step.chain) {
    const int32_t i = int32_t(ci);
    served_[size_t(i)].push_back(step.L);
    const sieve_policy_api* api = chains_.instances[size_t(i)].plugin.policy();
    if (uses(i, SIEVE_HOOK_ON_APPEND)) {
      sieve_status st = api->on_append(handles_[size_t(i)], &step.call, &step.app);
      if (st != SIEVE_OK) return plugin_failed(i, step.L, "on_append", st, error);
    }
  }
  return SIEVE_OK;
}

void LayerRunner::prepare_selection(const LayerInputs& in, DLTensor* out, LayerStep& step) {
  const int32_t n_new = step.n_new;
  const sieve_paged_kv& view = step.view;
  int32_t max_pages = 0;
  for (int32_t b = 0; b < in.batch; ++b) max_pages = std::max(max_pages, kernels::kv_pages(view, b));
  const int64_t rows_cap = int64_t(n_new) * geometry_.n_q_heads;
  // min_selection_q_block > 1 sizes the indices for rows of query blocks that large (long prefill).
  const int64_t sel_rows =
      options_.min_selection_q_block > 1
          ? std::min<int64_t>(rows_cap, (int64_t(n_new) / options_.min_selection_q_block + in.batch) * geometry_.n_q_heads)
          : rows_cap;
  const int64_t capacity = step.capacity = std::max<int64_t>(sel_rows * max_pages, 1);
  ensure(sel_indptr_, size_t(rows_cap + 1) * 4);
  ensure(sel_indices_, size_t(capacity) * 4);
  step.indptr_shape[0] = rows_cap + 1;
  step.indices_shape[0] = capacity;
  sieve_selection& sel = step.sel;
  sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
  sel.kind = SIEVE_SEL_ALL;
  sel.heads = SIEVE_SEL_PER_SEQUENCE;
  sel.q_block = 1;
  sel.k_block_pages = 1;
  sel.indptr = tensor_1d(sel_indptr_.get(), geometry_.device, kI32, step.indptr_shape);
  sel.indices = tensor_1d(sel_indices_.get(), geometry_.device, kI32, step.indices_shape);
  sel.capacity = capacity;

  step.args = kernels::make_attention_args(in.phase, geometry_.n_q_heads, geometry_.n_kv_heads, geometry_.head_dim,
                                           in.q, out, in.qo_indptr, in.qo_indptr_host, &step.view);
  step.args.selection = &sel;
}

sieve_status LayerRunner::run_select(const LayerInputs& in, DLTensor* out, LayerStep& step, std::string* error) {
  auto failed = [&](sieve_status st, const std::string& msg) {
    if (error) *error = msg;
    return st;
  };
  const int32_t L = step.L;
  prepare_selection(in, out, step);
  sieve_selection& sel = step.sel;
  const int64_t capacity = step.capacity;
  for (size_t ci : *step.chain) {
    const int32_t i = int32_t(ci);
    const sieve_policy_api* api = chains_.instances[size_t(i)].plugin.policy();
    if (!uses(i, SIEVE_HOOK_SELECT)) continue;
    uint32_t want = SIEVE_STATS_NONE;
    if (options_.check) {
      std::string e = poison_indices(sel, capacity);
      if (!e.empty()) return failed(SIEVE_ERR_DEVICE, "runtime: filling the selection before select: " + e);
    }
    sieve_status st = api->select(handles_[size_t(i)], &step.call, &sel, &want);
    if (st != SIEVE_OK) return plugin_failed(i, L, "select", st, error);
    // The selection's tensors stay the host's: a policy writes into them, never replaces them.
    sel.indptr = tensor_1d(sel_indptr_.get(), geometry_.device, kI32, step.indptr_shape);
    sel.indices = tensor_1d(sel_indices_.get(), geometry_.device, kI32, step.indices_shape);
    sel.capacity = capacity;
    if (want != SIEVE_STATS_NONE) {
      if (want > SIEVE_STATS_PAGE_MASS_ALL_HEADS)
        return failed(SIEVE_ERR_INVALID_ARGUMENT, where(i, L, "select") + ": unknown statistics request " +
                                                      std::to_string(want));
      if (step.stats != SIEVE_STATS_NONE && step.stats != want)
        return failed(SIEVE_ERR_UNSUPPORTED, where(i, L, "select") +
                                                 ": asks for different page statistics than an earlier policy of the chain");
      step.stats = want;
      step.observers.push_back(i);
    }
    if (options_.check) {
      std::string e = check_selection(step.args);
      if (!e.empty()) return failed(SIEVE_ERR_INVALID_ARGUMENT, where(i, L, "select") + ": " + e);
    }
  }
  return SIEVE_OK;
}

sieve_status LayerRunner::run_attend(const LayerInputs& in, DLTensor* out, LayerStep& step, std::string* error) {
  auto failed = [&](sieve_status st, const std::string& msg) {
    if (error) *error = msg;
    return st;
  };
  const int32_t L = step.L, n_new = step.n_new;
  const uint32_t stats = step.stats;
  sieve_status st = SIEVE_OK;
  for (size_t ci : *step.chain)
    if (uses(int32_t(ci), SIEVE_HOOK_ATTEND)) step.override_by = int32_t(ci);
  const int32_t override_by = step.override_by;
  if (override_by >= 0) {
    if (stats != SIEVE_STATS_NONE)
      return failed(SIEVE_ERR_UNSUPPORTED, where(override_by, L, "attend") +
                                               ": overrides the core kernel, so the page statistics another policy asked for cannot be produced");
    st = chains_.instances[size_t(override_by)].plugin.policy()->attend(handles_[size_t(override_by)], &step.call,
                                                                         &step.sel, out);
    if (st != SIEVE_OK) return plugin_failed(override_by, L, "attend", st, error);
    if (options_.check) {
      std::string e = check_output(*out, nullptr, 0);
      if (!e.empty()) return failed(SIEVE_ERR_INVALID_ARGUMENT, where(override_by, L, "attend") + ": " + e);
    }
    return SIEVE_OK;
  }
  sieve_attention_args& args = step.args;
  int64_t mass_shape[2] = {0, 0}, lse_shape[2] = {n_new, geometry_.n_q_heads};
  DLTensor mass{}, lse{};
  sieve_attention_stats stat_out{};
  if (stats != SIEVE_STATS_NONE) {
    const int64_t H = stats == SIEVE_STATS_PAGE_MASS_PER_KV_HEAD ? geometry_.n_kv_heads : 1;
    mass_shape[0] = step.view.indptr_host[in.batch];
    mass_shape[1] = H;
    ensure(page_mass_, size_t(std::max<int64_t>(mass_shape[0] * H, 1)) * 4);
    ensure(lse_, size_t(std::max<int64_t>(int64_t(n_new) * geometry_.n_q_heads, 1)) * 4);
    mass = make_view(page_mass_.get(), geometry_.device, kF32, 2, mass_shape);
    lse = make_view(lse_.get(), geometry_.device, kF32, 2, lse_shape);
    args.stats = stats;
    args.page_mass = &mass;
    args.lse = &lse;
  }
  const sieve_host_services* s = services_.table();
  st = s->kernels->attend(s->host_ctx, &args);
  if (st != SIEVE_OK)
    return failed(st, "core attention kernel, layer " + std::to_string(L) + ": " + status_text(st) + ": " +
                          s->kernels->last_error(s->host_ctx));
  if (stats != SIEVE_STATS_NONE) {
    stat_out.hdr = SIEVE_HEADER_INIT(sieve_attention_stats);
    stat_out.request = stats;
    stat_out.page_mass = mass;
    stat_out.lse = lse;
    for (int32_t i : step.observers) {
      const sieve_policy_api* api = chains_.instances[size_t(i)].plugin.policy();
      if (!uses(i, SIEVE_HOOK_OBSERVE))
        return failed(SIEVE_ERR_INVALID_ARGUMENT, where(i, L, "observe") +
                                                      ": asked for statistics but does not use the observe hook");
      st = api->observe(handles_[size_t(i)], &step.call, &stat_out);
      if (st != SIEVE_OK) return plugin_failed(i, L, "observe", st, error);
    }
  }
  return SIEVE_OK;
}

sieve_status LayerRunner::run_correct(DLTensor* out, LayerStep& step, std::string* error) {
  auto failed = [&](sieve_status st, const std::string& msg) {
    if (error) *error = msg;
    return st;
  };
  const int32_t L = step.L;
  for (size_t ci : *step.chain) {
    const int32_t i = int32_t(ci);
    const sieve_policy_api* api = chains_.instances[size_t(i)].plugin.policy();
    if (!uses(i, SIEVE_HOOK_CORRECT)) continue;
    sieve_status st = api->correct(handles_[size_t(i)], &step.call, &step.sel, out);
    if (st != SIEVE_OK) return plugin_failed(i, L, "correct", st, error);
    if (options_.check) {
      std::string e = check_output(*out, nullptr, 0);
      if (!e.empty()) return failed(SIEVE_ERR_INVALID_ARGUMENT, where(i, L, "correct") + ": " + e);
    }
  }
  if (options_.check && step.override_by < 0 && step.chain->empty() == false) {
    std::string e = check_output(*out, nullptr, 0);
    if (!e.empty()) return failed(SIEVE_ERR_INVALID_ARGUMENT, "layer " + std::to_string(L) + ": " + e);
  }
  return SIEVE_OK;
}

sieve_status LayerRunner::record_selection(const LayerStep& step, std::string* error) {
  if (!options_.record_selections) return SIEVE_OK;
  const sieve_selection& sel = step.sel;
  SelectionSnapshot& snap = snapshots_[size_t(step.L)];
  snap.kind = sel.kind;
  snap.heads = sel.heads;
  snap.q_block = sel.q_block;
  snap.k_block_pages = sel.k_block_pages;
  snap.n_rows = sel.kind == SIEVE_SEL_ALL ? 0 : sel.n_rows;
  snap.indptr.clear();
  snap.indices.clear();
  if (sel.kind != SIEVE_SEL_ALL) {
    std::string err;
    snap.indptr.resize(size_t(sel.n_rows) + 1);
    bool ok = services_.copy(snap.indptr.data(), kCpu, sel_indptr_.get(), geometry_.device, snap.indptr.size() * 4, &err);
    if (ok) {
      snap.indices.resize(size_t(std::max(snap.indptr.back(), 0)));
      ok = snap.indices.empty() ||
           services_.copy(snap.indices.data(), kCpu, sel_indices_.get(), geometry_.device, snap.indices.size() * 4, &err);
    }
    if (!ok) {
      if (error) *error = err;
      return SIEVE_ERR_DEVICE;
    }
  }
  return SIEVE_OK;
}

sieve_status LayerRunner::append_only(const LayerInputs& in, std::string* error) {
  auto failed = [&](sieve_status st, const std::string& msg) {
    if (error) *error = msg;
    return st;
  };
  try {
    if (in.layer < 0 || in.layer >= geometry_.n_layers || !in.qo_indptr_host || (in.batch > 0 && !in.seq_ids))
      return failed(SIEVE_ERR_INVALID_ARGUMENT, "append_only: bad layer " + std::to_string(in.layer) +
                                                    " or missing seq_ids / qo_indptr");
    const int32_t L = in.layer;
    if (in.qo_indptr_host[in.batch] == 0) return SIEVE_OK;
    sieve_kv_append app = append_of(in);
    sieve_status st = kv_api_->append(kv_, &app);
    if (st == SIEVE_OK) {
      const auto& chain = chains_.chain(L, in.phase);
      if (chain.empty()) return SIEVE_OK;
      sieve_paged_kv view{};
      st = kv_api_->view(kv_, L, in.seq_ids, in.batch, &view);
      if (st == SIEVE_OK) {
        sieve_layer_call call = layer_call(in, &view);
        for (size_t ci : chain) {
          const sieve_policy_api* api = chains_.instances[ci].plugin.policy();
          served_[ci].push_back(L);
          if (!uses(int32_t(ci), SIEVE_HOOK_ON_APPEND)) continue;
          sieve_status hs = api->on_append(handles_[ci], &call, &app);
          if (hs != SIEVE_OK) return plugin_failed(int32_t(ci), L, "on_append", hs, error);
        }
        return SIEVE_OK;
      }
    }
    return failed(st, "KV store '" + std::string(kv_api_->name) + "', layer " + std::to_string(L) + ": " +
                          status_text(st) + ": " + kv_api_->last_error(kv_));
  } catch (const Error& e) {
    return failed(e.status(), e.what());
  } catch (const std::exception& e) {
    return failed(SIEVE_ERR_INTERNAL, std::string("runtime: ") + e.what());
  }
}

sieve_status LayerRunner::end_step(uint32_t phase, uint64_t step, const int32_t* seq_ids, int32_t batch,
                                   std::string* error) {
  auto mark = timers_.start();
  std::vector<int32_t>& lens = step_lens_;
  lens.assign(size_t(batch), 0);
  for (int32_t b = 0; b < batch; ++b) {
    // The logical length of a sequence is its resident length in layer 0 plus nothing evicted
    // there; policies that evict track their own positions.
    kv_api_->seq_len(kv_, 0, seq_ids[b], &lens[size_t(b)]);
  }
  for (size_t i = 0; i < chains_.instances.size(); ++i) {
    auto& layers = served_[i];
    if (layers.empty()) continue;
    std::sort(layers.begin(), layers.end());
    layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
    const sieve_policy_api* api = chains_.instances[i].plugin.policy();
    if (uses(int32_t(i), SIEVE_HOOK_END_STEP)) {
      sieve_step_end e{};
      e.hdr = SIEVE_HEADER_INIT(sieve_step_end);
      e.phase = phase;
      e.step = step;
      e.batch = batch;
      e.seq_ids = seq_ids;
      e.kv_len_host = lens.data();
      e.layers = layers.data();
      e.n_layers = int32_t(layers.size());
      e.kv = kv_;
      e.kv_api = kv_api_;
      sieve_status st = api->end_step(handles_[i], &e);
      if (st != SIEVE_OK) {
        const char* msg = api->last_error ? api->last_error(handles_[i]) : nullptr;
        if (error)
          *error = "plugin '" + std::string(chains_.instances[i].plugin.name()) + "' (instance " + chains_.instances[i].label +
                   "), step " + std::to_string(step) + ", hook end_step: " + status_name(st) +
                   (msg && *msg ? std::string(": ") + msg : "");
        layers.clear();
        return st;
      }
    }
    layers.clear();
  }
  timers_.lap("host_us.end_step", -1, mark);
  return SIEVE_OK;
}

}  // namespace sieve::runtime
