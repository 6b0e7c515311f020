// The C host API (api/sieve/host.h) over the C++ runtime: registry + discovery, chain specs, and
// a session = HostServices + the core paged KV store + LayerRunner. Every entry point catches
// everything: a host in C (or Python through ctypes) never sees an exception.
#include "sieve/host.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/kv/paged_store.hpp"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/layer_runner.hpp"
#include "sieve/runtime/params.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"

using namespace sieve;
using namespace sieve::runtime;

struct sieve_runtime {
  DiscoveryOptions discovery;
  std::optional<Registry> registry;  // loaded on first use
  std::string error;
  // Texts handed out (paths, failure lines): the registry's vectors may grow and move their
  // strings, these never move (node-based set), so the pointers live as long as the runtime.
  std::unordered_set<std::string> texts;

  const char* stable(const std::string& text) { return texts.insert(text).first->c_str(); }

  Registry& plugins() {
    if (!registry) registry.emplace(Registry::discover(discovery));
    return *registry;
  }
};

struct sieve_chain {
  ChainSpec spec;
  std::string text;
};

struct sieve_session {
  std::unique_ptr<HostServices> services;
  sieve_geometry geometry{};
  const sieve_kv_store_api* kv_api = nullptr;
  sieve_kv_store* kv = nullptr;
  std::unique_ptr<LayerRunner> runner;
  std::string error;
  // Tokens taken per sequence and layer: the default positions of the next tokens.
  std::unordered_map<int32_t, std::vector<int32_t>> taken;
  std::vector<int32_t> positions;
  // qo_indptr on the attention device (grown when a call has a larger batch).
  void* qo_device = nullptr;
  size_t qo_capacity = 0;
  uint64_t steps[2] = {0, 0};

  ~sieve_session() {
    runner.reset();  // policy instances before the store they registered sidecars on
    if (kv) kv_api->destroy(kv);
    if (qo_device) services->table()->free(services->table()->host_ctx, services->device(), qo_device);
  }
};

namespace {

// Runs `body`; an exception becomes its status and `*error`.
template <class F>
sieve_status guarded(std::string* error, F&& body) {
  try {
    if (error) error->clear();
    return body();
  } catch (const Error& e) {
    if (error) *error = e.what();
    return e.status();
  } catch (const std::bad_alloc&) {
    if (error) *error = "out of host memory";
    return SIEVE_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    if (error) *error = e.what();
    return SIEVE_ERR_INTERNAL;
  } catch (...) {
    if (error) *error = "unknown exception";
    return SIEVE_ERR_INTERNAL;
  }
}

// A zeroed struct with its header set.
template <class T>
T blank() {
  T t{};
  t.hdr = SIEVE_HEADER_INIT(T);
  return t;
}

// Reads a caller's struct of `size` bytes (its header) into a zeroed full-size copy: fields a
// newer minor added and an older caller lacks keep their defaults.
template <class T>
T read_struct(const T* in, const T& defaults) {
  T out = defaults;
  if (!in) return out;
  const size_t n = std::min<size_t>(in->hdr.struct_size, sizeof(T));
  require(n >= sizeof(sieve_header), SIEVE_ERR_VERSION, "struct_size " + std::to_string(in->hdr.struct_size) +
                                                            " is smaller than the header");
  std::memcpy(&out, in, n);
  out.hdr = defaults.hdr;
  return out;
}

void check_tensor(const DLTensor* t, const char* what, DLDevice device, int64_t rows, int64_t heads, int64_t dim) {
  require(t != nullptr, SIEVE_ERR_INVALID_ARGUMENT, std::string(what) + " is NULL");
  require(t->data != nullptr, SIEVE_ERR_INVALID_ARGUMENT, std::string(what) + " has no data");
  require(t->device.device_type == device.device_type && t->device.device_id == device.device_id,
          SIEVE_ERR_INVALID_ARGUMENT, std::string(what) + " is on " + device_name(t->device) +
                                          ", the session runs on " + device_name(device));
  require(t->ndim == 3 && t->shape && t->shape[0] == rows && t->shape[1] == heads && t->shape[2] == dim,
          SIEVE_ERR_INVALID_ARGUMENT,
          std::string(what) + " must have shape [" + std::to_string(rows) + ", " + std::to_string(heads) + ", " +
              std::to_string(dim) + "]");
  if (t->strides) {
    const int64_t want[3] = {heads * dim, dim, 1};
    for (int i = 0; i < 3; ++i)
      require(t->strides[i] == want[i], SIEVE_ERR_INVALID_ARGUMENT, std::string(what) + " must be compact row-major");
  }
  const DLDataType d = t->dtype;
  require(d.lanes == 1 && ((d.code == kDLFloat && (d.bits == 32 || d.bits == 16)) || (d.code == kDLBfloat && d.bits == 16)),
          SIEVE_ERR_INVALID_ARGUMENT, std::string(what) + " must be f32, f16 or bf16");
}

}  // namespace

extern "C" {

uint32_t sieve_host_api_version(void) { return (SIEVE_HOST_API_MAJOR << 16) | SIEVE_HOST_API_MINOR; }

sieve_status sieve_runtime_create(const sieve_runtime_options* options, sieve_runtime** out) {
  if (!out) return SIEVE_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded(nullptr, [&] {
    sieve_runtime_options o = read_struct(options, blank<sieve_runtime_options>());
    auto rt = std::make_unique<sieve_runtime>();
    rt->discovery.use_env = !(o.flags & SIEVE_RUNTIME_NO_ENV);
    const bool defaults = !(o.flags & SIEVE_RUNTIME_NO_DEFAULT_DIRS);
    rt->discovery.use_exe_dir = rt->discovery.use_install_dir = defaults;
    *out = rt.release();
    return SIEVE_OK;
  });
}

void sieve_runtime_destroy(sieve_runtime* runtime) { delete runtime; }

const char* sieve_runtime_last_error(const sieve_runtime* runtime) {
  return runtime ? runtime->error.c_str() : "no runtime";
}

sieve_status sieve_runtime_add_plugin_dir(sieve_runtime* rt, const char* dir) {
  if (!rt) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&rt->error, [&] {
    require(dir && *dir, SIEVE_ERR_INVALID_ARGUMENT, "add_plugin_dir: no directory given");
    std::error_code ec;
    require(std::filesystem::is_directory(dir, ec), SIEVE_ERR_NOT_FOUND,
            std::string("plugin directory ") + dir + " does not exist");
    if (rt->registry)
      rt->registry->add_directory(dir);
    else
      rt->discovery.plugin_dirs.push_back(dir);
    return SIEVE_OK;
  });
}

sieve_status sieve_runtime_plugin_count(sieve_runtime* rt, uint32_t* count) {
  if (!rt) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&rt->error, [&] {
    require(count != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "plugin_count: count is NULL");
    *count = uint32_t(rt->plugins().plugins().size());
    return SIEVE_OK;
  });
}

sieve_status sieve_runtime_plugin_info(sieve_runtime* rt, uint32_t index, sieve_plugin_info* info) {
  if (!rt) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&rt->error, [&] {
    require(info != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "plugin_info: info is NULL");
    require(info->hdr.struct_size >= sizeof(sieve_header), SIEVE_ERR_VERSION,
            "plugin_info: set info->hdr with SIEVE_HEADER_INIT(sieve_plugin_info)");
    const auto& all = rt->plugins().plugins();
    require(index < all.size(), SIEVE_ERR_NOT_FOUND,
            "plugin index " + std::to_string(index) + " (there are " + std::to_string(all.size()) + ")");
    const LoadedPlugin& p = all[index];
    sieve_plugin_info full{};
    full.hdr = SIEVE_HEADER_INIT(sieve_plugin_info);
    full.name = p.name();
    full.path = rt->stable(p.path);
    full.abi_major = p.plugin_major;
    full.abi_minor = p.table->hdr.version;
    full.descriptor = p.descriptor();
    if (const sieve_policy_api* api = p.policy()) {
      full.params = api->params;
      full.n_params = api->n_params;
      full.params_stride = api->n_params && api->params ? api->params->hdr.struct_size : uint32_t(sizeof(sieve_param_spec));
    }
    // Only what the caller's struct holds; its header keeps the caller's size.
    const size_t n = std::min<size_t>(info->hdr.struct_size, sizeof full);
    const sieve_header keep = info->hdr;
    std::memcpy(info, &full, n);
    info->hdr = keep;
    return SIEVE_OK;
  });
}

sieve_status sieve_runtime_failure_count(sieve_runtime* rt, uint32_t* count) {
  if (!rt) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&rt->error, [&] {
    require(count != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "failure_count: count is NULL");
    *count = uint32_t(rt->plugins().failures().size());
    return SIEVE_OK;
  });
}

const char* sieve_runtime_failure(sieve_runtime* rt, uint32_t index) {
  if (!rt) return "";
  try {
    const auto& f = rt->plugins().failures();
    if (index >= f.size()) return "";
    return rt->stable(f[index].reason);
  } catch (...) {
    return "";
  }
}

sieve_status sieve_chain_parse(sieve_runtime* rt, const char* spec, sieve_chain** out) {
  if (!rt) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&rt->error, [&] {
    require(out != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "chain_parse: out is NULL");
    *out = nullptr;
    require(spec != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "chain_parse: spec is NULL");
    auto c = std::make_unique<sieve_chain>();
    std::string err;
    require(parse_chain_spec(spec, &c->spec, &err), SIEVE_ERR_INVALID_ARGUMENT, err);
    c->text = to_string(c->spec);
    *out = c.release();
    return SIEVE_OK;
  });
}

sieve_status sieve_chain_load_file(sieve_runtime* rt, const char* path, sieve_chain** out) {
  if (!rt) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&rt->error, [&] {
    require(out != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "chain_load_file: out is NULL");
    *out = nullptr;
    require(path != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "chain_load_file: path is NULL");
    auto c = std::make_unique<sieve_chain>();
    std::string err;
    require(load_chain_file(path, &c->spec, &err), SIEVE_ERR_INVALID_ARGUMENT, err);
    c->text = to_string(c->spec);
    *out = c.release();
    return SIEVE_OK;
  });
}

void sieve_chain_destroy(sieve_chain* chain) { delete chain; }

const char* sieve_chain_text(const sieve_chain* chain) { return chain ? chain->text.c_str() : ""; }

sieve_status sieve_session_create(sieve_runtime* rt, const sieve_geometry* geometry, const sieve_chain* chain,
                                  const sieve_session_options* options, sieve_session** out) {
  if (!rt) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&rt->error, [&] {
    require(out != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "session_create: out is NULL");
    *out = nullptr;
    require(geometry != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "session_create: geometry is NULL");
    require(geometry->hdr.struct_size >= sizeof(sieve_geometry), SIEVE_ERR_VERSION,
            "session_create: geometry struct_size " + std::to_string(geometry->hdr.struct_size) + " < " +
                std::to_string(sizeof(sieve_geometry)) + " (set hdr with SIEVE_HEADER_INIT(sieve_geometry))");
    sieve_session_options defaults = blank<sieve_session_options>();
    defaults.check = 1;
    const sieve_session_options o = read_struct(options, defaults);
    sieve_geometry g = *geometry;
    g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
    require(g.n_layers > 0 && g.n_q_heads > 0 && g.n_kv_heads > 0 && g.n_q_heads % g.n_kv_heads == 0 &&
                g.head_dim > 0 && g.page_size > 0 && g.max_batch > 0 && g.max_seq_len > 0,
            SIEVE_ERR_INVALID_ARGUMENT,
            "session_create: geometry needs n_layers, heads (n_q_heads a multiple of n_kv_heads), head_dim, "
            "page_size, max_batch and max_seq_len > 0");
    require(o.pages_per_layer >= 0, SIEVE_ERR_INVALID_ARGUMENT, "session_create: pages_per_layer < 0");

    ResolvedChains chains;
    std::vector<std::string> errors;
    static const ChainSpec kDense;
    if (!resolve_chains(chain ? chain->spec : kDense, rt->plugins(), g, &chains, &errors)) {
      std::string all;
      for (const auto& e : errors) all += (all.empty() ? "" : "\n") + e;
      fail(SIEVE_ERR_INVALID_ARGUMENT, all);
    }

    auto s = std::make_unique<sieve_session>();
    s->services = std::make_unique<HostServices>(g.device);  // throws (SIEVE_ERR_DEVICE) without CUDA
    s->geometry = g;
    s->kv_api = g.device.device_type == kDLCUDA ? kv::paged_cuda_store_api() : kv::paged_cpu_store_api();
    require(s->kv_api != nullptr, SIEVE_ERR_UNSUPPORTED, "this runtime was built without CUDA");
    sieve_kv_config kc{};
    kc.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
    kc.geometry = g;
    kc.pages_per_layer = o.pages_per_layer ? o.pages_per_layer
                                           : g.max_batch * kernels::ceil_div(g.max_seq_len, g.page_size);
    kc.keep_pre_rope_k = (chains.needs & SIEVE_NEEDS_PRE_ROPE_K) ? 1 : 0;
    std::string reason;
    sieve_reason_sink sink{&reason, [](void* c, const char* m) { *static_cast<std::string*>(c) = m ? m : ""; }};
    sieve_status st = s->kv_api->create(s->services->table(), &kc, &s->kv, sink);
    if (st != SIEVE_OK) fail(st, "KV store '" + std::string(s->kv_api->name) + "': " + reason);
    LayerRunner::Options ro;
    ro.check = o.check != 0;
    s->runner = std::make_unique<LayerRunner>(*s->services, g, s->kv, s->kv_api, std::move(chains), ro);
    *out = s.release();
    return SIEVE_OK;
  });
}

void sieve_session_destroy(sieve_session* session) {
  if (!session) return;
  std::string ignored;
  if (session->services) session->services->synchronize(&ignored);  // no device work in flight
  delete session;
}

const char* sieve_session_last_error(const sieve_session* session) {
  return session ? session->error.c_str() : "no session";
}

sieve_status sieve_session_add_sequence(sieve_session* s, int32_t* seq_id) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    require(seq_id != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "add_sequence: seq_id is NULL");
    sieve_status st = s->kv_api->add_sequence(s->kv, seq_id);
    if (st != SIEVE_OK) fail(st, std::string("add_sequence: ") + s->kv_api->last_error(s->kv));
    s->taken[*seq_id].assign(size_t(s->geometry.n_layers), 0);
    return SIEVE_OK;
  });
}

sieve_status sieve_session_remove_sequence(sieve_session* s, int32_t seq_id) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    sieve_status st = s->kv_api->remove_sequence(s->kv, seq_id);
    if (st != SIEVE_OK) fail(st, std::string("remove_sequence: ") + s->kv_api->last_error(s->kv));
    s->taken.erase(seq_id);
    return SIEVE_OK;
  });
}

sieve_status sieve_session_seq_len(sieve_session* s, int32_t layer, int32_t seq_id, int32_t* tokens) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    require(tokens != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "seq_len: tokens is NULL");
    sieve_status st = s->kv_api->seq_len(s->kv, layer, seq_id, tokens);
    if (st != SIEVE_OK) fail(st, std::string("seq_len: ") + s->kv_api->last_error(s->kv));
    return SIEVE_OK;
  });
}

sieve_status sieve_session_attend(sieve_session* s, const sieve_layer_inputs* inputs, DLTensor* out) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    require(inputs != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "attend: inputs is NULL");
    const sieve_layer_inputs in = read_struct(inputs, blank<sieve_layer_inputs>());
    const sieve_geometry& g = s->geometry;
    require(in.phase == SIEVE_PHASE_PREFILL || in.phase == SIEVE_PHASE_DECODE, SIEVE_ERR_INVALID_ARGUMENT,
            "attend: phase " + std::to_string(in.phase) + " is neither SIEVE_PHASE_PREFILL nor SIEVE_PHASE_DECODE");
    require(in.layer >= 0 && in.layer < g.n_layers, SIEVE_ERR_INVALID_ARGUMENT,
            "attend: layer " + std::to_string(in.layer) + " is outside [0, " + std::to_string(g.n_layers) + ")");
    require(in.batch >= 1 && in.batch <= g.max_batch, SIEVE_ERR_INVALID_ARGUMENT,
            "attend: batch " + std::to_string(in.batch) + " is outside [1, max_batch = " +
                std::to_string(g.max_batch) + "]");
    require(in.seq_ids && in.qo_indptr, SIEVE_ERR_INVALID_ARGUMENT, "attend: seq_ids or qo_indptr is NULL");
    require(in.qo_indptr[0] == 0, SIEVE_ERR_INVALID_ARGUMENT, "attend: qo_indptr[0] must be 0");
    for (int32_t b = 0; b < in.batch; ++b) {
      const int32_t n = in.qo_indptr[b + 1] - in.qo_indptr[b];
      require(n >= 1 && (in.phase == SIEVE_PHASE_PREFILL || n == 1), SIEVE_ERR_INVALID_ARGUMENT,
              "attend: sequence " + std::to_string(b) + " has " + std::to_string(n) + " new tokens (" +
                  (in.phase == SIEVE_PHASE_DECODE ? "decode takes exactly 1)" : "prefill takes >= 1)"));
      require(s->taken.count(in.seq_ids[b]) != 0, SIEVE_ERR_NOT_FOUND,
              "attend: sequence id " + std::to_string(in.seq_ids[b]) + " was not added to this session");
    }
    const int32_t n_new = in.qo_indptr[in.batch];
    const DLDevice dev = s->services->device();
    check_tensor(in.q, "q", dev, n_new, g.n_q_heads, g.head_dim);
    check_tensor(in.k, "k", dev, n_new, g.n_kv_heads, g.head_dim);
    check_tensor(in.v, "v", dev, n_new, g.n_kv_heads, g.head_dim);
    check_tensor(out, "out", dev, n_new, g.n_q_heads, g.head_dim);
    if (in.q_pre_rope) check_tensor(in.q_pre_rope, "q_pre_rope", dev, n_new, g.n_q_heads, g.head_dim);
    if (in.k_pre_rope) check_tensor(in.k_pre_rope, "k_pre_rope", dev, n_new, g.n_kv_heads, g.head_dim);

    // Positions: the caller's, or consecutive after what this layer already took.
    s->positions.resize(size_t(n_new));
    for (int32_t b = 0; b < in.batch; ++b) {
      const int32_t first = s->taken[in.seq_ids[b]][size_t(in.layer)];
      for (int32_t r = in.qo_indptr[b]; r < in.qo_indptr[b + 1]; ++r)
        s->positions[size_t(r)] = in.positions ? in.positions[r] : first + (r - in.qo_indptr[b]);
    }
    // qo_indptr on the attention device.
    const size_t qo_bytes = size_t(in.batch + 1) * sizeof(int32_t);
    const sieve_host_services* t = s->services->table();
    if (qo_bytes > s->qo_capacity) {
      if (s->qo_device) t->free(t->host_ctx, dev, s->qo_device);
      s->qo_device = t->alloc(t->host_ctx, dev, qo_bytes, 256);
      require(s->qo_device != nullptr, SIEVE_ERR_OUT_OF_MEMORY, "attend: cannot allocate qo_indptr");
      s->qo_capacity = qo_bytes;
    }
    std::string err;
    require(s->services->copy(s->qo_device, dev, in.qo_indptr, kCpu, qo_bytes, &err), SIEVE_ERR_DEVICE, err);
    int64_t qo_shape[1] = {in.batch + 1};
    DLTensor qo = make_view(s->qo_device, dev, kI32, 1, qo_shape);

    LayerInputs li;
    li.layer = in.layer;
    li.phase = in.phase;
    li.step = s->steps[in.phase == SIEVE_PHASE_PREFILL ? 0 : 1];
    li.batch = in.batch;
    li.seq_ids = in.seq_ids;
    li.qo_indptr_host = in.qo_indptr;
    li.qo_indptr = &qo;
    li.positions_host = s->positions.data();
    li.q = in.q;
    li.q_pre_rope = in.q_pre_rope;
    li.k = in.k;
    li.v = in.v;
    li.k_pre_rope = in.k_pre_rope;
    sieve_status st = s->runner->run_layer(li, out, &err);
    if (st != SIEVE_OK) fail(st, err);
    for (int32_t b = 0; b < in.batch; ++b)
      s->taken[in.seq_ids[b]][size_t(in.layer)] += in.qo_indptr[b + 1] - in.qo_indptr[b];
    return SIEVE_OK;
  });
}

sieve_status sieve_session_end_step(sieve_session* s, uint32_t phase, const int32_t* seq_ids, int32_t batch) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    require(phase == SIEVE_PHASE_PREFILL || phase == SIEVE_PHASE_DECODE, SIEVE_ERR_INVALID_ARGUMENT,
            "end_step: phase " + std::to_string(phase) + " is neither prefill nor decode");
    require(batch >= 0 && (batch == 0 || seq_ids), SIEVE_ERR_INVALID_ARGUMENT, "end_step: seq_ids is NULL");
    uint64_t& step = s->steps[phase == SIEVE_PHASE_PREFILL ? 0 : 1];
    std::string err;
    sieve_status st = s->runner->end_step(phase, step, seq_ids, batch, &err);
    if (st != SIEVE_OK) fail(st, err);
    ++step;
    return SIEVE_OK;
  });
}

sieve_status sieve_session_synchronize(sieve_session* s) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    std::string err;
    require(s->services->synchronize(&err), SIEVE_ERR_DEVICE, err);
    return SIEVE_OK;
  });
}

void* sieve_session_cuda_stream(sieve_session* s) { return s ? s->services->cuda_stream() : nullptr; }

sieve_status sieve_session_kv_bytes(sieve_session* s, uint64_t* bytes) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    require(bytes != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "kv_bytes: bytes is NULL");
    sieve_status st = s->kv_api->bytes_in_use(s->kv, bytes);
    if (st != SIEVE_OK) fail(st, std::string("kv_bytes: ") + s->kv_api->last_error(s->kv));
    return SIEVE_OK;
  });
}

}  // extern "C"
