// What an inference engine does with a KV cache it owns (vLLM, SGLang), for the hosts that have
// none — sieve_bench's `--kv-store engine_pool(...)`, the engine-pool tests: one pool per layer in
// the engine's layout (HND, NHD, or one combined [pages, 2, ...] K/V tensor), pages handed out
// from a shuffled free list (so physical order never matches token order), per-sequence page
// lists, FlashInfer CSR tables built per call (device arrays plus host mirrors), and the release
// sink the engine_pool store hands evicted pages to. Memory through the host services (CPU or
// CUDA). Not a hot-path object: tables are rebuilt and uploaded (blocking) per call.
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "sieve/kv_store.h"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/params.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::runtime {

// Memory from the host services on their device, freed with the object.
class DeviceBytes {
 public:
  DeviceBytes(HostServices& s, size_t bytes);
  ~DeviceBytes();
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* get() const { return p_; }
  void upload(const void* src, size_t n);    // blocking
  void download(void* dst, size_t n) const;  // blocking

 private:
  HostServices* s_;
  void* p_ = nullptr;
};

class EnginePages {
 public:
  struct Shape {
    int32_t layers = 1, hkv = 2, head_dim = 64, page = 16, num_pages = 64;
    DLDataType dtype = kF32;
    uint32_t layout = SIEVE_KV_LAYOUT_HND;  // one sieve_kv_layout_bits value
    int32_t combined_hnd = 0;
    uint32_t seed = 7;  // the free list's shuffle
    // The pool an instance of ENGINE_PAGES store `store` made with `values` reads, for geometry
    // `g` and `num_pages` pages per layer: the layout its `layout` parameter names
    // (store_layouts_in_use, session.hpp), HND when it has none.
    static Shape for_store(const sieve_geometry& g, int32_t num_pages, const StoreEntry& store,
                           const ParamValues& values);
  };
  EnginePages(HostServices& services, const Shape& shape);
  EnginePages(const EnginePages&) = delete;
  EnginePages& operator=(const EnginePages&) = delete;

  const Shape& shape() const { return sh_; }
  // The sink to register (kv_config.release / session options): evicted pages leave the
  // sequence's list and go back to the free list.
  sieve_page_release_sink sink();
  int64_t released() const { return released_; }
  // Releases of a page the sequence did not hold (a store bug; 0 expected).
  int64_t bad_releases() const { return bad_releases_; }
  // The sequence is finished: its pages go back to the free list.
  void forget(int32_t seq);

  // The engine's side of one layer call: each sequence's table grows by n_new[b] tokens (pages
  // from the free list; SIEVE_ERR_CAPACITY when it is empty). When k and v are given (host
  // [sum n_new, hkv, head_dim] rows in batch order) the engine writes them into its pool itself
  // (new_tokens_written = 1), else the store is to write them (0). Returns the pages to bind,
  // valid until the next call for the layer.
  const sieve_kv_pages& step(int32_t layer, const std::vector<int32_t>& seq_ids, const std::vector<int32_t>& n_new,
                             const HostTensor* k = nullptr, const HostTensor* v = nullptr);
  // The table as it stands (no new tokens), e.g. after an eviction.
  const sieve_kv_pages& table(int32_t layer, const std::vector<int32_t>& seq_ids);

  // Row (seq's token t, KV head h) of K (kv 0) or V (kv 1), read back from the pool.
  std::vector<float> row(int32_t layer, int kv, int32_t seq, int32_t t, int32_t h) const;
  const std::vector<int32_t>& pages_of(int32_t layer, int32_t seq) { return layers_[size_t(layer)].seqs[seq].pages; }

 private:
  struct Seq {
    std::vector<int32_t> pages;
    int32_t tokens = 0;
  };
  struct Layer {
    std::unique_ptr<DeviceBytes> k, v;  // v null: combined
    std::vector<int32_t> free;
    std::map<int32_t, Seq> seqs;
    std::vector<int32_t> indptr, indices, last, seq_ids;
    std::unique_ptr<DeviceBytes> d_indptr, d_indices, d_last;
    std::array<int64_t, 1> indptr_shape{}, indices_shape{}, last_shape{};
    sieve_kv_pages pages{};
  };
  size_t elem() const { return dtype_bytes(sh_.dtype); }
  // Element offset of (page, kv, head, slot) in the buffer that holds it.
  int64_t offset(int32_t page, int kv, int32_t h, int32_t slot) const;
  DeviceBytes& buffer(int32_t layer, int kv) const;
  const sieve_kv_pages& bind(int32_t layer, const std::vector<int32_t>& seq_ids, bool written);

  HostServices& s_;
  Shape sh_;
  std::mt19937 rng_;
  std::vector<Layer> layers_;
  std::vector<int64_t> pool_shape_;
  int64_t released_ = 0, bad_releases_ = 0;
};

}  // namespace sieve::runtime
