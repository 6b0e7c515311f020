// A small decode session for the seer plugin's tests (CPU and CUDA): the core's real paged store
// (keeping pre-RoPE keys), the runtime's host services, the plugin loaded from its .so, random
// pre-RoPE / post-RoPE keys and queries kept on the host for the f64 recomputation, and calls of
// on_append + select exactly as the layer runner orders them.
#pragma once
#include <gtest/gtest.h>
#include <sieve/kv/paged_store.hpp>
#include <sieve/runtime/host_services.hpp>
#include <sieve/sieve.h>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gate/gate_file.hpp"
#include "sieve/reference/page_pool.hpp"
#include "support/plugin_library.hpp"
#if SIEVE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sieve::testing {

struct SeerParams {
  std::string weights;
  int64_t block = 16;
  uint32_t mode = 0;  // 0 budget, 1 threshold, 2 oracle
  int64_t token_budget = 64;
  double threshold = 0.01;
  bool rmsnorm = false;
  bool fused = true;  // CUDA budget mode: the fused gate kernels (false: split kernels + core top-k)
};

inline const char* seer_mode_name(uint32_t m) { return m == 0 ? "budget" : m == 1 ? "threshold" : "oracle"; }

inline std::vector<sieve_param_value> seer_values(const SeerParams& p) {
  return {
      {SIEVE_PARAM_STRING, 0, 0, p.weights.c_str(), nullptr, 0},
      {SIEVE_PARAM_INT, p.block, 0, nullptr, nullptr, 0},
      {SIEVE_PARAM_ENUM, int64_t(p.mode), 0, seer_mode_name(p.mode), nullptr, 0},
      {SIEVE_PARAM_INT, p.token_budget, 0, nullptr, nullptr, 0},
      {SIEVE_PARAM_FLOAT, 0, p.threshold, nullptr, nullptr, 0},
      {SIEVE_PARAM_BOOL, p.rmsnorm ? 1 : 0, 0, nullptr, nullptr, 0},
      {SIEVE_PARAM_BOOL, p.fused ? 1 : 0, 0, nullptr, nullptr, 0},
  };
}

inline sieve_geometry seer_geometry(DLDevice dev, int32_t hq = 8, int32_t hkv = 2, int32_t d = 16, int32_t page = 16,
                                    int32_t max_batch = 4, int32_t max_seq_len = 512) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 2;
  g.n_q_heads = hq;
  g.n_kv_heads = hkv;
  g.head_dim = d;
  g.page_size = page;
  g.max_batch = max_batch;
  g.max_seq_len = max_seq_len;
  g.kv_dtype = kF32;
  g.device = dev;
  g.rope_theta = 10000.f;
  g.rope_dim = d;
  return g;
}

inline seer::GateShape seer_shape(const sieve_geometry& g, int32_t block, int32_t gate_dim, bool rmsnorm) {
  seer::GateShape s;
  s.n_layers = g.n_layers;
  s.n_q_heads = g.n_q_heads;
  s.n_kv_heads = g.n_kv_heads;
  s.head_dim = g.head_dim;
  s.block = block;
  s.gate_dim = gate_dim;
  s.rmsnorm = rmsnorm;
  s.rope_theta = g.rope_theta;
  return s;
}

// A temporary file name under the test's working directory.
inline std::string temp_path(const std::string& name) {
  return std::string(::testing::TempDir()) + "/seer_" + name + "_" + std::to_string(::getpid());
}

class SeerSession {
 public:
  SeerSession(const sieve_geometry& g, const SeerParams& p, uint64_t seed = 7)
      : g_(g), services_(g.device), rng_(uint32_t(seed)) {
    api_ = g.device.device_type == kDLCUDA ? kv::paged_cuda_store_api() : kv::paged_cpu_store_api();
    sieve_kv_config kc{};
    kc.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
    kc.geometry = g;
    kc.pages_per_layer = g.max_batch * ((g.max_seq_len + g.page_size - 1) / g.page_size);
    kc.keep_pre_rope_k = 1;
    std::string reason;
    sieve_reason_sink sink{&reason, [](void* c, const char* m) { *static_cast<std::string*>(c) = m ? m : ""; }};
    EXPECT_EQ(api_->create(services_.table(), &kc, &kv_, sink), SIEVE_OK) << reason;
    const sieve_plugin* table = lib_.negotiate();
    policy_api_ = table ? table->policy : nullptr;
    if (!policy_api_ || !kv_) return;
    values_ = seer_values(p);
    create_status_ = policy_api_->create(services_.table(), &g_, values_.data(), uint32_t(values_.size()), kv_, api_,
                                         &policy_, sink);
    create_error_ = reason;
  }
  ~SeerSession() {
    if (policy_) policy_api_->destroy(policy_);
    if (kv_) api_->destroy(kv_);
  }
  SeerSession(const SeerSession&) = delete;
  SeerSession& operator=(const SeerSession&) = delete;

  bool ok() const { return policy_ != nullptr; }
  sieve_status create_status() const { return create_status_; }
  const std::string& create_error() const { return create_error_; }
  const sieve_policy_api& api() const { return *policy_api_; }
  sieve_policy* policy() const { return policy_; }
  const sieve_geometry& geometry() const { return g_; }
  // Hand the plugin each step's view with its pages copied into this engine layout (strided views,
  // ABI 1.1) instead of the store's compact ones.
  std::optional<KvLayout> view_layout;

  int32_t add_sequence() {
    int32_t id = -1;
    EXPECT_EQ(api_->add_sequence(kv_, &id), SIEVE_OK);
    seqs_.push_back({id, {}, {}, {}, {}});
    return int32_t(seqs_.size() - 1);
  }

  // Host copies of one sequence's vectors (f32, [T, heads, d]).
  struct Seq {
    int32_t id;
    std::vector<float> k_pre, k_post, q_pre_last, q_post_last;  // the last query only
  };
  const Seq& seq(int32_t i) const { return seqs_[size_t(i)]; }

  // Append n_new[i] tokens to sequence i (all layers' store entries: `layer` only), then call
  // on_append and (decode: every n_new is 1) select. Returns select's status (or on_append's).
  // The selection is left in sel_indptr / sel_indices (host copies). capture_select (CUDA): the
  // select hook is captured into a CUDA graph on the host's stream, which is then launched (the
  // plugin declares STATIC_SHAPES: no synchronisation or allocation inside its hooks).
  sieve_status step(int32_t layer, const std::vector<int32_t>& seq_index, const std::vector<int32_t>& n_new,
                    uint32_t phase, bool run_select = true, bool capture_select = false) {
    const int32_t d = g_.head_dim, hkv = g_.n_kv_heads, hq = g_.n_q_heads;
    const int32_t batch = int32_t(seq_index.size());
    std::vector<int32_t> ids, qo{0}, positions, kv_len;
    int32_t total = 0;
    for (int32_t b = 0; b < batch; ++b) {
      ids.push_back(seqs_[size_t(seq_index[size_t(b)])].id);
      total += n_new[size_t(b)];
      qo.push_back(total);
    }
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> k(size_t(total) * hkv * d), kpre(k.size()), v(k.size()), q(size_t(total) * hq * d), qpre(q.size());
    for (auto* vec : {&k, &kpre, &v, &q, &qpre})
      for (float& x : *vec) x = u(rng_);
    // A few strong channels make the keys of a block alike (pooling then means something).
    for (int32_t b = 0; b < batch; ++b) {
      Seq& s = seqs_[size_t(seq_index[size_t(b)])];
      const int32_t start = int32_t(s.k_pre.size() / size_t(hkv * d));
      for (int32_t i = 0; i < n_new[size_t(b)]; ++i) {
        const size_t row = size_t(qo[size_t(b)] + i);
        positions.push_back(start + i);
        s.k_pre.insert(s.k_pre.end(), kpre.begin() + long(row * hkv * d), kpre.begin() + long((row + 1) * hkv * d));
        s.k_post.insert(s.k_post.end(), k.begin() + long(row * hkv * d), k.begin() + long((row + 1) * hkv * d));
        if (i + 1 == n_new[size_t(b)]) {
          s.q_pre_last.assign(qpre.begin() + long(row * hq * d), qpre.begin() + long((row + 1) * hq * d));
          s.q_post_last.assign(q.begin() + long(row * hq * d), q.begin() + long((row + 1) * hq * d));
        }
      }
      kv_len.push_back(start + n_new[size_t(b)]);
    }
    // Device copies of the new tokens.
    int64_t kshape[3] = {total, hkv, d}, qshape[3] = {total, hq, d}, qoshape[1] = {batch + 1};
    Buffer dk(g_.device, k), dkpre(g_.device, kpre), dv(g_.device, v), dq(g_.device, q), dqpre(g_.device, qpre);
    Buffer dqo(g_.device, qo);
    DLTensor tk = make_view(dk.p, g_.device, kF32, 3, kshape), tkpre = make_view(dkpre.p, g_.device, kF32, 3, kshape),
             tv = make_view(dv.p, g_.device, kF32, 3, kshape), tq = make_view(dq.p, g_.device, kF32, 3, qshape),
             tqpre = make_view(dqpre.p, g_.device, kF32, 3, qshape), tqo = make_view(dqo.p, g_.device, kI32, 1, qoshape);
    sieve_kv_append app{};
    app.hdr = SIEVE_HEADER_INIT(sieve_kv_append);
    app.layer = layer;
    app.batch = batch;
    app.seq_ids = ids.data();
    app.token_indptr = qo.data();
    app.k = &tk;
    app.v = &tv;
    app.k_pre_rope = &tkpre;
    EXPECT_EQ(api_->append(kv_, &app), SIEVE_OK) << api_->last_error(kv_);
    sieve_paged_kv view{};
    view.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
    EXPECT_EQ(api_->view(kv_, layer, ids.data(), batch, &view), SIEVE_OK) << api_->last_error(kv_);
    Relaid pages, pre;  // the view re-laid out (view_layout)
    if (view_layout) {
      pages = relay(view.k_pages, view.v_pages);
      pre = relay(view.k_pre_rope_pages, view.k_pre_rope_pages);
      view.k_pages = pages.pool->k_view(pages.mem_t);
      view.v_pages = pages.pool->v_view(pages.mem_t);
      view.k_pre_rope_pages = pre.pool->k_view(pre.mem_t);
    }
    sieve_layer_call call{};
    call.hdr = SIEVE_HEADER_INIT(sieve_layer_call);
    call.layer = layer;
    call.phase = phase;
    call.batch = batch;
    call.seq_ids = ids.data();
    call.qo_indptr = &tqo;
    call.qo_indptr_host = qo.data();
    call.kv_len_host = kv_len.data();
    call.q = &tq;
    call.q_pre_rope = &tqpre;
    call.positions_host = positions.data();
    call.geometry = &g_;
    call.kv = kv_;
    call.kv_api = api_;
    call.kv_view = &view;
    last_error_.clear();
    if (sieve_status st = policy_api_->on_append(policy_, &call, &app); st != SIEVE_OK) {
      last_error_ = policy_api_->last_error(policy_);
      return st;
    }
    if (!run_select) return sync();
    int32_t max_pages = 0;
    for (int32_t b = 0; b < batch; ++b) max_pages = std::max(max_pages, view.indptr_host[b + 1] - view.indptr_host[b]);
    const int64_t rows_cap = int64_t(total) * hq, capacity = std::max<int64_t>(rows_cap * max_pages, 1);
    Buffer sel_indptr(g_.device, std::vector<int32_t>(size_t(rows_cap + 1), -7));
    Buffer sel_indices(g_.device, std::vector<int32_t>(size_t(capacity), -7));
    int64_t ishape[1] = {rows_cap + 1}, cshape[1] = {capacity};
    sieve_selection sel{};
    sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
    sel.kind = SIEVE_SEL_ALL;
    sel.heads = SIEVE_SEL_PER_SEQUENCE;
    sel.q_block = 1;
    sel.k_block_pages = 1;
    sel.indptr = make_view(sel_indptr.p, g_.device, kI32, 1, ishape);
    sel.indices = make_view(sel_indices.p, g_.device, kI32, 1, cshape);
    sel.capacity = capacity;
    uint32_t stats = 0;
    if (capture_select) {
      if (sieve_status st = captured_select(call, sel, stats); st != SIEVE_OK) return st;
    } else if (sieve_status st = policy_api_->select(policy_, &call, &sel, &stats); st != SIEVE_OK) {
      last_error_ = policy_api_->last_error(policy_);
      return st;
    }
    if (sieve_status st = sync(); st != SIEVE_OK) return st;
    selection = sel;
    rows.clear();
    if (sel.kind == SIEVE_SEL_BLOCKS) {
      const auto ip = sel_indptr.read<int32_t>(size_t(sel.n_rows) + 1);
      const auto ix = sel_indices.read<int32_t>(size_t(capacity));
      for (int32_t r = 0; r < sel.n_rows; ++r) rows.emplace_back(ix.begin() + ip[size_t(r)], ix.begin() + ip[size_t(r) + 1]);
    }
    return SIEVE_OK;
  }

  // The K-compression cache of a layer, copied to the host: [pages, hkv, gate_dim + 1].
  std::vector<float> cache(int32_t layer, int64_t* pages) {
    sieve_kv_store_api const* a = api_;
    DLTensor t{};
    EXPECT_EQ(a->register_sidecar ? SIEVE_OK : SIEVE_ERR_UNSUPPORTED, SIEVE_OK);
    EXPECT_EQ(a->sidecar(kv_, layer, 0, &t), SIEVE_OK);
    *pages = t.shape[0];
    std::vector<float> h(size_t(numel(t)));
    copy_to_host(h.data(), data_ptr<void>(t), h.size() * 4);
    return h;
  }
  // Physical page of a sequence's logical page.
  int32_t physical_page(int32_t layer, int32_t seq_index, int32_t logical) {
    sieve_paged_kv view{};
    view.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
    const int32_t id = seqs_[size_t(seq_index)].id;
    EXPECT_EQ(api_->view(kv_, layer, &id, 1, &view), SIEVE_OK);
    int32_t p = -1;
    copy_to_host(&p, data_ptr<int32_t>(view.indices) + view.indptr_host[0] + logical, 4);
    return p;
  }

  sieve_selection selection{};
  std::vector<std::vector<int32_t>> rows;  // the last selection's rows, on the host
  const std::string& last_error() const { return last_error_; }

 private:
  sieve_status captured_select(const sieve_layer_call& call, sieve_selection& sel, uint32_t& stats) {
#if SIEVE_WITH_CUDA
    if (g_.device.device_type == kDLCUDA) {
      auto stream = static_cast<cudaStream_t>(services_.cuda_stream());
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
      if (e != cudaSuccess) {
        last_error_ = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
        return SIEVE_ERR_DEVICE;
      }
      const sieve_status st = policy_api_->select(policy_, &call, &sel, &stats);
      if (st != SIEVE_OK) last_error_ = policy_api_->last_error(policy_);
      e = cudaStreamEndCapture(stream, &graph);
      if (st == SIEVE_OK && e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
      if (st == SIEVE_OK && e == cudaSuccess) e = cudaGraphLaunch(exec, stream);
      if (exec) cudaGraphExecDestroy(exec);
      if (graph) cudaGraphDestroy(graph);
      if (st != SIEVE_OK) return st;
      if (e != cudaSuccess) {
        last_error_ = std::string("CUDA graph of select: ") + cudaGetErrorString(e);
        return SIEVE_ERR_DEVICE;
      }
      return SIEVE_OK;
    }
#endif
    last_error_ = "capture_select needs a CUDA session";
    return SIEVE_ERR_UNSUPPORTED;
  }

  sieve_status sync() {
#if SIEVE_WITH_CUDA
    if (g_.device.device_type == kDLCUDA) {
      std::string e;
      if (!services_.synchronize(&e)) {
        last_error_ = e;
        return SIEVE_ERR_DEVICE;
      }
    }
#endif
    return SIEVE_OK;
  }
  // Pages k, v of the store's view copied into view_layout on the session's device: the pool
  // (host copy and strides) and its device memory, alive for one call.
  struct Buffer;
  struct Relaid {
    std::unique_ptr<reference::LaidOutPool> pool;
    std::unique_ptr<Buffer> mem;
    DLTensor mem_t{};  // where the views point: the device memory (data and device only)
  };
  Relaid relay(const DLTensor& k, const DLTensor& v) {
    const std::vector<int64_t> shape(k.shape, k.shape + 4);
    HostTensor hk(shape, k.dtype), hv(shape, v.dtype);
    copy_to_host(hk.dl().data, data_ptr<void>(k), hk.nbytes());
    copy_to_host(hv.dl().data, data_ptr<void>(v), hv.nbytes());
    Relaid r;
    r.pool = std::make_unique<reference::LaidOutPool>(hk.dl(), hv.dl(), *view_layout);
    const auto* b = r.pool->storage.data<unsigned char>();
    r.mem = std::make_unique<Buffer>(g_.device, std::vector<unsigned char>(b, b + r.pool->storage.nbytes()));
    r.mem_t.data = r.mem->p;
    r.mem_t.device = g_.device;
    return r;
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) {
#if SIEVE_WITH_CUDA
    if (g_.device.device_type == kDLCUDA) {
      // The store uploads its view arrays (and the plugin writes its cache) on the session's
      // non-blocking stream, which a legacy-stream cudaMemcpy does not wait for.
      EXPECT_EQ(sync(), SIEVE_OK) << last_error_;
      cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
      return;
    }
#endif
    std::memcpy(dst, src, bytes);
  }
  struct Buffer {
    template <class T>
    Buffer(DLDevice d, const std::vector<T>& h) : dev(d), bytes(std::max<size_t>(h.size() * sizeof(T), 4)) {
#if SIEVE_WITH_CUDA
      if (dev.device_type == kDLCUDA) {
        cudaMalloc(&p, bytes);
        cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice);
        // From pageable memory cudaMemcpy may return before the DMA lands, and the plugin's
        // non-blocking stream does not wait for the legacy stream: wait here.
        cudaDeviceSynchronize();
        return;
      }
#endif
      host.resize(bytes);
      std::memcpy(host.data(), h.data(), h.size() * sizeof(T));
      p = host.data();
    }
    ~Buffer() {
#if SIEVE_WITH_CUDA
      if (dev.device_type == kDLCUDA) cudaFree(p);
#endif
    }
    template <class T>
    std::vector<T> read(size_t n) const {
      std::vector<T> out(n);
#if SIEVE_WITH_CUDA
      if (dev.device_type == kDLCUDA) {
        cudaMemcpy(out.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
        return out;
      }
#endif
      std::memcpy(out.data(), p, n * sizeof(T));
      return out;
    }
    DLDevice dev;
    size_t bytes;
    std::vector<unsigned char> host;
    void* p = nullptr;
  };

  sieve_geometry g_;
  runtime::HostServices services_;
  std::mt19937 rng_;
  const sieve_kv_store_api* api_ = nullptr;
  sieve_kv_store* kv_ = nullptr;
  PluginLibrary lib_{"seer"};
  const sieve_policy_api* policy_api_ = nullptr;
  sieve_policy* policy_ = nullptr;
  std::vector<sieve_param_value> values_;
  sieve_status create_status_ = SIEVE_ERR_INTERNAL;
  std::string create_error_, last_error_;
  std::vector<Seq> seqs_;
};

}  // namespace sieve::testing
