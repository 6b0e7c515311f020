// The C table of a core store (the paged stores, the engine-pool store): every entry catches, so
// nothing throws across the ABI. `Base` is the store's bookkeeping class, whose methods the
// entries call.
#pragma once
#include <new>

#include "sieve/kv/paged_store_base.hpp"
#include "sieve/util/abi_v1_0.hpp"
#include "sieve/util/error.hpp"

namespace sieve::kv {

namespace detail {
template <class Base>
Base* self(sieve_kv_store* s) { return reinterpret_cast<Base*>(s); }
template <class Base>
const Base* self(const sieve_kv_store* s) { return reinterpret_cast<const Base*>(s); }
template <class Base, class F>
sieve_status guarded(Base* s, F&& f) noexcept {
  if (!s) return SIEVE_ERR_INVALID_ARGUMENT;
  try {
    f();
    return SIEVE_OK;
  } catch (const Error& e) {
    s->set_last_error(e.what());
    return e.status();
  } catch (const std::bad_alloc&) {
    s->set_last_error("out of host memory");
    return SIEVE_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    s->set_last_error(e.what());
    return SIEVE_ERR_INTERNAL;
  } catch (...) {
    s->set_last_error("unknown internal error");
    return SIEVE_ERR_INTERNAL;
  }
}
inline void report(sieve_reason_sink sink, const char* msg) {
  if (sink.reason) sink.reason(sink.ctx, msg);
}
}  // namespace detail

// A store's instance made from a config (`Make` returns a `Base*` it allocated with new).
template <class Base>
using StoreFactory = Base* (*)(const sieve_host_services*, const sieve_kv_config&);

// Every entry of the table but the 1.1 descriptor, schema and validate, which the caller sets.
template <class Base, StoreFactory<Base> Make>
sieve_kv_store_api store_table(const char* name) {
  using namespace detail;
  sieve_kv_store_api t{};
  t.hdr = {uint32_t(sizeof(sieve_kv_store_api)), SIEVE_ABI_MINOR};
  t.name = name;
  t.create = [](const sieve_host_services* services, const sieve_kv_config* config, sieve_kv_store** out,
                sieve_reason_sink err) noexcept -> sieve_status {
    if (!out) return report(err, "create: out is null"), SIEVE_ERR_INVALID_ARGUMENT;
    *out = nullptr;
    if (!config || config->hdr.struct_size < util::v1_0_size<sieve_kv_config>())
      return report(err, "create: config is null or older than this store's v1.0 layout"), SIEVE_ERR_VERSION;
    try {
      *out = reinterpret_cast<sieve_kv_store*>(Make(services, *config));
      return SIEVE_OK;
    } catch (const Error& e) {
      report(err, e.what());
      return e.status();
    } catch (const std::bad_alloc&) {
      report(err, "out of memory while creating the store");
      return SIEVE_ERR_OUT_OF_MEMORY;
    } catch (const std::exception& e) {
      report(err, e.what());
      return SIEVE_ERR_INTERNAL;
    }
  };
  t.destroy = [](sieve_kv_store* s) noexcept { delete self<Base>(s); };
  t.last_error = [](const sieve_kv_store* s) noexcept -> const char* {
    return s ? self<Base>(s)->last_error().c_str() : "null store";
  };
  t.add_sequence = [](sieve_kv_store* s, int32_t* id) noexcept {
    return guarded(self<Base>(s), [&] {
      require(id != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "add_sequence: seq_id is null");
      *id = self<Base>(s)->add_sequence();
    });
  };
  t.remove_sequence = [](sieve_kv_store* s, int32_t id) noexcept {
    return guarded(self<Base>(s), [&] { self<Base>(s)->remove_sequence(id); });
  };
  t.seq_len = [](const sieve_kv_store* s, int32_t layer, int32_t id, int32_t* len) noexcept {
    auto* m = const_cast<Base*>(self<Base>(s));
    return guarded(m, [&] {
      require(len != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "seq_len: len is null");
      *len = m->seq_len(layer, id);
    });
  };
  t.append = [](sieve_kv_store* s, const sieve_kv_append* a) noexcept {
    return guarded(self<Base>(s), [&] {
      require(a != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "append: null argument");
      self<Base>(s)->append(*a);
    });
  };
  t.view = [](sieve_kv_store* s, int32_t layer, const int32_t* ids, int32_t batch, sieve_paged_kv* out) noexcept {
    return guarded(self<Base>(s), [&] { self<Base>(s)->view(layer, ids, batch, out); });
  };
  t.register_sidecar = [](sieve_kv_store* s, const sieve_sidecar_desc* d, int32_t* slot) noexcept {
    return guarded(self<Base>(s), [&] {
      require(d != nullptr && slot != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "register_sidecar: null argument");
      *slot = self<Base>(s)->register_sidecar(*d);
    });
  };
  t.sidecar = [](sieve_kv_store* s, int32_t layer, int32_t slot, DLTensor* out) noexcept {
    return guarded(self<Base>(s), [&] {
      require(out != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "sidecar: out is null");
      self<Base>(s)->sidecar(layer, slot, out);
    });
  };
  t.evict = [](sieve_kv_store* s, int32_t layer, int32_t id, const int32_t* pages, int32_t n,
               uint64_t* freed) noexcept {
    return guarded(self<Base>(s), [&] {
      uint64_t f = self<Base>(s)->evict(layer, id, pages, n);
      if (freed) *freed = f;
    });
  };
  t.bytes_in_use = [](const sieve_kv_store* s, uint64_t* bytes) noexcept {
    auto* m = const_cast<Base*>(self<Base>(s));
    return guarded(m, [&] {
      require(bytes != nullptr, SIEVE_ERR_INVALID_ARGUMENT, "bytes_in_use: bytes is null");
      *bytes = m->bytes_in_use();
    });
  };
  return t;
}

template <class S>
PagedStoreBase* make_paged(const sieve_host_services* services, const sieve_kv_config& config) {
  return new S(services, config);
}

template <class S>
const sieve_kv_store_api* make_store_api(const char* name) {
  static const sieve_kv_store_api api = store_table<PagedStoreBase, &make_paged<S>>(name);
  return &api;
}

}  // namespace sieve::kv
