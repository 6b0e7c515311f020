// runtime::Session and the store registry: the built-in "paged" store is found like a plugin's,
// a 1.0 store's descriptor is derived from its table, a chain names its store and the session
// runs on it, and a policy that needs what the store lacks, a borrowed instance of another
// geometry or bind_pages on a store that owns its pages are refused with one line naming both.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sieve/kv/engine_pool.hpp"
#include "sieve/kv/paged_store.hpp"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/runtime/session.hpp"
#include "sieve/util/abi_v1_0.hpp"
#include "sieve/util/error.hpp"

using namespace sieve;
using namespace sieve::runtime;
using ::testing::HasSubstr;

namespace {

sieve_geometry geometry(int32_t layers = 2, int32_t kv_heads = 2) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = layers;
  g.n_q_heads = 4;
  g.n_kv_heads = kv_heads;
  g.head_dim = 64;
  g.page_size = 16;
  g.max_batch = 2;
  g.max_seq_len = 256;
  g.kv_dtype = {kDLFloat, 32, 1};
  g.device = {kDLCPU, 0};
  g.rope_theta = 10000.f;
  g.rope_dim = 64;
  return g;
}

// The plugins built with the tree (quest: needs SIDECARS; raas: evicts).
const Registry& plugins() {
  static Registry* r = [] {
    auto* reg = new Registry;
    reg->add_directory(SIEVE_PLUGIN_DIR);
    return reg;
  }();
  return *r;
}

ResolvedChains resolve(const std::string& text, const sieve_geometry& g = geometry()) {
  ChainSpec spec;
  std::string err;
  EXPECT_TRUE(parse_chain_argument(text, &spec, &err)) << err;
  ResolvedChains rc;
  std::vector<std::string> errors;
  EXPECT_TRUE(resolve_chains(spec, plugins(), g, &rc, &errors)) << ::testing::PrintToString(errors);
  return rc;
}

// A 1.0 store table: the CPU store's entries, without the 1.1 fields and without `evict` (so its
// derived descriptor lacks EVICTION), or without sidecars too.
sieve_kv_store_api v1_0_table(bool sidecars) {
  sieve_kv_store_api t = *kv::paged_cpu_store_api();
  t.hdr.struct_size = uint32_t(util::v1_0_size<sieve_kv_store_api>());
  t.name = "old";
  t.evict = nullptr;
  if (!sidecars) t.register_sidecar = nullptr, t.sidecar = nullptr;
  return t;
}

std::string session_error(const sieve_geometry& g, ResolvedChains chains, Session::Options o) {
  HostServices services(g.device);
  try {
    Session s(services, g, std::move(chains), o);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(StoreRegistry, BuiltInPagedIsFoundLikeAPluginStore) {
  Registry r;
  const StoreEntry* e = r.find_store("paged");
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(e->builtin());
  EXPECT_TRUE(e->declared);
  EXPECT_EQ(e->source, "built-in");
  EXPECT_EQ(e->api, kv::paged_store_api());
  EXPECT_EQ(e->descriptor.layouts, uint32_t(SIEVE_KV_LAYOUT_HND));
  EXPECT_EQ(e->descriptor.features,
            uint32_t(SIEVE_KV_FEATURE_SIDECARS | SIEVE_KV_FEATURE_EVICTION | SIEVE_KV_FEATURE_PRE_ROPE_K));
  EXPECT_TRUE(e->descriptor.devices & SIEVE_DEVICE_CPU);
  EXPECT_EQ(bool(e->descriptor.devices & SIEVE_DEVICE_CUDA), kv::paged_cuda_store_api() != nullptr);
  EXPECT_TRUE(e->params().empty());
  EXPECT_EQ(r.find_store("nope"), nullptr);
  // Discovery keeps it: the stores of a registry with plugins still start with it.
  ASSERT_FALSE(plugins().stores().empty());
  EXPECT_EQ(plugins().stores().front().name, "paged");
}

TEST(StoreRegistry, AnotherBuiltInRegistersThroughOneCall) {
  Registry r;
  EXPECT_FALSE(r.add_builtin_store(kv::paged_store_api()));  // the name is taken
  ASSERT_FALSE(r.failures().empty());
  EXPECT_THAT(r.failures().back().reason, HasSubstr("the name 'paged' is taken"));
  static sieve_kv_store_api renamed = v1_0_table(true);
  renamed.name = "paged_copy";
  EXPECT_TRUE(r.add_builtin_store(&renamed));
  const StoreEntry* e = r.find_store("paged_copy");
  ASSERT_NE(e, nullptr);
  EXPECT_TRUE(e->builtin());
}

TEST(StoreRegistry, AOneDotZeroStoreGetsADerivedDescriptor) {
  const sieve_kv_store_api t = v1_0_table(true);
  const StoreEntry e = describe_store(&t, "oldplugin", "libold.so");
  EXPECT_FALSE(e.declared);
  EXPECT_EQ(e.name, "oldplugin");
  EXPECT_EQ(e.descriptor.features, uint32_t(SIEVE_KV_FEATURE_SIDECARS));  // evict is NULL
  EXPECT_EQ(e.descriptor.layouts, uint32_t(SIEVE_KV_LAYOUT_HND));
  EXPECT_EQ(e.descriptor.devices, 0u);  // undeclared
  EXPECT_TRUE(e.params().empty());
}

TEST(Session, DefaultStoreIsPagedAndItsCallsWork) {
  const sieve_geometry g = geometry();
  HostServices services(g.device);
  Session s(services, g, resolve("streaming(sink=4,window=32)"), {});
  EXPECT_EQ(s.store_entry().name, "paged");
  EXPECT_FALSE(s.store_borrowed());
  EXPECT_EQ(s.store_config().pages_per_layer, 2 * (256 / 16));  // max_batch x ceil(max_seq_len / page)
  EXPECT_EQ(s.store_config().geometry_ref, &s.geometry());
  const int32_t id = s.add_sequence();
  EXPECT_EQ(s.seq_len(0, id), 0);
  EXPECT_EQ(s.bytes_in_use(), 0u);
  try {
    s.seq_len(0, id + 100);
    ADD_FAILURE() << "an unknown sequence was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("KV store 'paged', seq_len"));
  }
  sieve_kv_pages pages{};
  pages.hdr = SIEVE_HEADER_INIT(sieve_kv_pages);
  try {
    s.bind_pages(pages);
    ADD_FAILURE() << "bind_pages on a store that owns its pages was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.status(), SIEVE_ERR_UNSUPPORTED);
    EXPECT_THAT(std::string(e.what()), HasSubstr("KV store 'paged' owns its pages"));
  }
}

TEST(Session, ChainNamesItsStoreAndUnknownStoresAreRefused) {
  ChainSpec spec;
  std::string err;
  ASSERT_TRUE(parse_chain_spec("kv_store=paged; *=streaming(sink=4,window=32)", &spec, &err)) << err;
  ResolvedChains rc;
  std::vector<std::string> errors;
  ASSERT_TRUE(resolve_chains(spec, plugins(), geometry(), &rc, &errors));
  EXPECT_EQ(rc.store.entry.name, "paged");

  ASSERT_TRUE(parse_chain_spec("kv_store=pagd; *=dense", &spec, &err)) << err;
  errors.clear();
  EXPECT_FALSE(resolve_chains(spec, plugins(), geometry(), &rc, &errors));
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_THAT(errors[0], HasSubstr("unknown KV store 'pagd' (did you mean 'paged'?); available: paged"));

  ASSERT_TRUE(parse_chain_spec("kv_store=paged(pool=2)", &spec, &err)) << err;
  errors.clear();
  EXPECT_FALSE(resolve_chains(spec, plugins(), geometry(), &rc, &errors));
  ASSERT_FALSE(errors.empty());
  EXPECT_THAT(errors[0], HasSubstr("KV store 'paged'"));
  EXPECT_THAT(errors[0], HasSubstr("pool"));
}

TEST(Session, PolicyNeedingWhatTheStoreLacksIsRefusedNamingBoth) {
  if (!plugins().find("quest") || !plugins().find("raas")) GTEST_SKIP() << "quest / raas not built";
  const sieve_geometry g = geometry();
  static const sieve_kv_store_api no_sidecars = v1_0_table(false);
  Session::Options o;
  o.store_api = &no_sidecars;
  EXPECT_EQ(session_error(g, resolve("quest(token_budget=64)"), o),
            "policy 'quest' (instance quest) needs SIDECARS, which KV store 'old' lacks");
  static const sieve_kv_store_api no_eviction = v1_0_table(true);
  o.store_api = &no_eviction;
  EXPECT_THAT(session_error(g, resolve("raas(token_budget=64)"), o),
              HasSubstr("policy 'raas' (instance raas) needs EVICTION, which KV store 'old' lacks"));
  // The same table serves a policy that needs neither.
  EXPECT_EQ(session_error(g, resolve("streaming(sink=4,window=32)"), o), "");
}

TEST(Session, StoreLayoutOutsideThePolicysIsRefused) {
  // A store whose views are NHD-strided; streaming (a 1.0-style kv_layouts of 0) reads HND only.
  static const sieve_kv_store_descriptor nhd = [] {
    sieve_kv_store_descriptor d = *kv::paged_store_api()->descriptor;
    d.name = "nhd_only";
    d.layouts = SIEVE_KV_LAYOUT_NHD;
    return d;
  }();
  static const sieve_kv_store_api table = [] {
    sieve_kv_store_api t = *kv::paged_store_api();
    t.descriptor = &nhd;
    return t;
  }();
  Session::Options o;
  o.store_api = &table;
  const ResolvedChains rc = resolve("streaming(sink=4,window=32)");
  const uint32_t reads = rc.instances.at(0).descriptor().kv_layouts;
  if (reads & SIEVE_KV_LAYOUT_NHD) GTEST_SKIP() << "streaming reads NHD views now";
  EXPECT_THAT(session_error(geometry(), rc, o),
              HasSubstr("policy 'streaming' (instance streaming) reads hnd pages, KV store 'nhd_only' hands out nhd"));
}

TEST(Session, AStoreOfTheHostsPagesIsTakenOnlyByAHostThatBindsThem) {
  Session::Options o;
  o.store_api = kv::engine_pool_store_api();
  EXPECT_THAT(session_error(geometry(), resolve("dense"), o),
              HasSubstr("KV store 'engine_pool' runs over pages the host owns and binds per call (ENGINE_PAGES); "
                        "this host binds none"));
  o.binds_pages = true;
  EXPECT_EQ(session_error(geometry(), resolve("dense"), o), "");
}

TEST(Session, BorrowedInstanceMustMatchTheGeometry) {
  const sieve_geometry g = geometry();
  HostServices services(g.device);
  const sieve_kv_store_api* api = kv::paged_store_api();
  auto host_store = [&](const sieve_geometry& of) {  // what a host creates before the session
    sieve_kv_config c{};
    c.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
    c.geometry = of;
    c.pages_per_layer = 8;
    sieve_kv_store* kv = nullptr;
    EXPECT_EQ(api->create(services.table(), &c, &kv, sieve_reason_sink{}), SIEVE_OK);
    return kv;
  };
  for (const auto& [other, why] : std::vector<std::pair<sieve_geometry, std::string>>{
           {geometry(3), "more than the geometry's 2 layers"},
           {geometry(1), "it has no layer 1"},
           {geometry(2, 1), "its pages are not [pages, 2 kv heads, 16 tokens, 64 dims]"}}) {
    sieve_kv_store* kv = host_store(other);
    ASSERT_NE(kv, nullptr);
    Session::Options o;
    o.store_api = api;
    o.store_instance = kv;
    EXPECT_THAT(session_error(g, resolve("dense"), o), HasSubstr(why));
    api->destroy(kv);  // refused: still the host's
  }
  // The right geometry is borrowed, used, and left to the host.
  sieve_kv_store* kv = host_store(g);
  ASSERT_NE(kv, nullptr);
  {
    Session::Options o;
    o.store_api = api;
    o.store_instance = kv;
    Session s(services, g, resolve("dense"), o);
    EXPECT_TRUE(s.store_borrowed());
    EXPECT_EQ(s.store(), kv);
    EXPECT_GE(s.add_sequence(), 0);
  }
  int32_t id = -1;
  EXPECT_EQ(api->add_sequence(kv, &id), SIEVE_OK);  // the session did not destroy it
  api->destroy(kv);
}

}  // namespace
