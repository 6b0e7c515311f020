// One model's attention state: for a geometry, resolved chains and a store choice, the KV store
// (created, or borrowed from the host), the chains' policy instances and the LayerRunner that
// drives them. Every host of the runtime sets up attention through it: the C host API
// (sieve_session), `sieve attn` / conformance (synthetic.cpp), the model engine, the policy
// benchmark and the delta diagnostics.
//
// The store is, in order: the host's table (Options::store_api, with or without an instance it
// created), else the store the chains resolved (their spec's kv_store element, else the core's
// "paged"). Before anything is created, every policy is checked against what the store offers
// (its descriptor): SIDECARS for a policy that needs sidecars, EVICTION for one that evicts,
// PRE_ROPE_K for one that needs pre-RoPE keys, and the store's view layouts among those the
// policy reads (kv_layouts; 0 = compact HND only). A mismatch is refused with one line per
// problem naming the policy, the store and the missing feature. An ENGINE_PAGES store is taken
// only by a caller that binds pages (Options::binds_pages: the host API, the policy benchmark).
//
// Lifetimes: the session owns what it creates and destroys it in this order: the policy
// instances (they registered sidecars in the store), then the store (unless borrowed: the host
// destroys it after the session), then its references to the plugins' libraries. The
// HostServices it runs on is the caller's and must outlive it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sieve/kv_store.h"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/layer_runner.hpp"

namespace sieve::runtime {

class Session {
 public:
  struct Options {
    // Page pool of each layer; 0: max_batch x ceil(max_seq_len / page_size).
    int32_t pages_per_layer = 0;
    LayerRunner::Options runner;
    // A store table the host brings (host API 1.1) instead of the chains' store. With
    // store_instance the session borrows that instance (it must match the geometry); without,
    // it creates one from the table and destroys it.
    const sieve_kv_store_api* store_api = nullptr;
    sieve_kv_store* store_instance = nullptr;
    sieve_page_release_sink release{};  // ENGINE_PAGES stores: where evicted pages go
    // The caller binds its own page pool and tables before every layer call (bind_pages). An
    // ENGINE_PAGES store has no pages without them, so it is refused, naming it, when this is off.
    bool binds_pages = false;
  };

  // Throws sieve::Error with one line (several problems: "; "-separated) when the store cannot be
  // chosen or created, a policy does not fit it, or a policy instance cannot be created.
  Session(HostServices& services, const sieve_geometry& geometry, ResolvedChains chains, Options options);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  LayerRunner& runner() { return *runner_; }
  const LayerRunner& runner() const { return *runner_; }
  const ResolvedChains& chains() const { return runner_->chains(); }
  uint32_t needs() const { return runner_->chains().needs; }  // OR of the policies' needs bits
  HostServices& services() const { return services_; }
  const sieve_geometry& geometry() const { return geometry_; }
  const sieve_kv_config& store_config() const { return config_; }

  // The store: its table and instance, and its entry (name, descriptor, source).
  sieve_kv_store* store() const { return kv_; }
  const sieve_kv_store_api* store_api() const { return store_.api; }
  const StoreEntry& store_entry() const { return store_; }
  bool store_borrowed() const { return !owns_kv_; }

  // The store's calls, each throwing sieve::Error with one line naming the store on failure.
  int32_t add_sequence();
  void remove_sequence(int32_t seq_id);
  int32_t seq_len(int32_t layer, int32_t seq_id) const;
  uint64_t bytes_in_use() const;
  sieve_paged_kv view(int32_t layer, const int32_t* seq_ids, int32_t batch);
  // ENGINE_PAGES stores: the host's pages of one layer for the next call (SIEVE_ERR_UNSUPPORTED
  // when the store has no bind_pages).
  void bind_pages(const sieve_kv_pages& pages);

 private:
  [[noreturn]] void store_failed(sieve_status st, const char* call) const;

  HostServices& services_;
  sieve_geometry geometry_{};
  std::vector<LoadedPlugin> plugins_;  // every plugin involved: released after the store
  StoreEntry store_;
  ParamValues store_params_;
  sieve_kv_config config_{};
  sieve_kv_store* kv_ = nullptr;
  bool owns_kv_ = true;
  std::unique_ptr<LayerRunner> runner_;  // the policy instances: destroyed first
};

// Every way `chains` does not fit a store described by `store` (one line each, empty: fits).
std::vector<std::string> store_fit_problems(const ResolvedChains& chains, const StoreEntry& store,
                                            const ParamValues& store_values = {});
// The layouts an instance of `store` made with `values` hands out: a store that can hand out
// several names the one an instance uses with an enum parameter `layout` (hnd | nhd | combined |
// combined_hnd, as engine_pool does); otherwise every layout its descriptor declares.
uint32_t store_layouts_in_use(const StoreEntry& store, const ParamValues& values);

}  // namespace sieve::runtime
