// The KV-store suite's hands on one store on one device: it makes instances of the table, feeds
// them tokens and keeps the f64 reference of what they hold, reads views back, and for an
// ENGINE_PAGES store plays the engine (conformance_store_engine.hpp). The checks themselves are in
// conformance_store.cpp; every helper here fails the running check by throwing CheckFailed.
#pragma once

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "conformance_store_access.hpp"
#include "conformance_store_engine.hpp"
#include "sieve/runtime/conformance.hpp"
#include "sieve/runtime/params.hpp"

namespace sieve::runtime::store_conform {

// What a store says it is: its descriptor, or for a 1.0 table (no descriptor) the features its
// non-NULL functions imply, HND pages, every dtype tried and the devices its lister names.
struct Traits {
  uint32_t devices = 0, dtypes = 0, layouts = SIEVE_KV_LAYOUT_HND, features = 0;
  std::vector<int32_t> page_sizes;  // empty: any
  bool declared = false;            // a 1.1 descriptor said so
};
Traits traits_of(const StoreUnderTest& store);

const char* device_word(uint32_t device_bit);  // "cpu", "cuda"
DLDataType dtype_of(uint32_t dtype_bit);

// What every store is made with: 2 layers, 4 query heads over 2 KV heads of dim 16, page 16 (or
// the first listed), f32 (or the first declared dtype), on `device_bit`.
sieve_geometry suite_geometry(const Traits& traits, uint32_t device_bit);

// One store instance, destroyed with the object.
class Instance {
 public:
  Instance(const sieve_kv_store_api* api, HostServices& host, const sieve_kv_config& config);
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  std::string last_error() const;

  sieve_status status = SIEVE_ERR_INTERNAL;
  std::string reason;  // what create() said when it refused
  sieve_kv_store* s = nullptr;

 private:
  const sieve_kv_store_api* api_;
};

// A check's failure: thrown by the helpers, caught once per check.
struct CheckFailed {
  std::string why;
};
[[noreturn]] void failed(const std::string& why);

class StoreDriver {
 public:
  StoreDriver(const sieve_kv_store_api* api, const Traits& traits, uint32_t device_bit, HostServices& host);

 protected:
  bool engine() const;    // ENGINE_PAGES: the suite owns the pool and binds the tables
  bool pre_rope() const;  // PRE_ROPE_K: every store is made keeping pre-RoPE keys
  sieve_kv_config config(DLDataType dtype, int32_t capacity);
  void set_params();
  Shape shape(DLDataType dtype, int32_t capacity) const;
  // A store of `capacity` pages per layer (with a fresh engine pool for ENGINE_PAGES), or fails.
  std::unique_ptr<Instance> make(DLDataType dtype, int32_t capacity);
  std::vector<int32_t> add(Instance& in, int n);
  sieve_status append(Instance& in, int32_t layer, const std::vector<int32_t>& ids, const std::vector<int32_t>& counts);
  void append_ok(Instance& in, int32_t layer, const std::vector<int32_t>& ids, const std::vector<int32_t>& counts);
  // The store's calls, the layer's table bound first for an ENGINE_PAGES store.
  sieve_status bind(Instance& in, int32_t layer, const std::vector<int32_t>& ids);
  sieve_status do_view(Instance& in, int32_t layer, const std::vector<int32_t>& ids, sieve_paged_kv* out);
  sieve_status do_evict(Instance& in, int32_t layer, int32_t seq, const int32_t* pages, int32_t n, uint64_t* freed);
  sieve_status do_remove(Instance& in, int32_t seq);
  void drop_page(RefRows& r, int32_t p);
  int32_t resident(int32_t layer, int32_t id);
  ViewCopy view(Instance& in, int32_t layer, const std::vector<int32_t>& ids, const Shape& sh, bool content,
                const std::string& when);
  uint64_t bytes(Instance& in);
  std::vector<float> read_sidecar(const DLTensor& t);
  void write_sidecar(const DLTensor& t, const std::vector<float>& values);
  DLTensor sidecar(Instance& in, int32_t layer, int32_t slot, int32_t elems, int32_t capacity);

  const sieve_kv_store_api* api_;
  Traits traits_;
  uint32_t device_;
  HostServices* host_;
  sieve_geometry geometry_{};
  int32_t page_ = 16;
  DLDataType dtype_{};
  sieve_geometry full_{};                // what the last config's geometry_ref points at
  ParamValues params_;
  EngineLayout layout_;                  // ENGINE_PAGES: the pool layout of the next store made
  std::unique_ptr<EnginePool> engine_;   // ENGINE_PAGES: the suite's pool and tables
  Reference ref_;
  std::mt19937 rng_{20261127};
};

}  // namespace sieve::runtime::store_conform
