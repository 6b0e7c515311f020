// Runs one chain through the layer runner over a store and records what it did: a prefill of
// ragged prompts, then decode steps, every layer, end_step after each step (where evicting
// policies evict). Over the core's paged store the tokens go in by append; over the engine-pool
// store an EngineSim keeps them in its own pool (shuffled pages) and binds its table before each
// layer call. The same seeds give both runs the same q/k/v, so the two records must agree.
#pragma once
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_sim.hpp"
#include "sieve/kv/engine_pool.hpp"
#include "sieve/kv/paged_store.hpp"
#include "sieve/policy.h"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/layer_runner.hpp"

namespace sieve::engine_test {

struct Workload {
  int32_t layers = 2, n_q_heads = 8, n_kv_heads = 2, head_dim = 64, page = 16;
  std::vector<int32_t> prompts = {300, 77, 150};
  int32_t decode_steps = 6;
  DLDataType dtype = kF32;
  uint32_t seed = 11;
};

// What a run did, call by call (prefill, then each decode step) and layer by layer.
struct Record {
  std::vector<std::vector<unsigned char>> outputs;  // raw output bytes
  std::vector<runtime::SelectionSnapshot> selections;
  std::vector<std::vector<int32_t>> seq_lens;       // after each step's end_step, layer 0
  std::vector<uint64_t> kv_bytes;                   // after each step's end_step
  int64_t released = 0;                             // pages the engine got back
  int64_t bad_releases = 0;                         // of pages the sequence did not hold
};

struct StoreChoice {
  bool engine = false;
  EngineShape shape;            // engine only: layout, num_pages (the rest from the workload)
  int64_t layout_choice = 0;    // engine only: index of the `layout` parameter
  bool engine_writes = true;    // engine only: new_tokens_written
};

inline sieve_geometry geometry_of(const Workload& w, DLDevice device) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = w.layers;
  g.n_q_heads = w.n_q_heads;
  g.n_kv_heads = w.n_kv_heads;
  g.head_dim = w.head_dim;
  g.page_size = w.page;
  g.max_batch = int32_t(w.prompts.size());
  g.max_seq_len = 1024;
  g.kv_dtype = w.dtype;
  g.device = device;
  g.rope_theta = 10000.f;
  g.rope_dim = w.head_dim;
  return g;
}

// Runs `chains` (resolved for geometry_of(w, device)) over the chosen store; false with the
// reason in *error when something refused.
inline bool run_chain_record(const Workload& w, DLDevice device, const runtime::ResolvedChains& chains,
                             const StoreChoice& choice, Record* rec, std::string* error) {
  runtime::HostServices services(device);
  const sieve_geometry g = geometry_of(w, device);
  const int32_t B = int32_t(w.prompts.size());
  int32_t pages = 0;
  for (int32_t p : w.prompts) pages += (p + w.decode_steps + w.page - 1) / w.page + 1;
  std::unique_ptr<EngineSim> engine;
  EngineShape sh = choice.shape;
  if (choice.engine) {
    sh.layers = w.layers, sh.hkv = w.n_kv_heads, sh.head_dim = w.head_dim, sh.page = w.page, sh.dtype = w.dtype;
    sh.num_pages = pages;
    engine = std::make_unique<EngineSim>(services, sh);
  }
  const sieve_kv_store_api* api = choice.engine ? kv::engine_pool_store_api()
                                  : device.device_type == kDLCUDA ? kv::paged_cuda_store_api()
                                                                  : kv::paged_cpu_store_api();
  sieve_kv_config kc{};
  kc.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
  kc.geometry = g;
  kc.pages_per_layer = pages;
  kc.keep_pre_rope_k = (chains.needs & SIEVE_NEEDS_PRE_ROPE_K) ? 1 : 0;
  sieve_param_value layout{};
  layout.type = SIEVE_PARAM_ENUM;
  layout.i = choice.layout_choice;
  if (choice.engine) {
    kc.params = &layout;
    kc.n_params = 1;
    kc.release = engine->sink();
  }
  sieve_kv_store* store = nullptr;
  std::string reason;
  if (api->create(services.table(), &kc, &store, {&reason, [](void* c, const char* m) { *static_cast<std::string*>(c) = m; }}) !=
      SIEVE_OK)
    return *error = "create: " + reason, false;
  std::unique_ptr<sieve_kv_store, void (*)(sieve_kv_store*)> owned(store, api->destroy);
  std::vector<int32_t> ids(static_cast<size_t>(B));
  for (auto& id : ids) api->add_sequence(store, &id);

  runtime::LayerRunner::Options opt;
  opt.record_selections = true;
  runtime::LayerRunner runner(services, g, store, api, chains, opt);
  std::mt19937 rng(w.seed);
  std::normal_distribution<float> nd;
  std::vector<int32_t> position(size_t(B), 0);
  const bool pre_q = chains.needs & SIEVE_NEEDS_PRE_ROPE_Q;
  for (int32_t step = 0; step <= w.decode_steps; ++step) {
    const uint32_t phase = step == 0 ? SIEVE_PHASE_PREFILL : SIEVE_PHASE_DECODE;
    std::vector<int32_t> n_new(size_t(B), 1), qo(1, 0), positions;
    if (step == 0) n_new = w.prompts;
    for (int32_t b = 0; b < B; ++b) {
      qo.push_back(qo.back() + n_new[size_t(b)]);
      for (int32_t i = 0; i < n_new[size_t(b)]; ++i) positions.push_back(position[size_t(b)] + i);
    }
    const int32_t total = qo.back();
    for (int32_t layer = 0; layer < w.layers; ++layer) {
      HostTensor q({total, w.n_q_heads, w.head_dim}, w.dtype), k({total, w.n_kv_heads, w.head_dim}, w.dtype),
          v({total, w.n_kv_heads, w.head_dim}, w.dtype), qo_t({B + 1}, kI32),
          out({total, w.n_q_heads, w.head_dim}, w.dtype);
      for (HostTensor* t : {&q, &k, &v})
        for (int64_t i = 0; i < t->numel(); ++i) t->set(i, nd(rng));
      std::memcpy(qo_t.data<int32_t>(), qo.data(), qo.size() * 4);
      DeviceBytes dq(services, q.nbytes()), dk(services, k.nbytes()), dv(services, v.nbytes()),
          dqo(services, qo_t.nbytes()), dout(services, out.nbytes());
      dq.upload(q.dl().data, q.nbytes());
      dk.upload(k.dl().data, k.nbytes());
      dv.upload(v.dl().data, v.nbytes());
      dqo.upload(qo_t.dl().data, qo_t.nbytes());
      auto on_device = [&](HostTensor& h, DeviceBytes& d) {
        DLTensor t = h.dl();
        t.data = d.get();
        t.device = device;
        return t;
      };
      DLTensor tq = on_device(q, dq), tk = on_device(k, dk), tv = on_device(v, dv), tqo = on_device(qo_t, dqo),
               tout = on_device(out, dout);
      if (engine) {
        const sieve_kv_pages& p = engine->step(layer, ids, n_new, choice.engine_writes ? &k : nullptr,
                                                   choice.engine_writes ? &v : nullptr);
        if (api->bind_pages(store, &p) != SIEVE_OK) return *error = std::string("bind_pages: ") + api->last_error(store), false;
      }
      runtime::LayerInputs in;
      in.layer = layer;
      in.phase = phase;
      in.step = uint64_t(step);
      in.batch = B;
      in.seq_ids = ids.data();
      in.qo_indptr_host = qo.data();
      in.qo_indptr = &tqo;
      in.positions_host = positions.data();
      in.q = &tq;
      in.q_pre_rope = pre_q ? &tq : nullptr;  // synthetic: no rotation applied
      in.k = &tk;
      in.v = &tv;
      in.k_pre_rope = kc.keep_pre_rope_k ? &tk : nullptr;
      if (runner.run_layer(in, &tout, error) != SIEVE_OK) return false;
      if (!services.synchronize(error)) return false;
      rec->outputs.emplace_back(out.nbytes());
      dout.download(rec->outputs.back().data(), out.nbytes());
      rec->selections.push_back(runner.selection_used(layer));
    }
    if (runner.end_step(phase, uint64_t(step), ids.data(), B, error) != SIEVE_OK) return false;
    if (!services.synchronize(error)) return false;
    for (int32_t b = 0; b < B; ++b) position[size_t(b)] += n_new[size_t(b)];
    std::vector<int32_t> lens(static_cast<size_t>(B));
    for (int32_t b = 0; b < B; ++b) api->seq_len(store, 0, ids[size_t(b)], &lens[size_t(b)]);
    rec->seq_lens.push_back(lens);
    uint64_t bytes = 0;
    api->bytes_in_use(store, &bytes);
    rec->kv_bytes.push_back(bytes);
  }
  rec->released = engine ? engine->released() : 0;
  rec->bad_releases = engine ? engine->bad_releases() : 0;
  return true;
}

}  // namespace sieve::engine_test
