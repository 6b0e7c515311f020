// The host side of an ENGINE_PAGES store in the KV-store suite: a page pool the suite owns (HND,
// NHD or combined, as an engine keeps it), each sequence's pages taken from it in shuffled order,
// and the CSR page table bound before every call that reads it (bind_pages); the pages the store
// evicts come back through the release sink, those of a removed sequence the engine frees itself.
#pragma once

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "conformance_store_access.hpp"

namespace sieve::runtime::store_conform {

struct EngineLayout {
  uint32_t bit = SIEVE_KV_LAYOUT_HND;  // one sieve_kv_layout_bits value
  int32_t combined_hnd = 0;            // COMBINED: HND inside each half
  const char* name() const;            // "hnd", "nhd", "combined", "combined_hnd" (a store's `layout` value)
};

class EnginePool {
 public:
  EnginePool(HostServices& host, const Shape& shape, int32_t layers, EngineLayout layout);
  EnginePool(const EnginePool&) = delete;
  EnginePool& operator=(const EnginePool&) = delete;

  // Where the store sends the pages it evicts (kv_config.release).
  sieve_page_release_sink sink();
  // Pages of `seq` in `layer` grow to hold `tokens`; false when the pool has too few free pages.
  bool reserve(int32_t layer, int32_t seq, int32_t tokens);
  // Pages of `seq` in `layer` beyond its tokens go back to the pool (an append that was refused).
  void trim(int32_t layer, int32_t seq);
  // bind_pages of `layer` for `ids`, each at `tokens[b]` tokens (its pages reserved).
  sieve_status bind(const sieve_kv_store_api* api, sieve_kv_store* store, int32_t layer,
                    const std::vector<int32_t>& ids, const std::vector<int32_t>& tokens);
  // Tokens the engine holds for `seq` in `layer` (what it last bound after an append, less evictions).
  int32_t tokens(int32_t layer, int32_t seq) const;
  void set_tokens(int32_t layer, int32_t seq, int32_t tokens) { seqs_[{layer, seq}].tokens = tokens; }
  // A finished request: the engine frees its pages in every layer.
  void forget(int32_t seq);
  // Pages the store evicted that were not pages of that sequence, as one line each.
  const std::vector<std::string>& release_problems() const { return problems_; }

 private:
  struct Seq {
    std::vector<int32_t> pages;
    int32_t tokens = 0;
  };
  struct Layer {
    std::unique_ptr<DeviceBuffer> k, v;  // v empty for COMBINED
    std::vector<int32_t> free;           // shuffled
    std::unique_ptr<DeviceBuffer> indptr, indices, last;
    std::vector<int32_t> indptr_h, indices_h, last_h;
  };
  static void release(void* ctx, int32_t layer, int32_t seq, const int32_t* pages, int32_t n);

  HostServices& host_;
  Shape shape_;
  EngineLayout layout_;
  std::vector<Layer> layers_;
  std::map<std::pair<int32_t, int32_t>, Seq> seqs_;  // (layer, seq)
  std::vector<std::string> problems_;
  int64_t pool_shape_[5]{};
  int64_t indptr_shape_[1]{}, indices_shape_[1]{}, last_shape_[1]{};
};

}  // namespace sieve::runtime::store_conform
