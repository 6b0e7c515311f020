// What the paged-store tests share (CPU store here, CUDA store in tests/cuda): the store
// configuration, an owning handle on a store made through its C table, random token rows and
// append records.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "sieve/kv/paged_store.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kv_test {

// A store of `pages` pages per layer, each `page` tokens of `hkv` KV heads x `d`; two query heads
// per KV head; one sequence may fill the whole pool.
inline sieve_kv_config make_config(int layers, int hkv, int d, int page, DLDataType dt, int pages,
                                   DLDevice device, int max_batch, int keep_pre_rope_k = 0) {
  sieve_kv_config c{};
  c.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
  c.geometry.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  c.geometry.n_layers = layers;
  c.geometry.n_q_heads = hkv * 2;
  c.geometry.n_kv_heads = hkv;
  c.geometry.head_dim = d;
  c.geometry.page_size = page;
  c.geometry.max_batch = max_batch;
  c.geometry.max_seq_len = pages * page;
  c.geometry.kv_dtype = dt;
  c.geometry.device = device;
  c.pages_per_layer = pages;
  c.keep_pre_rope_k = keep_pre_rope_k;
  return c;
}

// A reason sink that keeps the last message in *msg.
inline sieve_reason_sink keep_last_reason(std::string* msg) {
  return {msg, [](void* ctx, const char* m) { *static_cast<std::string*>(ctx) = m; }};
}

// A store made through `table` (create's failure is a test failure, with the reason), destroyed
// with the handle.
struct Store {
  const sieve_kv_store_api* api;
  sieve_kv_store* s = nullptr;
  std::string err;  // create's reason
  Store(const sieve_kv_store_api* table, const sieve_host_services* services,
        const sieve_kv_config& c)
      : api(table) {
    EXPECT_EQ(api->create(services, &c, &s, keep_last_reason(&err)), SIEVE_OK) << err;
  }
  // The CPU store, which needs no host services.
  explicit Store(const sieve_kv_config& c) : Store(kv::paged_cpu_store_api(), nullptr, c) {}
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store() {
    if (s) api->destroy(s);
  }
  int32_t add() {
    int32_t id = -1;
    EXPECT_EQ(api->add_sequence(s, &id), SIEVE_OK);
    return id;
  }
  uint64_t bytes() {
    uint64_t b = 0;
    EXPECT_EQ(api->bytes_in_use(s, &b), SIEVE_OK);
    return b;
  }
  const char* error() const { return api->last_error(s); }
};

// [n, hkv, d] standard-normal token rows in dtype `dt` (rounded from f32), seeded.
inline HostTensor random_tokens(int64_t n, int hkv, int d, DLDataType dt, uint32_t seed) {
  HostTensor t({n, hkv, d}, dt);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, nd(g));
  return t;
}

// An append of the rows of k / v (and k_pre_rope) to sequences `ids`, split by `indptr`.
inline sieve_kv_append make_append(int layer, std::vector<int32_t>& ids,
                                   std::vector<int32_t>& indptr, const DLTensor* k,
                                   const DLTensor* v, const DLTensor* k_pre_rope = nullptr) {
  sieve_kv_append a{};
  a.hdr = SIEVE_HEADER_INIT(sieve_kv_append);
  a.layer = layer;
  a.batch = int32_t(ids.size());
  a.seq_ids = ids.data();
  a.token_indptr = indptr.data();
  a.k = k;
  a.v = v;
  a.k_pre_rope = k_pre_rope;
  return a;
}

}  // namespace sieve::kv_test
