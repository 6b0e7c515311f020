// MockKvStore: a sieve_kv_store_api table in front of a gmock object, so a test can expect or
// forbid store calls a policy makes (a policy that must not evict, one that must register a
// sidecar once in create ...). delegate_to(fake) makes every call default to a FakePagedKv, the
// "delegating to a fake" idiom of gmock:
//
//   sieve::testing::FakePagedKv fake(config);
//   ::testing::NiceMock<sieve::testing::MockKvStore> store;
//   store.delegate_to(fake);
//   EXPECT_CALL(store, evict).Times(0);
//   api->create(host.table(), &geometry, values, n, store.handle(), store.api(), &policy, err);
//
// The table's create refuses (the test constructs the object); destroy does nothing.
#pragma once
#include <gmock/gmock.h>
#include <sieve/sieve.h>

#include <string>

#include "mocks/fake_paged_kv.hpp"

namespace sieve::testing {

class MockKvStore {
 public:
  MockKvStore() {
    api_.hdr = SIEVE_HEADER_INIT(sieve_kv_store_api);
    api_.name = "mock";
    api_.create = &create_cb;
    api_.destroy = [](sieve_kv_store*) {};
    api_.last_error = [](const sieve_kv_store* s) { return self(s)->last_error_text().c_str(); };
    api_.add_sequence = [](sieve_kv_store* s, int32_t* id) { return self(s)->add_sequence(id); };
    api_.remove_sequence = [](sieve_kv_store* s, int32_t id) { return self(s)->remove_sequence(id); };
    api_.seq_len = [](const sieve_kv_store* s, int32_t layer, int32_t id, int32_t* len) {
      return self(s)->seq_len(layer, id, len);
    };
    api_.append = [](sieve_kv_store* s, const sieve_kv_append* a) { return self(s)->append(a); };
    api_.view = [](sieve_kv_store* s, int32_t layer, const int32_t* ids, int32_t batch,
                   sieve_paged_kv* out) { return self(s)->view(layer, ids, batch, out); };
    api_.register_sidecar = [](sieve_kv_store* s, const sieve_sidecar_desc* d, int32_t* slot) {
      return self(s)->register_sidecar(d, slot);
    };
    api_.sidecar = [](sieve_kv_store* s, int32_t layer, int32_t slot, DLTensor* out) {
      return self(s)->sidecar(layer, slot, out);
    };
    api_.evict = [](sieve_kv_store* s, int32_t layer, int32_t id, const int32_t* pages, int32_t n,
                    uint64_t* freed) { return self(s)->evict(layer, id, pages, n, freed); };
    api_.bytes_in_use = [](const sieve_kv_store* s, uint64_t* bytes) {
      return self(s)->bytes_in_use(bytes);
    };
  }
  MockKvStore(const MockKvStore&) = delete;
  MockKvStore& operator=(const MockKvStore&) = delete;

  MOCK_METHOD(sieve_status, add_sequence, (int32_t * seq_id));
  MOCK_METHOD(sieve_status, remove_sequence, (int32_t seq_id));
  MOCK_METHOD(sieve_status, seq_len, (int32_t layer, int32_t seq_id, int32_t* len));
  MOCK_METHOD(sieve_status, append, (const sieve_kv_append* a));
  MOCK_METHOD(sieve_status, view,
              (int32_t layer, const int32_t* seq_ids, int32_t batch, sieve_paged_kv* out));
  MOCK_METHOD(sieve_status, register_sidecar, (const sieve_sidecar_desc* desc, int32_t* slot));
  MOCK_METHOD(sieve_status, sidecar, (int32_t layer, int32_t slot, DLTensor* out));
  MOCK_METHOD(sieve_status, evict,
              (int32_t layer, int32_t seq_id, const int32_t* logical_pages, int32_t n,
               uint64_t* freed_bytes));
  MOCK_METHOD(sieve_status, bytes_in_use, (uint64_t * bytes));

  // Default every call to `fake` (which must outlive this object); last_error reads the fake's.
  void delegate_to(FakePagedKv& fake) {
    using ::testing::_;
    fake_ = &fake;
    ON_CALL(*this, add_sequence(_)).WillByDefault([&fake](int32_t* id) { return fake.add_sequence(id); });
    ON_CALL(*this, remove_sequence(_)).WillByDefault([&fake](int32_t id) { return fake.remove_sequence(id); });
    ON_CALL(*this, seq_len(_, _, _)).WillByDefault([&fake](int32_t l, int32_t id, int32_t* n) {
      return fake.seq_len(l, id, n);
    });
    ON_CALL(*this, append(_)).WillByDefault([&fake](const sieve_kv_append* a) { return fake.append(a); });
    ON_CALL(*this, view(_, _, _, _)).WillByDefault(
        [&fake](int32_t l, const int32_t* ids, int32_t b, sieve_paged_kv* out) {
          return fake.view(l, ids, b, out);
        });
    ON_CALL(*this, register_sidecar(_, _)).WillByDefault(
        [&fake](const sieve_sidecar_desc* d, int32_t* slot) { return fake.register_sidecar(d, slot); });
    ON_CALL(*this, sidecar(_, _, _)).WillByDefault([&fake](int32_t l, int32_t slot, DLTensor* out) {
      return fake.sidecar(l, slot, out);
    });
    ON_CALL(*this, evict(_, _, _, _, _)).WillByDefault(
        [&fake](int32_t l, int32_t id, const int32_t* p, int32_t n, uint64_t* freed) {
          return fake.evict(l, id, p, n, freed);
        });
    ON_CALL(*this, bytes_in_use(_)).WillByDefault([&fake](uint64_t* b) { return fake.bytes_in_use(b); });
  }

  sieve_kv_store* handle() { return reinterpret_cast<sieve_kv_store*>(this); }
  const sieve_kv_store_api* api() const { return &api_; }
  // What the table's last_error returns when no fake is attached.
  std::string last_error;

 private:
  static MockKvStore* self(sieve_kv_store* s) { return reinterpret_cast<MockKvStore*>(s); }
  static MockKvStore* self(const sieve_kv_store* s) {
    return reinterpret_cast<MockKvStore*>(const_cast<sieve_kv_store*>(s));
  }
  const std::string& last_error_text() const { return fake_ ? fake_->last_error() : last_error; }
  static sieve_status create_cb(const sieve_host_services*, const sieve_kv_config*,
                                sieve_kv_store** out, sieve_reason_sink err) {
    if (out) *out = nullptr;
    if (err.reason) err.reason(err.ctx, "mock store: construct MockKvStore in the test");
    return SIEVE_ERR_UNSUPPORTED;
  }

  sieve_kv_store_api api_{};
  FakePagedKv* fake_ = nullptr;
};

}  // namespace sieve::testing
