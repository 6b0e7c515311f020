// The engine-pool store against an engine that keeps its own pool in shuffled page order: the
// store's view reads back every token the engine (or the store, into the engine's pages) wrote,
// in every pool layout; pages go back to the engine on eviction; sidecars follow the engine's page
// ids; every bad table is refused with one line naming the problem. CPU here; the CUDA cases
// skip without a device (the GPU machine runs them).
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>

#include "engine/engine_sim.hpp"
#include "engine/view_read.hpp"
#include "kv/kv_test_support.hpp"
#include "sieve/kv/engine_pool.hpp"
#include "sieve/kv/engine_pool_base.hpp"
#include "sieve/policy.h"

using namespace sieve;
using namespace sieve::engine_test;

namespace {


// A store through the C table, for an engine of `shape`.
struct PoolStore {
  const sieve_kv_store_api* api = kv::engine_pool_store_api();
  sieve_kv_store* s = nullptr;
  sieve_param_value layout{};
  std::string err;
  PoolStore(runtime::HostServices& services, const EngineShape& sh, int64_t layout_choice, int keep_pre_rope,
            sieve_page_release_sink sink) {
    sieve_kv_config c{};
    c.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
    c.geometry.hdr = SIEVE_HEADER_INIT(sieve_geometry);
    c.geometry.n_layers = sh.layers;
    c.geometry.n_q_heads = sh.hkv * 2;
    c.geometry.n_kv_heads = sh.hkv;
    c.geometry.head_dim = sh.head_dim;
    c.geometry.page_size = sh.page;
    c.geometry.max_batch = 8;
    c.geometry.max_seq_len = sh.num_pages * sh.page;
    c.geometry.kv_dtype = sh.dtype;
    c.geometry.device = services.device();
    c.pages_per_layer = sh.num_pages;
    c.keep_pre_rope_k = keep_pre_rope;
    layout.type = SIEVE_PARAM_ENUM;
    layout.i = layout_choice;
    c.params = &layout;
    c.n_params = 1;
    c.release = sink;
    EXPECT_EQ(api->create(services.table(), &c, &s, {&err, [](void* x, const char* m) { *static_cast<std::string*>(x) = m; }}),
              SIEVE_OK)
        << err;
  }
  ~PoolStore() {
    if (s) api->destroy(s);
  }
  int32_t add() {
    int32_t id = -1;
    EXPECT_EQ(api->add_sequence(s, &id), SIEVE_OK);
    return id;
  }
  std::string error() const { return api->last_error(s); }
  uint64_t bytes() const {
    uint64_t b = 0;
    EXPECT_EQ(api->bytes_in_use(s, &b), SIEVE_OK);
    return b;
  }
};

HostTensor rows(int64_t n, const EngineShape& sh, uint32_t seed) {
  HostTensor t({n, sh.hkv, sh.head_dim}, sh.dtype);
  std::mt19937 g(seed);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < t.numel(); ++i) t.set(i, nd(g));
  return t;
}

// The paged-store tests' append record (ids and indptr are only read).
sieve_kv_append append_of(int32_t layer, const std::vector<int32_t>& ids, const std::vector<int32_t>& indptr,
                          const DLTensor* k, const DLTensor* v, const DLTensor* kpre) {
  return kv_test::make_append(layer, const_cast<std::vector<int32_t>&>(ids), const_cast<std::vector<int32_t>&>(indptr),
                              k, v, kpre);
}

// Ragged calls (a prefill of 37 and 20 tokens, then decode steps, one crossing a page) for two
// sequences; after each, every resident token read through the view equals what was appended,
// and so does the engine's own pool (the store wrote into it when `written` is 0).
void round_trip(DLDevice device, const LayoutCase& lc, bool written) {
  SCOPED_TRACE(std::string(lc.name) + (written ? ", engine writes" : ", store writes"));
  runtime::HostServices services(device);
  EngineShape sh;
  sh.layout = lc.layout;
  sh.combined_hnd = lc.combined_hnd;
  sh.dtype = kBF16;
  EngineSim engine(services, sh);
  PoolStore st(services, sh, lc.choice, /*keep_pre_rope=*/1, engine.sink());
  const std::vector<int32_t> ids = {st.add(), st.add()};
  std::vector<std::vector<std::vector<float>>> truth(2);  // [b][token*hkv + h] -> row (pre-RoPE: K * -1)
  const std::vector<std::vector<int32_t>> calls = {{37, 20}, {1, 1}, {11, 12}, {1, 1}};
  uint32_t seed = 1;
  for (const auto& n_new : calls) {
    const int32_t total = n_new[0] + n_new[1];
    HostTensor k = rows(total, sh, seed++), v = rows(total, sh, seed++), kpre = rows(total, sh, seed++);
    DeviceBytes dk(services, k.nbytes()), dv(services, v.nbytes()), dp(services, kpre.nbytes());
    dk.upload(k.dl().data, k.nbytes());
    dv.upload(v.dl().data, v.nbytes());
    dp.upload(kpre.dl().data, kpre.nbytes());
    DLTensor tk = k.dl(), tv = v.dl(), tp = kpre.dl();
    tk.data = dk.get(), tv.data = dv.get(), tp.data = dp.get();
    tk.device = tv.device = tp.device = device;
    const sieve_kv_pages& pages = engine.step(0, ids, n_new, written ? &k : nullptr, written ? &v : nullptr);
    ASSERT_EQ(st.api->bind_pages(st.s, &pages), SIEVE_OK) << st.error();
    const std::vector<int32_t> indptr = {0, n_new[0], total};
    const sieve_kv_append a = append_of(0, ids, indptr, &tk, &tv, &tp);
    ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK) << st.error();
    for (int32_t b = 0, r = 0; b < 2; ++b)
      for (int32_t i = 0; i < n_new[size_t(b)]; ++i, ++r)
        for (int32_t h = 0; h < sh.hkv; ++h)
          for (const HostTensor* t : {&k, &v, &kpre}) {
            std::vector<float> row(size_t(sh.head_dim));
            for (int32_t d = 0; d < sh.head_dim; ++d) row[size_t(d)] = t->get((int64_t(r) * sh.hkv + h) * sh.head_dim + d);
            truth[size_t(b)].push_back(row);
          }
    services.synchronize(nullptr);
    sieve_paged_kv view{};
    ASSERT_EQ(st.api->view(st.s, 0, ids.data(), 2, &view), SIEVE_OK) << st.error();
    EXPECT_EQ(view.k_pages.strides == nullptr, lc.layout == SIEVE_KV_LAYOUT_HND)
        << "compact HND views carry no strides (what a 1.0 consumer reads); every other layout does";
    ViewReader rd(services, view);
    for (int32_t b = 0; b < 2; ++b) {
      int32_t len = 0;
      ASSERT_EQ(st.api->seq_len(st.s, 0, ids[size_t(b)], &len), SIEVE_OK);
      ASSERT_EQ(rd.tokens(b), len);
      ASSERT_EQ(size_t(len) * size_t(sh.hkv) * 3, truth[size_t(b)].size());
      for (int32_t t = 0; t < len; ++t)
        for (int32_t h = 0; h < sh.hkv; ++h)
          for (int kv = 0; kv < 3; ++kv) {
            const auto& want = truth[size_t(b)][(size_t(t) * size_t(sh.hkv) + size_t(h)) * 3 + size_t(kv)];
            ASSERT_EQ(rd.row(kv, b, t, h), want) << "sequence " << b << ", token " << t << ", head " << h << ", "
                                                 << (kv == 0 ? "K" : kv == 1 ? "V" : "pre-RoPE K");
            if (kv < 2) {
              ASSERT_EQ(engine.row(0, kv, ids[size_t(b)], t, h), want) << "the engine's own pool";
            }
          }
    }
  }
}

}  // namespace

TEST(EnginePoolStore, DescribesItselfAndValidatesConfigs) {
  const sieve_kv_store_api* api = kv::engine_pool_store_api();
  ASSERT_TRUE(SIEVE_HAS_FIELD(api, sieve_kv_store_api, bind_pages));
  ASSERT_NE(api->descriptor, nullptr);
  EXPECT_STREQ(api->descriptor->name, "engine_pool");
  EXPECT_EQ(api->descriptor->features, uint32_t(SIEVE_KV_FEATURE_ENGINE_PAGES | SIEVE_KV_FEATURE_SIDECARS |
                                                SIEVE_KV_FEATURE_EVICTION | SIEVE_KV_FEATURE_PRE_ROPE_K));
  EXPECT_EQ(api->descriptor->layouts, uint32_t(SIEVE_KV_LAYOUT_HND | SIEVE_KV_LAYOUT_NHD | SIEVE_KV_LAYOUT_COMBINED));
  ASSERT_EQ(api->n_params, 1u);
  EXPECT_STREQ(api->params[0].name, "layout");
  sieve_kv_config c{};
  c.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
  c.geometry.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  c.geometry.n_layers = 1, c.geometry.n_kv_heads = 2, c.geometry.head_dim = 64, c.geometry.page_size = 24;
  c.geometry.kv_dtype = kF32, c.geometry.device = kCpu, c.pages_per_layer = 8;
  std::string why;
  EXPECT_EQ(api->validate(&c, {&why, [](void* x, const char* m) { *static_cast<std::string*>(x) = m; }}),
            SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(why.find("page_size must be 16, 32 or 64, got 24"), std::string::npos) << why;
  c.geometry.page_size = 16;
  EXPECT_EQ(api->validate(&c, {&why, nullptr}), SIEVE_OK);
}

TEST(EnginePoolStore, ViewsReadBackEveryTokenInEveryLayoutWhoeverWritesThem) {
  for (const LayoutCase& lc : kLayouts)
    for (bool written : {true, false}) round_trip(kCpu, lc, written);
}

TEST(EnginePoolStoreCuda, ViewsReadBackEveryTokenInEveryLayoutWhoeverWritesThem) {
  if (runtime::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: this test runs on the GPU machine";
  for (const LayoutCase& lc : kLayouts)
    for (bool written : {true, false}) round_trip(DLDevice{kDLCUDA, 0}, lc, written);
}

namespace {

// One sequence of `tokens` tokens bound and appended by an engine that writes K/V itself.
struct Filled {
  runtime::HostServices services{kCpu};
  EngineShape sh;
  std::unique_ptr<EngineSim> engine;
  std::unique_ptr<PoolStore> st;
  std::vector<int32_t> ids;
  explicit Filled(int32_t tokens, uint32_t layout = SIEVE_KV_LAYOUT_HND, int64_t choice = 0, bool sink = true) {
    sh.layout = layout;
    engine = std::make_unique<EngineSim>(services, sh);
    st = std::make_unique<PoolStore>(services, sh, choice, 0, sink ? engine->sink() : sieve_page_release_sink{});
    ids = {st->add()};
    if (tokens) {
      EXPECT_EQ(append(tokens), "");
    }
  }
  // Engine step + bind + append of n tokens; "" or the store's error.
  std::string append(int32_t n) {
    HostTensor k = rows(n, sh, 5), v = rows(n, sh, 6);
    const sieve_kv_pages& p = engine->step(0, ids, {n}, &k, &v);
    if (st->api->bind_pages(st->s, &p) != SIEVE_OK) return st->error();
    const std::vector<int32_t> indptr = {0, n};
    const sieve_kv_append a = append_of(0, ids, indptr, k.operator->(), v.operator->(), nullptr);
    return st->api->append(st->s, &a) == SIEVE_OK ? "" : st->error();
  }
  std::string bind(const sieve_kv_pages& p) { return st->api->bind_pages(st->s, &p) == SIEVE_OK ? "" : st->error(); }
};

#define EXPECT_REFUSED(call, text)                                                        \
  do {                                                                                    \
    const std::string e_ = (call);                                                        \
    EXPECT_NE(e_.find(text), std::string::npos) << "expected \"" << (text) << "\", got \"" << e_ << "\""; \
  } while (0)

}  // namespace

TEST(EnginePoolStore, RefusesEveryBadTableWithOneLine) {
  Filled f(40);  // pages 0..2 of the sequence (16 + 16 + 8 tokens)
  sieve_kv_pages p = f.engine->table(0, f.ids);
  std::vector<int32_t> ids(p.indices_host, p.indices_host + p.indptr_host[1]);
  p.indices_host = ids.data();
  ids[1] = f.sh.num_pages;
  EXPECT_REFUSED(f.bind(p), "page 1: id 64 is outside the pool of 64 pages");
  ids[1] = -1;
  EXPECT_REFUSED(f.bind(p), "id -1 is outside the pool");
  ids[1] = ids[0];
  EXPECT_REFUSED(f.bind(p), "names page " + std::to_string(ids[0]) + " twice");
  std::copy(f.engine->pages_of(0, f.ids[0]).begin(), f.engine->pages_of(0, f.ids[0]).end(), ids.begin());
  std::swap(ids[0], ids[1]);
  EXPECT_REFUSED(f.bind(p), "the table does not start with the 3 pages Sieve holds for it");
  std::swap(ids[0], ids[1]);
  {
    // The pages Sieve holds, then one new page: the store checks only the new one (against the
    // pool, the table's other new pages and the pages held), and still refuses what is wrong.
    std::vector<int32_t> grown(f.engine->pages_of(0, f.ids[0]).begin(), f.engine->pages_of(0, f.ids[0]).end());
    grown.push_back(grown[1]);
    int32_t indptr[2] = {0, int32_t(grown.size())}, one = 1;
    int64_t n = int64_t(grown.size());
    sieve_kv_pages q = p;
    q.indptr_host = indptr;
    q.last_page_len_host = &one;
    q.indices_host = grown.data();
    q.indices = make_view(grown.data(), kCpu, kI32, 1, &n);
    EXPECT_REFUSED(f.bind(q), "names page " + std::to_string(grown[1]) + " twice");
    grown.back() = f.sh.num_pages;
    EXPECT_REFUSED(f.bind(q), "page 3: id 64 is outside the pool of 64 pages");
    grown.back() = -1;
    EXPECT_REFUSED(f.bind(q), "page 3: id -1 is outside the pool");
  }
  p.layout = SIEVE_KV_LAYOUT_NHD;
  EXPECT_REFUSED(f.bind(p), "the pages are in layout nhd, the store was created with layout=hnd");
  p.layout = SIEVE_KV_LAYOUT_HND;
  int32_t last = 17;
  p.last_page_len_host = &last;
  EXPECT_REFUSED(f.bind(p), "last_page_len 17 is not in 1..16");
  p = f.engine->table(0, f.ids);
  DLTensor pool = p.k_pool;
  int64_t big[4] = {f.sh.num_pages + 1, f.sh.hkv, f.sh.page, f.sh.head_dim};
  p.k_pool.shape = big;
  EXPECT_REFUSED(f.bind(p), "k_pool has 65 pages; the store was configured for at most pages_per_layer = 64");
  p.k_pool = pool;
  int64_t strides[4] = {f.sh.hkv * f.sh.page * f.sh.head_dim, f.sh.head_dim, f.sh.hkv * f.sh.head_dim, 1};
  p.k_pool.strides = strides;
  EXPECT_REFUSED(f.bind(p), "v_pool's strides differ from k_pool's");
  p.v_pool.strides = strides;
  EXPECT_REFUSED(f.bind(p), "layout=hnd needs compact");
  p.k_pool = pool;
  p.v_pool.strides = nullptr;
  p.indices.dtype = kF32;
  EXPECT_REFUSED(f.bind(p), "indices must be a contiguous int32 [3] on cpu");
  const int32_t ghost = 9;
  p = f.engine->table(0, f.ids);
  p.seq_ids = &ghost;
  EXPECT_REFUSED(f.bind(p), "unknown sequence id 9");
  // Tokens the table names must be what Sieve holds after the append.
  EXPECT_EQ(f.bind(f.engine->table(0, f.ids)), "");
  HostTensor k = rows(2, f.sh, 1);
  const std::vector<int32_t> two = {0, 2};
  const sieve_kv_append a = append_of(0, f.ids, two, k.operator->(), k.operator->(), nullptr);
  EXPECT_EQ(f.st->api->append(f.st->s, &a), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(f.st->error(), "40 tokens + 2 new != the 40 tokens the bound table names");
  // A view of other sequences than those bound is refused, and so is any use after an eviction
  // until the engine binds its new table.
  const int32_t other = f.st->add();
  sieve_paged_kv view{};
  EXPECT_EQ(f.st->api->view(f.st->s, 0, &other, 1, &view), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(f.st->error(), "the sequences differ from those of the pages bound for it");
  const int32_t first = 0;
  ASSERT_EQ(f.st->api->evict(f.st->s, 0, f.ids[0], &first, 1, nullptr), SIEVE_OK) << f.st->error();
  EXPECT_EQ(f.st->api->view(f.st->s, 0, f.ids.data(), 1, &view), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_REFUSED(f.st->error(), "layer 0 has no pages bound");
}

TEST(EnginePoolStore, EvictionSendsTheEnginesPagesBackAndStopsCountingThem) {
  Filled f(70);  // 5 pages: 4 full + 6 tokens
  const int32_t slot = [&] {
    sieve_sidecar_desc d{};
    d.hdr = SIEVE_HEADER_INIT(sieve_sidecar_desc);
    d.name = "test.minmax";
    d.dtype = kF32;
    d.elems_per_head = 2;
    int32_t s = -1;
    EXPECT_EQ(f.st->api->register_sidecar(f.st->s, &d, &s), SIEVE_OK) << f.st->error();
    return s;
  }();
  const uint64_t per_page = 2 * uint64_t(f.sh.hkv) * f.sh.page * f.sh.head_dim * 4 + uint64_t(f.sh.hkv) * 2 * 4;
  EXPECT_EQ(f.st->bytes(), 5 * per_page) << "the engine's K/V bytes of the pages the sequence names, and the sidecar";
  // A policy marks every page of the sequence in the sidecar.
  DLTensor side{};
  ASSERT_EQ(f.st->api->sidecar(f.st->s, 0, slot, &side), SIEVE_OK);
  for (int64_t i = 0; i < numel(side); ++i) static_cast<float*>(side.data)[i] = 1.f;
  const std::vector<int32_t> before = f.engine->pages_of(0, f.ids[0]);
  const int32_t evict[2] = {3, 1};
  uint64_t freed = 0;
  ASSERT_EQ(f.st->api->evict(f.st->s, 0, f.ids[0], evict, 2, &freed), SIEVE_OK) << f.st->error();
  EXPECT_EQ(freed, 2 * per_page);
  EXPECT_EQ(f.st->bytes(), 3 * per_page);
  EXPECT_EQ(f.engine->released(), 2);
  EXPECT_EQ(f.engine->bad_releases(), 0);
  EXPECT_EQ(f.engine->pages_of(0, f.ids[0]), (std::vector<int32_t>{before[0], before[2], before[4]}))
      << "the sink named the physical pages of logical pages 1 and 3";
  int32_t len = 0;
  ASSERT_EQ(f.st->api->seq_len(f.st->s, 0, f.ids[0], &len), SIEVE_OK);
  EXPECT_EQ(len, 70 - 32);
  // The engine's next table (without them) binds; a second sequence takes the freed pages from
  // the engine's free list, and their sidecar slots read zero for it.
  const int32_t b = f.st->add();
  f.ids.push_back(b);
  HostTensor k = rows(33, f.sh, 9);
  const sieve_kv_pages& p = f.engine->step(0, f.ids, {1, 32}, &k, &k);
  ASSERT_EQ(f.bind(p), "");
  const std::vector<int32_t> indptr = {0, 1, 33};
  const sieve_kv_append a = append_of(0, f.ids, indptr, k.operator->(), k.operator->(), nullptr);
  ASSERT_EQ(f.st->api->append(f.st->s, &a), SIEVE_OK) << f.st->error();
  const std::vector<int32_t>& reused = f.engine->pages_of(0, b);
  ASSERT_EQ(reused.size(), 2u);
  for (int32_t page : reused) {
    EXPECT_TRUE(page == before[1] || page == before[3]) << "the engine reuses what it got back first";
    for (int32_t i = 0; i < f.sh.hkv * 2; ++i)
      EXPECT_EQ(static_cast<float*>(side.data)[page * f.sh.hkv * 2 + i], 0.f) << "page " << page;
  }
  EXPECT_EQ(static_cast<float*>(side.data)[before[0] * f.sh.hkv * 2], 1.f) << "pages still held keep theirs";
  EXPECT_EQ(f.st->bytes(), 5 * per_page) << "3 pages of the first sequence (its last one took the token), 2 new";
  ASSERT_EQ(f.st->api->remove_sequence(f.st->s, f.ids[0]), SIEVE_OK);
  ASSERT_EQ(f.st->api->remove_sequence(f.st->s, b), SIEVE_OK);
  EXPECT_EQ(f.st->bytes(), 0u) << "remove_sequence forgets every page (the engine frees them itself)";
  EXPECT_EQ(f.engine->released(), 2) << "and sends none to the sink";
}

TEST(EnginePoolStore, EvictionWithoutAReleaseSinkIsRefused) {
  Filled f(40, SIEVE_KV_LAYOUT_HND, 0, /*sink=*/false);
  const int32_t first = 0;
  EXPECT_EQ(f.st->api->evict(f.st->s, 0, f.ids[0], &first, 1, nullptr), SIEVE_ERR_UNSUPPORTED);
  EXPECT_REFUSED(f.st->error(), "registered no page release sink");
  int32_t len = 0;
  ASSERT_EQ(f.st->api->seq_len(f.st->s, 0, f.ids[0], &len), SIEVE_OK);
  EXPECT_EQ(len, 40) << "nothing was forgotten";
}

TEST(EnginePoolStore, APrefixPageTheEngineSharesKeepsItsSidecars) {
  // vLLM's prefix caching: a new request's table starts with full pages another request holds.
  Filled f(40);
  sieve_sidecar_desc d{};
  d.hdr = SIEVE_HEADER_INIT(sieve_sidecar_desc);
  d.name = "test.mark";
  d.dtype = kF32;
  d.elems_per_head = 1;
  int32_t slot = -1;
  ASSERT_EQ(f.st->api->register_sidecar(f.st->s, &d, &slot), SIEVE_OK) << f.st->error();
  DLTensor side{};
  ASSERT_EQ(f.st->api->sidecar(f.st->s, 0, slot, &side), SIEVE_OK);
  const std::vector<int32_t> a_pages = f.engine->pages_of(0, f.ids[0]);
  for (int32_t p : a_pages) static_cast<float*>(side.data)[p * f.sh.hkv] = 7.f;
  // Request b: the first two (full) pages of a, then a page of its own; 33 tokens.
  const int32_t b = f.st->add();
  const std::vector<int32_t> table = {a_pages[0], a_pages[1], a_pages[2] == 0 ? 1 : 0};
  std::vector<int32_t> own(table);
  own.back() = [&] {  // a page nobody holds
    for (int32_t p = 0;; ++p)
      if (std::find(a_pages.begin(), a_pages.end(), p) == a_pages.end()) return p;
  }();
  const std::vector<int32_t> indptr = {0, 3}, last = {1};
  int64_t n1[1] = {2}, n2[1] = {3}, n3[1] = {1};
  sieve_kv_pages p = f.engine->table(0, f.ids);
  p.batch = 1;
  p.seq_ids = &b;
  p.indptr_host = indptr.data();
  p.last_page_len_host = last.data();
  p.indices_host = own.data();
  p.indptr = make_view(const_cast<int32_t*>(indptr.data()), kCpu, kI32, 1, n1);
  p.indices = make_view(own.data(), kCpu, kI32, 1, n2);
  p.last_page_len = make_view(const_cast<int32_t*>(last.data()), kCpu, kI32, 1, n3);
  ASSERT_EQ(f.bind(p), "");
  static_cast<float*>(side.data)[own[2] * f.sh.hkv] = 3.f;  // stale from some earlier owner
  HostTensor k = rows(33, f.sh, 2);
  const std::vector<int32_t> ids = {b}, tok = {0, 33};
  const sieve_kv_append a = append_of(0, ids, tok, k.operator->(), k.operator->(), nullptr);
  ASSERT_EQ(f.st->api->append(f.st->s, &a), SIEVE_OK) << f.st->error();
  EXPECT_EQ(static_cast<float*>(side.data)[a_pages[0] * f.sh.hkv], 7.f) << "shared pages keep their sidecar";
  EXPECT_EQ(static_cast<float*>(side.data)[a_pages[1] * f.sh.hkv], 7.f);
  EXPECT_EQ(static_cast<float*>(side.data)[own[2] * f.sh.hkv], 0.f) << "a page new to every sequence is zeroed";
  // Evicting a shared page from one request leaves the other's sidecar alone.
  ASSERT_EQ(f.st->api->remove_sequence(f.st->s, f.ids[0]), SIEVE_OK);
  EXPECT_EQ(static_cast<float*>(side.data)[a_pages[0] * f.sh.hkv], 7.f);
}

namespace {

// A copy of the engine's current table for one sequence (CPU), whose ids the test may change.
struct EditedTable {
  sieve_kv_pages p;
  std::vector<int32_t> ids;
  int32_t indptr[2] = {0, 0}, last = 0;
  int64_t n_indptr = 2, n_ids = 0, n_last = 1;
  explicit EditedTable(Filled& f) : p(f.engine->table(0, f.ids)), ids(f.engine->pages_of(0, f.ids[0])) {
    last = p.last_page_len_host[0];
    indptr[1] = int32_t(ids.size());
    n_ids = int64_t(ids.size());
    p.indptr_host = indptr;
    p.last_page_len_host = &last;
    p.indices_host = ids.data();
    p.indptr = make_view(indptr, kCpu, kI32, 1, &n_indptr);
    p.indices = make_view(ids.data(), kCpu, kI32, 1, &n_ids);
    p.last_page_len = make_view(&last, kCpu, kI32, 1, &n_last);
  }
};

// A page of the pool the sequence does not hold.
int32_t unheld_page(Filled& f) {
  const std::vector<int32_t>& held = f.engine->pages_of(0, f.ids[0]);
  for (int32_t p = 0;; ++p)
    if (std::find(held.begin(), held.end(), p) == held.end()) return p;
}

}  // namespace

// A settled sequence's held pages are compared one window per bind (kHeldWindows windows), the
// last held page always, every held page after an eviction and before one: a page id the engine
// rewrites in the middle of a decode is refused by one of the next kHeldWindows binds, never
// later, and the sink never receives a page the engine's table no longer names.
TEST(EnginePoolStore, AHeldPageTheEngineRewritesIsRefusedWithinTheWindowsAndBeforeAnEviction) {
  using Base = kv::EnginePoolBase;
  Filled f(40 * 16 - 5);  // 40 pages held: more than kHeldWindows, so binds compare windows
  ASSERT_GT(int64_t(f.engine->pages_of(0, f.ids[0]).size()), Base::kHeldWindows);
  const int32_t stranger = unheld_page(f);
  for (int32_t logical : {0, 17, 30, 38}) {
    SCOPED_TRACE("logical page " + std::to_string(logical));
    EditedTable t(f);
    const int32_t held = t.ids[size_t(logical)];
    t.ids[size_t(logical)] = stranger;
    int64_t refused_at = -1;
    for (int64_t bind = 0; bind < Base::kHeldWindows && refused_at < 0; ++bind) {
      const std::string e = f.bind(t.p);
      if (e.empty()) continue;
      refused_at = bind;
      EXPECT_REFUSED(e, "the table does not start with the 40 pages Sieve holds for it (logical page " +
                            std::to_string(logical) + " is " + std::to_string(stranger) + ", Sieve holds " +
                            std::to_string(held) + ")");
    }
    EXPECT_GE(refused_at, 0) << "not refused within kHeldWindows = " << Base::kHeldWindows << " binds";
    EXPECT_EQ(f.bind(f.engine->table(0, f.ids)), "") << "the engine's real table still binds";
  }
  {
    // The last held page (the one appends continue in) is compared at every bind.
    EditedTable t(f);
    t.ids.back() = stranger;
    EXPECT_REFUSED(f.bind(t.p), "logical page 39 is " + std::to_string(stranger));
  }
  {
    // Before an eviction every held page is compared with the bound table: a table the bind's
    // window passed but that names another page is refused by evict, and nothing is released.
    EditedTable t(f);
    t.ids[20] = stranger;
    std::string e;
    for (int64_t bind = 0; bind < 2 * Base::kHeldWindows; ++bind) {
      if ((e = f.bind(t.p)).empty()) break;
      ASSERT_EQ(f.bind(f.engine->table(0, f.ids)), "");  // the window moves on
    }
    ASSERT_EQ(e, "") << "some bind's window must miss logical page 20";
    const int32_t first = 0;
    EXPECT_EQ(f.st->api->evict(f.st->s, 0, f.ids[0], &first, 1, nullptr), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_REFUSED(f.st->error(), "evict: sequence " + std::to_string(f.ids[0]) + ", layer 0: the bound table names page " +
                                      std::to_string(stranger) + " at logical page 20");
    EXPECT_EQ(f.engine->released(), 0) << "nothing reached the engine's sink";
    int32_t len = 0;
    ASSERT_EQ(f.st->api->seq_len(f.st->s, 0, f.ids[0], &len), SIEVE_OK);
    EXPECT_EQ(len, 40 * 16 - 5);
  }
  {
    // After an eviction the next bind compares every page still held, whatever its window.
    ASSERT_EQ(f.bind(f.engine->table(0, f.ids)), "");
    const int32_t first = 0;
    ASSERT_EQ(f.st->api->evict(f.st->s, 0, f.ids[0], &first, 1, nullptr), SIEVE_OK) << f.st->error();
    EditedTable t(f);  // the engine dropped the page (its sink ran): 39 held
    ASSERT_EQ(t.ids.size(), 39u);
    for (int32_t logical : {5, 25}) {
      const int32_t keep = t.ids[size_t(logical)];
      t.ids[size_t(logical)] = stranger;
      EXPECT_REFUSED(f.bind(t.p), "(logical page " + std::to_string(logical) + " is " + std::to_string(stranger));
      t.ids[size_t(logical)] = keep;
    }
    EXPECT_EQ(f.bind(t.p), "");
  }
}

namespace {

// Sidecars of every width (16-byte multiples and odd byte counts, more slots than one zeroing
// launch takes) poisoned with 0xff; after an append, exactly the pages new to the store read zero
// in every slot, every other page keeps its poison. A prefill's 566 new pages (more than a launch
// carries inline: the uploaded list) and a decode step's 2 (inline).
void zeroes_new_pages_only(DLDevice device) {
  runtime::HostServices services(device);
  EngineShape sh;
  sh.num_pages = 1024;
  EngineSim engine(services, sh);
  PoolStore st(services, sh, 0, 0, engine.sink());
  const std::vector<std::pair<DLDataType, int32_t>> widths = {{kF32, 4}, {kBF16, 3}, {kF32, 1}, {kBF16, 8}, {kF32, 2}};
  std::vector<DLTensor> sides;
  for (size_t i = 0; i < widths.size(); ++i) {
    sieve_sidecar_desc d{};
    d.hdr = SIEVE_HEADER_INIT(sieve_sidecar_desc);
    const std::string name = "test.width" + std::to_string(i);
    d.name = name.c_str();
    d.dtype = widths[i].first;
    d.elems_per_head = widths[i].second;
    int32_t slot = -1;
    ASSERT_EQ(st.api->register_sidecar(st.s, &d, &slot), SIEVE_OK) << st.error();
    ASSERT_EQ(st.api->sidecar(st.s, 0, slot, &sides.emplace_back()), SIEVE_OK) << st.error();
  }
  auto bytes_of = [&](size_t i) { return size_t(sh.hkv) * size_t(widths[i].second) * dtype_bytes(widths[i].first); };
  auto poison = [&] {
    for (size_t i = 0; i < sides.size(); ++i) {
      const std::vector<unsigned char> ff(bytes_of(i) * size_t(sh.num_pages), 0xff);
      std::string e;
      ASSERT_TRUE(services.copy(sides[i].data, device, ff.data(), kCpu, ff.size(), &e)) << e;
    }
  };
  const std::vector<int32_t> ids = {st.add(), st.add()};
  for (const std::vector<int32_t>& n_new : {std::vector<int32_t>{9000, 37}, std::vector<int32_t>{16, 16}}) {
    SCOPED_TRACE(std::to_string(n_new[0]) + " + " + std::to_string(n_new[1]) + " tokens");
    poison();
    std::vector<char> held_before(size_t(sh.num_pages), 0);
    for (int32_t id : ids)
      for (int32_t p : engine.pages_of(0, id)) held_before[size_t(p)] = 1;
    const int32_t total = n_new[0] + n_new[1];
    HostTensor k = rows(total, sh, 3);
    DeviceBytes dk(services, k.nbytes());
    dk.upload(k.dl().data, k.nbytes());
    DLTensor tk = k.dl();
    tk.data = dk.get();
    tk.device = device;
    const sieve_kv_pages& pages = engine.step(0, ids, n_new);  // the store writes the tokens
    ASSERT_EQ(st.api->bind_pages(st.s, &pages), SIEVE_OK) << st.error();
    const std::vector<int32_t> indptr = {0, n_new[0], total};
    const sieve_kv_append a = append_of(0, ids, indptr, &tk, &tk, nullptr);
    ASSERT_EQ(st.api->append(st.s, &a), SIEVE_OK) << st.error();
    std::vector<char> fresh(size_t(sh.num_pages), 0);
    int64_t n_fresh = 0;
    for (int32_t id : ids)
      for (int32_t p : engine.pages_of(0, id))
        if (!held_before[size_t(p)]) fresh[size_t(p)] = 1, ++n_fresh;
    EXPECT_EQ(n_fresh, n_new[0] == 9000 ? 563 + 3 : 2);
    std::string e;
    ASSERT_TRUE(services.synchronize(&e)) << e;
    for (size_t i = 0; i < sides.size(); ++i) {
      std::vector<unsigned char> got(bytes_of(i) * size_t(sh.num_pages));
      ASSERT_TRUE(services.copy(got.data(), kCpu, sides[i].data, device, got.size(), &e)) << e;
      for (int32_t p = 0; p < sh.num_pages; ++p) {
        const unsigned char want = fresh[size_t(p)] ? 0 : 0xff;
        for (size_t b = 0; b < bytes_of(i); ++b)
          ASSERT_EQ(got[size_t(p) * bytes_of(i) + b], want)
              << "sidecar " << i << ", page " << p << (fresh[size_t(p)] ? " (new: zeroed)" : " (not new: untouched)")
              << ", byte " << b;
      }
    }
  }
}

}  // namespace

TEST(EnginePoolStore, NewPagesSidecarsAreZeroedAndNoOtherPagesAreTouched) { zeroes_new_pages_only(kCpu); }

TEST(EnginePoolStoreCuda, NewPagesSidecarsAreZeroedAndNoOtherPagesAreTouched) {
  if (runtime::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: this test runs on the GPU machine";
  zeroes_new_pages_only(DLDevice{kDLCUDA, 0});
}
