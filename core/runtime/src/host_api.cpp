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
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/layer_runner.hpp"
#include "sieve/runtime/params.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/runtime/session.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/grow_buffer.hpp"
#include "sieve/util/lazy_require.hpp"
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
  std::unique_ptr<HostServices> services;  // outlives the session below
  std::unique_ptr<Session> session;
  std::string error;
  // Tokens taken per sequence and layer: the default positions of the next tokens.
  std::unordered_map<int32_t, std::vector<int32_t>> taken;
  std::vector<int32_t> positions;
  util::GrowBuffer qo_device;  // qo_indptr on the attention device
  // What qo_device holds: a decode step's qo_indptr ([0, 1, ..., batch]) repeats for every layer
  // and step, and its upload is a copy plus a stream synchronisation, so it is sent only when it
  // changes (a new batch, a prefill).
  std::vector<int32_t> qo_uploaded;
  uint64_t steps[2] = {0, 0};

  ~sieve_session() {
    session.reset();  // instances, then the store, then the plugins (session.hpp)
    if (services) {
      auto memory = services->device_memory();
      qo_device.release(memory);
    }
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
// newer minor added and an older caller lacks keep their defaults. (This and check_tensor run on
// every attend call: their messages are built only on failure.)
template <class T>
T read_struct(const T* in, const T& defaults) {
  T out = defaults;
  if (!in) return out;
  const size_t n = std::min<size_t>(in->hdr.struct_size, sizeof(T));
  require(n >= sizeof(sieve_header), SIEVE_ERR_VERSION,
          [&] { return "struct_size " + std::to_string(in->hdr.struct_size) + " is smaller than the header"; });
  std::memcpy(&out, in, n);
  out.hdr = defaults.hdr;
  return out;
}

void check_tensor(const DLTensor* t, const char* what, DLDevice device, int64_t rows, int64_t heads, int64_t dim) {
  require(t != nullptr, SIEVE_ERR_INVALID_ARGUMENT, [&] { return std::string(what) + " is NULL"; });
  require(t->data != nullptr, SIEVE_ERR_INVALID_ARGUMENT, [&] { return std::string(what) + " has no data"; });
  require(t->device.device_type == device.device_type && t->device.device_id == device.device_id,
          SIEVE_ERR_INVALID_ARGUMENT, [&] {
            return std::string(what) + " is on " + device_name(t->device) + ", the session runs on " +
                   device_name(device);
          });
  require(t->ndim == 3 && t->shape && t->shape[0] == rows && t->shape[1] == heads && t->shape[2] == dim,
          SIEVE_ERR_INVALID_ARGUMENT, [&] {
            return std::string(what) + " must have shape [" + std::to_string(rows) + ", " + std::to_string(heads) +
                   ", " + std::to_string(dim) + "]";
          });
  if (t->strides) {
    // A dimension of extent 1 is never stepped over, so its stride says nothing about the layout
    // (PyTorch's DLPack export writes 1 there: a [1, heads, dim] decode tensor is still compact).
    const int64_t want[3] = {heads * dim, dim, 1};
    for (int i = 0; i < 3; ++i)
      require(t->shape[i] == 1 || t->strides[i] == want[i], SIEVE_ERR_INVALID_ARGUMENT,
              [&] { return std::string(what) + " must be compact row-major"; });
  }
  const DLDataType d = t->dtype;
  require(d.lanes == 1 && ((d.code == kDLFloat && (d.bits == 32 || d.bits == 16)) || (d.code == kDLBfloat && d.bits == 16)),
          SIEVE_ERR_INVALID_ARGUMENT, [&] { return std::string(what) + " must be f32, f16 or bf16"; });
}

// A schema's element stride: its first element's struct_size (params.hpp's rule).
uint32_t param_stride(const sieve_param_spec* params, uint32_t n) {
  return n && params ? params->hdr.struct_size : uint32_t(sizeof(sieve_param_spec));
}

std::vector<const StoreEntry*> builtin_stores(const Registry& r) {
  std::vector<const StoreEntry*> out;
  for (const StoreEntry& e : r.stores())
    if (e.builtin()) out.push_back(&e);
  return out;
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
    rt->discovery.probe = !(o.flags & SIEVE_RUNTIME_NO_PROBE);
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
    *count = uint32_t(rt->plugins().plugins().size() + builtin_stores(rt->plugins()).size());
    return SIEVE_OK;
  });
}

sieve_status sieve_runtime_plugin_info(sieve_runtime* rt, uint32_t index, sieve_plugin_info* info) {
  if (!rt) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&rt->error, [&] {
    require(info != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "plugin_info: info is NULL");
    require(info->hdr.struct_size >= sizeof(sieve_header), SIEVE_ERR_VERSION,
            "plugin_info: set info->hdr with SIEVE_HEADER_INIT(sieve_plugin_info)");
    // The plugins in search order, then the runtime's own stores (builtin = 1).
    const auto& all = rt->plugins().plugins();
    const std::vector<const StoreEntry*> builtins = builtin_stores(rt->plugins());
    require(index < all.size() + builtins.size(), SIEVE_ERR_NOT_FOUND,
            "plugin index " + std::to_string(index) + " (there are " + std::to_string(all.size() + builtins.size()) +
                ")");
    sieve_plugin_info full{};
    full.hdr = SIEVE_HEADER_INIT(sieve_plugin_info);
    const StoreEntry* store = nullptr;
    if (index < all.size()) {
      const LoadedPlugin& p = all[index];
      full.name = p.name();
      full.path = rt->stable(p.path);
      full.abi_major = p.plugin_major;
      full.abi_minor = p.table->hdr.version;
      full.descriptor = p.descriptor();
      if (const sieve_policy_api* api = p.policy()) {
        full.params = api->params;
        full.n_params = api->n_params;
        full.params_stride = param_stride(api->params, api->n_params);
      }
      if (!p.tools().empty()) {  // checked at load: one stride, each entry well formed
        full.tools = p.table->tools;
        full.n_tools = p.table->n_tools;
      }
      for (const StoreEntry& e : rt->plugins().stores())
        if (e.plugin.table == p.table) store = &e;
    } else {
      store = builtins[index - all.size()];
      full.name = store->descriptor.name;
      full.path = "built-in";
      full.abi_major = SIEVE_ABI_MAJOR;
      full.abi_minor = SIEVE_ABI_MINOR;
      full.builtin = 1;
    }
    if (store && store->declared) {
      full.kv_store_descriptor = store->api->descriptor;  // the store's own: lives with its code
      if (SIEVE_HAS_FIELD(store->api, sieve_kv_store_api, n_params)) {
        full.kv_store_params = store->api->params;
        full.n_kv_store_params = store->api->n_params;
        full.kv_store_params_stride = param_stride(store->api->params, store->api->n_params);
      }
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

    require(!o.kv_store_instance || o.kv_store_api, SIEVE_ERR_INVALID_ARGUMENT,
            "session_create: kv_store_instance needs its table (kv_store_api)");
    // The store: at most one of options.kv_store, options.kv_store_api and the chain's kv_store.
    static const ChainSpec kDense;
    ChainSpec spec = chain ? chain->spec : kDense;
    std::string err;
    if (o.kv_store) {
      ChainInstance store;
      if (!parse_store_argument(o.kv_store, &store, &err)) fail(SIEVE_ERR_INVALID_ARGUMENT, "session_create: " + err);
      require(!o.kv_store_api, SIEVE_ERR_INVALID_ARGUMENT,
              "session_create: two KV stores named: kv_store '" + store.plugin + "' and a kv_store_api table");
      if (!set_kv_store(&spec, store, &err)) fail(SIEVE_ERR_INVALID_ARGUMENT, "session_create: " + err);
    }
    require(!(o.kv_store_api && spec.kv_store), SIEVE_ERR_INVALID_ARGUMENT,
            "session_create: two KV stores named: the chain's kv_store '" +
                (spec.kv_store ? spec.kv_store->plugin : std::string()) + "' and a kv_store_api table");

    ResolvedChains chains;
    std::vector<std::string> errors;
    if (!resolve_chains(spec, rt->plugins(), g, &chains, &errors)) {
      std::string all;
      for (const auto& e : errors) all += (all.empty() ? "" : "\n") + e;
      fail(SIEVE_ERR_INVALID_ARGUMENT, all);
    }

    auto s = std::make_unique<sieve_session>();
    // Throws (SIEVE_ERR_DEVICE) without CUDA, or for a stream handed to a CPU session.
    s->services = std::make_unique<HostServices>(g.device, o.cuda_stream);
    Session::Options so;
    so.pages_per_layer = o.pages_per_layer;
    so.runner.check = o.check != 0;
    so.store_api = o.kv_store_api;
    so.store_instance = o.kv_store_instance;
    so.release = o.release;
    so.binds_pages = true;  // a host has sieve_session_bind_pages
    s->session = std::make_unique<Session>(*s->services, g, std::move(chains), so);
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
    *seq_id = s->session->add_sequence();
    s->taken[*seq_id].assign(size_t(s->session->geometry().n_layers), 0);
    return SIEVE_OK;
  });
}

sieve_status sieve_session_remove_sequence(sieve_session* s, int32_t seq_id) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    s->session->remove_sequence(seq_id);
    s->taken.erase(seq_id);
    return SIEVE_OK;
  });
}

sieve_status sieve_session_seq_len(sieve_session* s, int32_t layer, int32_t seq_id, int32_t* tokens) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    require(tokens != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "seq_len: tokens is NULL");
    *tokens = s->session->seq_len(layer, seq_id);
    return SIEVE_OK;
  });
}

sieve_status sieve_session_attend(sieve_session* s, const sieve_layer_inputs* inputs, DLTensor* out) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    // Every message below is built only on failure (a lambda): this runs per layer and step.
    require(inputs != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "attend: inputs is NULL");
    const sieve_layer_inputs in = read_struct(inputs, blank<sieve_layer_inputs>());
    const sieve_geometry& g = s->session->geometry();
    require(in.phase == SIEVE_PHASE_PREFILL || in.phase == SIEVE_PHASE_DECODE, SIEVE_ERR_INVALID_ARGUMENT, [&] {
      return "attend: phase " + std::to_string(in.phase) + " is neither SIEVE_PHASE_PREFILL nor SIEVE_PHASE_DECODE";
    });
    require(in.layer >= 0 && in.layer < g.n_layers, SIEVE_ERR_INVALID_ARGUMENT, [&] {
      return "attend: layer " + std::to_string(in.layer) + " is outside [0, " + std::to_string(g.n_layers) + ")";
    });
    require(in.batch >= 1 && in.batch <= g.max_batch, SIEVE_ERR_INVALID_ARGUMENT, [&] {
      return "attend: batch " + std::to_string(in.batch) + " is outside [1, max_batch = " +
             std::to_string(g.max_batch) + "]";
    });
    require(in.seq_ids && in.qo_indptr, SIEVE_ERR_INVALID_ARGUMENT, "attend: seq_ids or qo_indptr is NULL");
    require(in.qo_indptr[0] == 0, SIEVE_ERR_INVALID_ARGUMENT, "attend: qo_indptr[0] must be 0");
    for (int32_t b = 0; b < in.batch; ++b) {
      const int32_t n = in.qo_indptr[b + 1] - in.qo_indptr[b];
      require(n >= 1 && (in.phase == SIEVE_PHASE_PREFILL || n == 1), SIEVE_ERR_INVALID_ARGUMENT, [&] {
        return "attend: sequence " + std::to_string(b) + " has " + std::to_string(n) + " new tokens (" +
               (in.phase == SIEVE_PHASE_DECODE ? "decode takes exactly 1)" : "prefill takes >= 1)");
      });
      require(s->taken.count(in.seq_ids[b]) != 0, SIEVE_ERR_NOT_FOUND, [&] {
        return "attend: sequence id " + std::to_string(in.seq_ids[b]) + " was not added to this session";
      });
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
    auto memory = s->services->device_memory();
    if (s->qo_device.ensure(memory, qo_bytes)) s->qo_uploaded.clear();  // a new buffer holds nothing
    std::string err;
    if (!std::equal(in.qo_indptr, in.qo_indptr + in.batch + 1, s->qo_uploaded.begin(), s->qo_uploaded.end())) {
      s->qo_uploaded.clear();  // unknown until the copy succeeds
      require(s->services->copy(s->qo_device.get(), dev, in.qo_indptr, kCpu, qo_bytes, &err), SIEVE_ERR_DEVICE, err);
      s->qo_uploaded.assign(in.qo_indptr, in.qo_indptr + in.batch + 1);
    }
    int64_t qo_shape[1] = {in.batch + 1};
    DLTensor qo = make_view(s->qo_device.get(), dev, kI32, 1, qo_shape);

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
    sieve_status st = s->session->runner().run_layer(li, out, &err);
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
            [&] { return "end_step: phase " + std::to_string(phase) + " is neither prefill nor decode"; });
    require(batch >= 0 && (batch == 0 || seq_ids), SIEVE_ERR_INVALID_ARGUMENT, "end_step: seq_ids is NULL");
    uint64_t& step = s->steps[phase == SIEVE_PHASE_PREFILL ? 0 : 1];
    std::string err;
    sieve_status st = s->session->runner().end_step(phase, step, seq_ids, batch, &err);
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
    *bytes = s->session->bytes_in_use();
    return SIEVE_OK;
  });
}

sieve_status sieve_session_bind_pages(sieve_session* s, const sieve_kv_pages* pages) {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  return guarded(&s->error, [&] {
    require(pages != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "bind_pages: pages is NULL");
    require(pages->hdr.struct_size >= sizeof(sieve_header), SIEVE_ERR_VERSION,
            "bind_pages: set pages->hdr with SIEVE_HEADER_INIT(sieve_kv_pages)");
    s->session->bind_pages(*pages);  // the store checks the rest (its own struct_size rules)
    return SIEVE_OK;
  });
}

const char* sieve_session_kv_store_name(const sieve_session* s) {
  if (!s || !s->session) return "";
  const StoreEntry& e = s->session->store_entry();
  return e.declared ? e.descriptor.name : "";
}

}  // extern "C"
