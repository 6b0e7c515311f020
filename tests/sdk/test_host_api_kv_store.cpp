// Host API 1.1: choosing the KV store (by name in the options or the chain, a host's own table
// owned or borrowed, bind_pages), a 1.0 host's shorter options struct, and the built-in stores
// listed after the plugins. The rest of the host API is tested in test_host_api.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sieve/host.h>

#include <cstring>
#include <string>

#include "host_api_test_util.hpp"
#include "sieve/kv/paged_store.hpp"
#include "sieve/runtime/host_services.hpp"

namespace {

using ::testing::HasSubstr;
using host_api_test::geometry;
using host_api_test::Runtime;
using host_api_test::with_header;

struct Session11 {
  sieve_session* s = nullptr;
  ~Session11() { sieve_session_destroy(s); }
};

sieve_status create_with(Runtime& r, const sieve_session_options& o, Session11* out, const char* chain = nullptr) {
  sieve_chain* c = nullptr;
  if (chain) {
    EXPECT_EQ(sieve_chain_parse(r.rt, chain, &c), SIEVE_OK) << r.error();
  }
  sieve_geometry g = geometry();
  const sieve_status st = sieve_session_create(r.rt, &g, c, &o, &out->s);
  sieve_chain_destroy(c);
  return st;
}

// A store table a host brings: the core's paged store under another name (what an engine's own
// table looks like to the runtime).
const sieve_kv_store_api* host_table() {
  static const sieve_kv_store_descriptor d = [] {
    sieve_kv_store_descriptor x = *sieve::kv::paged_store_api()->descriptor;
    x.name = "host_paged";
    return x;
  }();
  static const sieve_kv_store_api t = [] {
    sieve_kv_store_api x = *sieve::kv::paged_store_api();
    x.descriptor = &d;
    return x;
  }();
  return &t;
}

TEST(HostApi11, StoreByNameFromTheOptionsOrTheChain) {
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  auto o = with_header<sieve_session_options>();
  o.kv_store = "paged";
  Session11 a;
  ASSERT_EQ(create_with(r, o, &a), SIEVE_OK) << r.error();
  EXPECT_STREQ(sieve_session_kv_store_name(a.s), "paged");
  Session11 b;
  ASSERT_EQ(create_with(r, with_header<sieve_session_options>(), &b, "kv_store=paged; *=streaming(window=32)"), SIEVE_OK)
      << r.error();
  EXPECT_STREQ(sieve_session_kv_store_name(b.s), "paged");
  EXPECT_STREQ(sieve_session_kv_store_name(nullptr), "");

  Session11 bad;
  o.kv_store = "pagd";
  EXPECT_EQ(create_with(r, o, &bad), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(bad.s, nullptr);
  EXPECT_THAT(r.error(), HasSubstr("unknown KV store 'pagd' (did you mean 'paged'?)"));
  o.kv_store = "paged(pool=3)";
  EXPECT_EQ(create_with(r, o, &bad), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(r.error(), HasSubstr("KV store 'paged'"));
  EXPECT_THAT(r.error(), HasSubstr("pool"));
  o.kv_store = "paged(";
  EXPECT_EQ(create_with(r, o, &bad), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(r.error(), HasSubstr("session_create: kv store, col 7"));
}

TEST(HostApi11, TwoStoresNamedAreRefused) {
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  Session11 s;
  auto o = with_header<sieve_session_options>();
  o.kv_store = "paged";
  o.kv_store_api = host_table();
  EXPECT_EQ(create_with(r, o, &s), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(r.error(), HasSubstr("two KV stores named: kv_store 'paged' and a kv_store_api table"));
  o.kv_store = nullptr;
  EXPECT_EQ(create_with(r, o, &s, "kv_store=paged; *=dense"), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(r.error(), HasSubstr("two KV stores named: the chain's kv_store 'paged' and a kv_store_api table"));
  o.kv_store = "paged";
  o.kv_store_api = nullptr;
  EXPECT_EQ(create_with(r, o, &s, "kv_store=paged; *=dense"), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(r.error(), HasSubstr("the KV store is named twice"));
  o.kv_store = nullptr;
  o.kv_store_instance = reinterpret_cast<sieve_kv_store*>(&o);  // never touched: refused first
  EXPECT_EQ(create_with(r, o, &s), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(r.error(), HasSubstr("kv_store_instance needs its table (kv_store_api)"));
  EXPECT_EQ(s.s, nullptr);
}

TEST(HostApi11, HostTableOwnedOrBorrowed) {
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  auto o = with_header<sieve_session_options>();
  o.kv_store_api = host_table();
  {
    Session11 owned;  // the session creates the instance from the host's table and destroys it
    ASSERT_EQ(create_with(r, o, &owned, "*=streaming(window=32)"), SIEVE_OK) << r.error();
    EXPECT_STREQ(sieve_session_kv_store_name(owned.s), "host_paged");
    int32_t id = -1;
    EXPECT_EQ(sieve_session_add_sequence(owned.s, &id), SIEVE_OK);
  }
  // Borrowed: the host created it; one of another geometry is refused and stays the host's.
  sieve::runtime::HostServices services({kDLCPU, 0});
  auto make = [&](int32_t layers) {
    sieve_kv_config c{};
    c.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
    c.geometry = geometry(layers);
    c.pages_per_layer = 16;
    sieve_kv_store* kv = nullptr;
    EXPECT_EQ(host_table()->create(services.table(), &c, &kv, sieve_reason_sink{}), SIEVE_OK);
    return kv;
  };
  sieve_kv_store* wrong = make(3);
  o.kv_store_instance = wrong;
  Session11 refused;
  EXPECT_EQ(create_with(r, o, &refused), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(r.error(), HasSubstr("the host's KV store 'host_paged' instance does not match the geometry: it has "
                                   "more than the geometry's 2 layers"));
  host_table()->destroy(wrong);
  sieve_kv_store* right = make(2);
  o.kv_store_instance = right;
  {
    Session11 borrowed;
    ASSERT_EQ(create_with(r, o, &borrowed), SIEVE_OK) << r.error();
    int32_t id = -1;
    EXPECT_EQ(sieve_session_add_sequence(borrowed.s, &id), SIEVE_OK);
  }
  int32_t id = -1;
  EXPECT_EQ(host_table()->add_sequence(right, &id), SIEVE_OK);  // still alive after the session
  host_table()->destroy(right);
}

TEST(HostApi11, BindPagesNeedsAStoreThatTakesThem) {
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  Session11 s;
  ASSERT_EQ(create_with(r, with_header<sieve_session_options>(), &s), SIEVE_OK) << r.error();
  EXPECT_EQ(sieve_session_bind_pages(nullptr, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(sieve_session_bind_pages(s.s, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(sieve_session_last_error(s.s), HasSubstr("bind_pages: pages is NULL"));
  auto pages = with_header<sieve_kv_pages>();
  EXPECT_EQ(sieve_session_bind_pages(s.s, &pages), SIEVE_ERR_UNSUPPORTED);
  EXPECT_THAT(sieve_session_last_error(s.s), HasSubstr("KV store 'paged' owns its pages (no bind_pages)"));
}

TEST(HostApi11, AOneDotZeroHostStillCreatesSessions) {
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  // A host compiled against host API 1.0: its options end before kv_store; what follows in its
  // memory is not the runtime's to read.
  auto o = with_header<sieve_session_options>();
  std::memset(reinterpret_cast<char*>(&o) + offsetof(sieve_session_options, kv_store), 0xAB,
              sizeof o - offsetof(sieve_session_options, kv_store));
  o.hdr.struct_size = uint32_t(offsetof(sieve_session_options, kv_store));
  o.check = 1;
  Session11 s;
  ASSERT_EQ(create_with(r, o, &s, "*=streaming(window=32)"), SIEVE_OK) << r.error();
  EXPECT_STREQ(sieve_session_kv_store_name(s.s), "paged");
}

TEST(HostApi11, PluginInfoListsTheBuiltInStoresAfterThePlugins) {
  Runtime r;
  ASSERT_EQ(sieve_runtime_add_plugin_dir(r.rt, SIEVE_PLUGIN_DIR), SIEVE_OK);
  uint32_t n = 0;
  ASSERT_EQ(sieve_runtime_plugin_count(r.rt, &n), SIEVE_OK);
  ASSERT_GE(n, 2u);
  // The built-in stores come last, in registration order: "paged", then "engine_pool".
  auto info = with_header<sieve_plugin_info>();
  ASSERT_EQ(sieve_runtime_plugin_info(r.rt, n - 2, &info), SIEVE_OK);
  EXPECT_STREQ(info.name, "paged");
  EXPECT_STREQ(info.path, "built-in");
  EXPECT_EQ(info.builtin, 1u);
  EXPECT_EQ(info.descriptor, nullptr);  // no policy
  ASSERT_NE(info.kv_store_descriptor, nullptr);
  EXPECT_EQ(info.kv_store_descriptor->features,
            uint32_t(SIEVE_KV_FEATURE_SIDECARS | SIEVE_KV_FEATURE_EVICTION | SIEVE_KV_FEATURE_PRE_ROPE_K));
  EXPECT_EQ(info.n_kv_store_params, 0u);
  auto pool = with_header<sieve_plugin_info>();
  ASSERT_EQ(sieve_runtime_plugin_info(r.rt, n - 1, &pool), SIEVE_OK);
  EXPECT_STREQ(pool.name, "engine_pool");
  EXPECT_EQ(pool.builtin, 1u);
  ASSERT_NE(pool.kv_store_descriptor, nullptr);
  EXPECT_NE(pool.kv_store_descriptor->features & SIEVE_KV_FEATURE_ENGINE_PAGES, 0u);
  EXPECT_GE(pool.n_kv_store_params, 1u);  // layout
  for (uint32_t i = 0; i + 2 < n; ++i) {
    auto p = with_header<sieve_plugin_info>();
    ASSERT_EQ(sieve_runtime_plugin_info(r.rt, i, &p), SIEVE_OK);
    EXPECT_EQ(p.builtin, 0u) << p.name;
  }
  // A 1.0 caller's struct ends before the 1.1 fields: none of them is written.
  auto old = with_header<sieve_plugin_info>();
  std::memset(&old, 0xAB, sizeof old);
  old.hdr.struct_size = uint32_t(offsetof(sieve_plugin_info, kv_store_descriptor));
  ASSERT_EQ(sieve_runtime_plugin_info(r.rt, n - 2, &old), SIEVE_OK);
  EXPECT_STREQ(old.name, "paged");
  const unsigned char* tail = reinterpret_cast<const unsigned char*>(&old) + offsetof(sieve_plugin_info, kv_store_descriptor);
  for (size_t i = 0; i < sizeof old - offsetof(sieve_plugin_info, kv_store_descriptor); ++i) ASSERT_EQ(tail[i], 0xAB) << i;
}

}  // namespace
