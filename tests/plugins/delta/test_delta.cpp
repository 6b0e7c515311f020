// The delta (DELTA) plugin, loaded from its .so with dlopen, driven hook by hook the way the
// layer runner drives it, with the core CPU kernel producing the page statistics:
//  - a Δ-layer asks for page statistics and leaves the attention dense; the statistics the core
//    kernel delivers equal S_u = Σ_{t in u} max_h p_h(t) recomputed in f64 from the dense
//    probabilities of the f64 reference;
//  - the selection written at the following sparse layers equals the paper's definition
//    (reference_row) over those scores, per sequence or per KV head; the recency window is always
//    present; the budget holds; short sequences stay dense;
//  - sparse layers read only the selected pages: every other page's K/V is poisoned with NaN and
//    the output still equals the f64 attention over the selection;
//  - the selection never outlives its step; roles and budgets are validated with reasons; hooks
//    neither allocate nor evict.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sieve/kernels/attention_args.hpp>
#include <sieve/kernels/attention_cpu.hpp>
#include <sieve/reference/attention_ref.hpp>

#include <cmath>
#include <limits>

#include "common/attention_tolerance.hpp"
#include "delta/delta_scenario.hpp"
#include "mocks/mock_host_services.hpp"
#include "mocks/mock_kv_store.hpp"
#include "support/host_selection.hpp"
#include "support/plugin_library.hpp"

namespace {

using namespace sieve::testing;
using ::testing::_;
using ::testing::HasSubstr;
using ::testing::NiceMock;

// What the core kernel computed for one Δ-layer call.
struct DeltaPass {
  std::vector<float> page_mass;  // [nnz pages, H]
  int32_t H = 1;
};

class Delta : public ::testing::Test {
 protected:
  void SetUp() override {
    api_ = lib_.policy();
    ASSERT_NE(api_, nullptr);
  }
  void TearDown() override {
    for (sieve_policy* p : policies_) api_->destroy(p);
    EXPECT_EQ(host_.live_allocations(), 0u);
  }
  sieve_policy* create(const sieve_geometry& g, DeltaParams params) {
    sieve_policy* p = create_or_fail(api_, host_.table(), g, params.values(), DeltaParams::kCount);
    if (p) policies_.push_back(p);
    return p;
  }
  std::vector<std::string> reasons(const sieve_geometry& g, DeltaParams params,
                                   sieve_status* status = nullptr) {
    ReasonLog log;
    const sieve_status s = api_->validate(&g, params.values(), DeltaParams::kCount, log.sink());
    if (status) *status = s;
    return log.lines;
  }

  // A Δ-layer: select must ask for statistics and leave the selection as it was; the core CPU
  // kernel runs dense attention with the statistics; observe receives them.
  DeltaPass run_select_layer(sieve_policy* p, LayerCall& call, uint32_t want) {
    DeltaPass pass;
    HostSelection sel(64, 64);
    uint32_t stats = SIEVE_STATS_NONE;
    EXPECT_EQ(api_->select(p, call.get(), sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
    EXPECT_EQ(stats, want);
    EXPECT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_ALL)) << "a Δ-layer attends everything";
    for (int32_t v : sel.indptr()) EXPECT_EQ(v, kSelectionPoison);
    const sieve_geometry& g = *call.get()->geometry;
    pass.H = want == SIEVE_STATS_PAGE_MASS_PER_KV_HEAD ? g.n_kv_heads : 1;
    const sieve_paged_kv& view = call.view();
    const int64_t nnz = view.indptr_host[view.batch];
    pass.page_mass.assign(size_t(nnz * pass.H), std::numeric_limits<float>::quiet_NaN());
    sieve::HostTensor out({int64_t(call.get()->batch), g.n_q_heads, g.head_dim}, sieve::kF32);
    std::vector<float> lse(size_t(call.get()->batch * g.n_q_heads));
    int64_t mass_shape[2] = {nnz, pass.H}, lse_shape[2] = {call.get()->batch, g.n_q_heads};
    DLTensor mass = sieve::make_view(pass.page_mass.data(), sieve::kCpu, sieve::kF32, 2, mass_shape);
    DLTensor lse_t = sieve::make_view(lse.data(), sieve::kCpu, sieve::kF32, 2, lse_shape);
    sieve_attention_args args = sieve::kernels::make_attention_args(
        SIEVE_PHASE_DECODE, g.n_q_heads, g.n_kv_heads, g.head_dim, call.get()->q, &out.dl(),
        call.get()->qo_indptr, call.get()->qo_indptr_host, &view);
    args.stats = want;
    args.page_mass = &mass;
    args.lse = &lse_t;
    std::string error;
    EXPECT_EQ(sieve::kernels::attend_cpu(args, &error), SIEVE_OK) << error;
    sieve_attention_stats st{};
    st.hdr = SIEVE_HEADER_INIT(sieve_attention_stats);
    st.request = want;
    st.page_mass = mass;
    st.lse = lse_t;
    EXPECT_EQ(api_->observe(p, call.get(), &st), SIEVE_OK) << api_->last_error(p);
    return pass;
  }
  // Observe hand-made scores (no kernel): for tests of the selection rule itself.
  sieve_status observe_scores(sieve_policy* p, LayerCall& call, std::vector<float>& scores,
                              int32_t H, uint32_t request) {
    HostSelection sel(64, 64);
    uint32_t stats = 0;
    EXPECT_EQ(api_->select(p, call.get(), sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
    int64_t shape[2] = {int64_t(scores.size()) / H, H};
    sieve_attention_stats st{};
    st.hdr = SIEVE_HEADER_INIT(sieve_attention_stats);
    st.request = request;
    st.page_mass = sieve::make_view(scores.data(), sieve::kCpu, sieve::kF32, 2, shape);
    return api_->observe(p, call.get(), &st);
  }
  // A sparse layer's selection.
  std::vector<std::vector<int32_t>> sparse_rows(sieve_policy* p, LayerCall& call,
                                                HostSelection& sel, uint32_t heads) {
    uint32_t stats = SIEVE_STATS_NONE;
    EXPECT_EQ(api_->select(p, call.get(), sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
    EXPECT_EQ(stats, uint32_t(SIEVE_STATS_NONE)) << "sparse layers ask for nothing";
    EXPECT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_BLOCKS));
    EXPECT_EQ(sel.sel().heads, heads);
    EXPECT_EQ(sel.sel().q_block, 1);
    EXPECT_EQ(sel.sel().k_block_pages, 1);
    return sel.rows();
  }

  PluginLibrary lib_{"delta"};
  const sieve_policy_api* api_ = nullptr;
  NiceMock<MockHostServices> host_;
  std::vector<sieve_policy*> policies_;
};

TEST_F(Delta, DescriptorAndSchema) {
  const sieve_policy_descriptor& d = *api_->descriptor;
  EXPECT_STREQ(d.name, "delta");
  EXPECT_EQ(d.phases, uint32_t(SIEVE_PHASE_DECODE));
  EXPECT_EQ(d.needs & SIEVE_NEEDS_PAGE_STATS, uint32_t(SIEVE_NEEDS_PAGE_STATS));
  EXPECT_EQ(d.evicts_kv, 0u) << "DELTA keeps the whole cache resident";
#if SIEVE_WITH_CUDA
  EXPECT_EQ(d.devices, uint32_t(SIEVE_DEVICE_CPU | SIEVE_DEVICE_CUDA));
#else
  EXPECT_EQ(d.devices, uint32_t(SIEVE_DEVICE_CPU));
#endif
  ASSERT_EQ(api_->n_params, DeltaParams::kCount);
  const char* names[] = {"token_budget", "recent", "dense_layers", "select_layers", "per_kv_head"};
  for (uint32_t i = 0; i < DeltaParams::kCount; ++i) EXPECT_STREQ(api_->params[i].name, names[i]);
  EXPECT_STREQ(api_->params[0].default_value, "1024");
  EXPECT_STREQ(api_->params[1].default_value, "32");
  EXPECT_EQ(api_->params[2].type, uint32_t(SIEVE_PARAM_INT_LIST));
  EXPECT_NE(api_->select, nullptr);
  EXPECT_NE(api_->observe, nullptr);
  EXPECT_NE(api_->end_step, nullptr);
  EXPECT_EQ(api_->attend, nullptr);
  EXPECT_EQ(api_->correct, nullptr);
  EXPECT_EQ(api_->on_append, nullptr);
}

// The statistics the Δ-layer receives are the paper's S_u, checked against an f64 recomputation
// from the reference's dense probabilities; the sparse layers' selection is the paper's rule over
// them, per sequence and per KV head.
TEST_F(Delta, PageScoresAreTheF64MaxOverHeadsMassAndSelectionFollowsThem) {
  for (bool per_kv_head : {false, true}) {
    SCOPED_TRACE(per_kv_head ? "per KV head" : "per sequence");
    DeltaScenario sc(4, {3, 16, 17, 45, 90, 130});
    DeltaParams params;
    params.token_budget = 24;  // 6 pages of 4
    params.recent = 6;
    params.per_kv_head = per_kv_head;
    sieve_policy* p = create(sc.geometry, params);
    ASSERT_NE(p, nullptr);
    const uint32_t want =
        per_kv_head ? SIEVE_STATS_PAGE_MASS_PER_KV_HEAD : SIEVE_STATS_PAGE_MASS_ALL_HEADS;
    auto delta_call = sc.call(2);
    const DeltaPass pass = run_select_layer(p, *delta_call, want);

    // f64: probabilities of every (query, head) over the dense keys, max over the row's heads,
    // summed per page.
    const sieve_geometry& g = sc.geometry;
    sieve::HostTensor out({int64_t(sc.lens.size()), g.n_q_heads, g.head_dim}, sieve::kF32);
    sieve_attention_args args = sieve::kernels::make_attention_args(
        SIEVE_PHASE_DECODE, g.n_q_heads, g.n_kv_heads, g.head_dim, delta_call->get()->q, &out.dl(),
        delta_call->get()->qo_indptr, delta_call->get()->qo_indptr_host, &delta_call->view());
    sieve::reference::RefOptions ro;
    ro.keep_probs = true;
    const sieve::reference::RefAttention ref = sieve::reference::attend_reference(args, ro);
    const int32_t group = g.n_q_heads / g.n_kv_heads, P = g.page_size;
    std::vector<double> f64(pass.page_mass.size(), 0.0);
    for (size_t b = 0; b < sc.lens.size(); ++b) {
      const int32_t base = delta_call->view().indptr_host[b];
      for (int32_t t = 0; t < sc.lens[b]; ++t)
        for (int32_t c = 0; c < pass.H; ++c) {
          double m = 0;
          for (int32_t h = 0; h < g.n_q_heads; ++h)
            if (pass.H == 1 || h / group == c) m = std::max(m, ref.prob_row(int32_t(b), h)[size_t(t)]);
          f64[size_t((base + t / P) * pass.H + c)] += m;
        }
    }
    // The kernel's f32 page mass to its arithmetic's relative bound (terms below f32's normal
    // range may flush to 0: P of them at most).
    const double mass_rel = sieve::tolerance::page_mass(args);
    for (size_t i = 0; i < f64.size(); ++i)
      EXPECT_NEAR(pass.page_mass[i], f64[i], mass_rel * f64[i] + P * std::numeric_limits<float>::min())
          << "page_mass[" << i << "]";

    auto sparse_call = sc.call(3);
    HostSelection sel(64, 512);
    const auto rows =
        sparse_rows(p, *sparse_call, sel, per_kv_head ? SIEVE_SEL_PER_KV_HEAD : SIEVE_SEL_PER_SEQUENCE);
    ASSERT_EQ(rows.size(), sc.lens.size() * size_t(pass.H));
    for (size_t b = 0; b < sc.lens.size(); ++b)
      for (int32_t c = 0; c < pass.H; ++c) {
        const int32_t base = delta_call->view().indptr_host[b];
        const auto expected = reference_row(sc.lens[b], params.recent, params.token_budget, P,
                                            [&](int32_t u) { return pass.page_mass[size_t((base + u) * pass.H + c)]; });
        EXPECT_EQ(rows[b * size_t(pass.H) + size_t(c)], expected) << "sequence " << b << " row head " << c;
        // Against the f64 scores: nothing left out beats a chosen earlier page by more than the
        // f32 rounding of the two scores (mass_rel each).
        const auto f64_rank = reference_row(sc.lens[b], params.recent, params.token_budget, P,
                                            [&](int32_t u) { return f64[size_t((base + u) * pass.H + c)]; });
        double worst_kept = 1e300, best_dropped = -1;
        for (int32_t u : expected) worst_kept = std::min(worst_kept, f64[size_t((base + u) * pass.H + c)]);
        for (int32_t u : f64_rank)
          if (!std::binary_search(expected.begin(), expected.end(), u))
            best_dropped = std::max(best_dropped, f64[size_t((base + u) * pass.H + c)]);
        if (best_dropped >= 0) {
          EXPECT_LE(best_dropped, worst_kept + 2 * mass_rel * std::max(best_dropped, worst_kept));
        }
      }
  }
}

// The rule on hand-made scores with many ties, over page sizes, budgets, windows and lengths
// around page boundaries: equal to the definition, the window always inside, the budget held,
// short sequences dense.
TEST_F(Delta, RecencyWindowAlwaysPresentAndBudgetHeld) {
  for (int32_t P : {1, 4, 16}) {
    std::vector<int32_t> lens;
    for (int32_t len : {1, P - 1, P, P + 1, 3 * P - 1, 5 * P, 7 * P + 1, 97, 200, 257})
      if (len >= 1) lens.push_back(len);
    DeltaScenario sc(P, lens);
    for (int64_t budget_pages : {2, 4, 8, 16}) {
      for (int64_t recent : {1, 2, 5, 8, 16, 31}) {
        DeltaParams params;
        params.token_budget = budget_pages * P;
        params.recent = recent;
        if (worst_window_pages(recent, P) > budget_pages) continue;  // refused (below)
        SCOPED_TRACE(::testing::Message() << "P=" << P << " K=" << params.token_budget << " L=" << recent);
        sieve_policy* p = create(sc.geometry, params);
        ASSERT_NE(p, nullptr);
        auto c2 = sc.call(2);
        std::vector<float> scores(size_t(sc.total_pages()));
        std::uniform_int_distribution<int> small(0, 3);  // ties everywhere
        for (float& s : scores) s = float(small(sc.rng));
        ASSERT_EQ(observe_scores(p, *c2, scores, 1, SIEVE_STATS_PAGE_MASS_ALL_HEADS), SIEVE_OK)
            << api_->last_error(p);
        auto c4 = sc.call(4);
        HostSelection sel(16, 4096);
        const auto rows = sparse_rows(p, *c4, sel, SIEVE_SEL_PER_SEQUENCE);
        ASSERT_EQ(rows.size(), lens.size());
        for (size_t b = 0; b < lens.size(); ++b) {
          const int32_t base = c2->view().indptr_host[b], len = lens[b];
          const auto expected = reference_row(len, recent, params.token_budget, P,
                                              [&](int32_t u) { return scores[size_t(base + u)]; });
          EXPECT_EQ(rows[b], expected) << "len " << len;
          for (int64_t t = std::max<int64_t>(0, len - recent); t < len; ++t)
            EXPECT_TRUE(std::binary_search(rows[b].begin(), rows[b].end(), int32_t(t / P)))
                << "len " << len << ": recent token " << t << " (page " << t / P << ") missing";
          const int32_t n = (len + P - 1) / P;
          EXPECT_EQ(int64_t(rows[b].size()), std::min<int64_t>(n, budget_pages)) << "len " << len;
        }
        api_->destroy(p);
        policies_.pop_back();
      }
    }
  }
}

// Sparse layers read only the selected pages: after the Δ-layer chose, every other page of the
// sparse layer's cache is poisoned with NaN; the core kernel over the selection must still give
// the f64 attention over the selected pages (and finite numbers). The store is a mock that must
// see no eviction and no sidecar registration; hooks make no allocation.
TEST_F(Delta, SparseLayersReadOnlySelectedPages) {
  DeltaScenario sc(4, {5, 33, 64, 101});
  NiceMock<MockKvStore> store;
  store.delegate_to(sc.store);
  EXPECT_CALL(store, evict).Times(0);
  EXPECT_CALL(store, register_sidecar).Times(0);
  DeltaParams params;
  params.token_budget = 32;
  params.recent = 5;
  // The one policy created with a KV store (create_or_fail gives it none).
  sieve_policy* p = nullptr;
  ReasonLog err;
  ASSERT_EQ(api_->create(host_.table(), &sc.geometry, params.values(), DeltaParams::kCount, store.handle(),
                         store.api(), &p, err.sink()),
            SIEVE_OK)
      << err.all();
  ASSERT_NE(p, nullptr);
  policies_.push_back(p);
  EXPECT_CALL(host_, alloc).Times(0);
  auto c2 = sc.call(2);
  run_select_layer(p, *c2, SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  for (int32_t layer : {3, 4}) {
    SCOPED_TRACE(::testing::Message() << "layer " << layer);
    auto c = sc.call(layer);
    HostSelection sel(16, 512);
    const auto rows = sparse_rows(p, *c, sel, SIEVE_SEL_PER_SEQUENCE);
    const sieve_geometry& g = sc.geometry;
    const sieve_paged_kv& view = c->view();
    auto* k = static_cast<float*>(view.k_pages.data);
    auto* v = static_cast<float*>(view.v_pages.data);
    const int64_t page_elems = int64_t(g.n_kv_heads) * g.page_size * g.head_dim;
    int poisoned = 0;
    for (size_t b = 0; b < rows.size(); ++b)
      for (int32_t u = 0; u < sc.pages(b); ++u)
        if (!std::binary_search(rows[b].begin(), rows[b].end(), u)) {
          const int32_t phys = static_cast<const int32_t*>(view.indices.data)[view.indptr_host[b] + u];
          std::fill_n(k + phys * page_elems, page_elems, std::numeric_limits<float>::quiet_NaN());
          std::fill_n(v + phys * page_elems, page_elems, std::numeric_limits<float>::quiet_NaN());
          ++poisoned;
        }
    EXPECT_GT(poisoned, 0) << "the budget should leave pages out";
    sieve::HostTensor out({int64_t(rows.size()), g.n_q_heads, g.head_dim}, sieve::kF32);
    sieve_attention_args args = sieve::kernels::make_attention_args(
        SIEVE_PHASE_DECODE, g.n_q_heads, g.n_kv_heads, g.head_dim, c->get()->q, &out.dl(),
        c->get()->qo_indptr, c->get()->qo_indptr_host, &view);
    args.selection = sel.get();
    std::string error;
    ASSERT_EQ(sieve::kernels::attend_cpu(args, &error), SIEVE_OK) << error;
    const auto ref = sieve::reference::attend_reference(args);
    double err = 0;
    for (int64_t i = 0; i < out.numel(); ++i) {
      const double o = out.get(i);
      ASSERT_TRUE(std::isfinite(o)) << "output " << i << " read a page outside the selection";
      err += (o - ref.out[size_t(i)]) * (o - ref.out[size_t(i)]);
    }
    // Every row within the kernel's f32 bound: the whole output within sqrt(rows) of it.
    const double n_rows = double(out.numel() / g.head_dim);
    EXPECT_LE(std::sqrt(err), std::sqrt(n_rows) * sieve::tolerance::attention_bound(args).row);
  }
  api_->end_step(p, nullptr);  // NULL: refused, but no crash
}

// Dense layers leave the selection alone; a selection never outlives its step; a sparse layer
// needs the Δ-layer's sequences and lengths.
TEST_F(Delta, SelectionLivesOneStep) {
  DeltaScenario sc(4, {20, 41});
  DeltaParams params;
  params.token_budget = 16;
  params.recent = 4;
  sieve_policy* p = create(sc.geometry, params);
  ASSERT_NE(p, nullptr);
  {
    auto c0 = sc.call(0);
    HostSelection sel(8, 64);
    uint32_t stats = 0;
    ASSERT_EQ(api_->select(p, c0->get(), sel.get(), &stats), SIEVE_OK) << api_->last_error(p);
    EXPECT_EQ(stats, 0u);
    EXPECT_EQ(sel.sel().kind, uint32_t(SIEVE_SEL_ALL));
    for (int32_t x : sel.indptr()) EXPECT_EQ(x, kSelectionPoison) << "a dense layer writes nothing";
  }
  auto sparse_fails = [&](const char* what) {
    auto c3 = sc.call(3);
    HostSelection sel(8, 64);
    uint32_t stats = 0;
    EXPECT_EQ(api_->select(p, c3->get(), sel.get(), &stats), SIEVE_ERR_INVALID_ARGUMENT) << what;
    EXPECT_THAT(api_->last_error(p), HasSubstr("no Δ-layer made a selection in step")) << what;
    EXPECT_THAT(api_->last_error(p), HasSubstr("select layers [2]")) << what;
    for (int32_t x : sel.indptr()) EXPECT_EQ(x, kSelectionPoison) << what;
  };
  sparse_fails("before any Δ-layer");
  auto c2 = sc.call(2);
  run_select_layer(p, *c2, SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  {
    auto c3 = sc.call(3);
    HostSelection sel(8, 64);
    EXPECT_EQ(sparse_rows(p, *c3, sel, SIEVE_SEL_PER_SEQUENCE).size(), 2u);
  }
  ++sc.step;
  sparse_fails("a later step");
  --sc.step;
  sieve_step_end e{};
  e.hdr = SIEVE_HEADER_INIT(sieve_step_end);
  e.phase = SIEVE_PHASE_DECODE;
  e.step = sc.step;
  ASSERT_EQ(api_->end_step(p, &e), SIEVE_OK);
  sparse_fails("after end_step");

  // Another batch at the sparse layer than at the Δ-layer.
  run_select_layer(p, *c2, SIEVE_STATS_PAGE_MASS_ALL_HEADS);
  LayerCall other(sc.store, sc.geometry, SIEVE_PHASE_DECODE, 3, {sc.ids[1], sc.ids[0]}, {1, 1}, sc.rng);
  other.get()->step = sc.step;
  HostSelection sel(8, 64);
  uint32_t stats = 0;
  EXPECT_EQ(api_->select(p, other.get(), sel.get(), &stats), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("selected for id"));
  // Too little room in the chain's selection: CAPACITY, nothing written.
  auto c4 = sc.call(4);
  HostSelection small(8, 3);
  EXPECT_EQ(api_->select(p, c4->get(), small.get(), &stats), SIEVE_ERR_CAPACITY);
  for (int32_t x : small.indices()) EXPECT_EQ(x, kSelectionPoison);
  // Prefill is not DELTA's phase.
  auto c = sc.call(2);
  c->get()->phase = SIEVE_PHASE_PREFILL;
  EXPECT_EQ(api_->select(p, c->get(), sel.get(), &stats), SIEVE_ERR_UNSUPPORTED);
  // Observe at a layer that is not a Δ-layer.
  std::vector<float> scores(size_t(sc.total_pages()), 1.f);
  auto c3 = sc.call(3);
  int64_t shape[2] = {int64_t(scores.size()), 1};
  sieve_attention_stats st{};
  st.hdr = SIEVE_HEADER_INIT(sieve_attention_stats);
  st.request = SIEVE_STATS_PAGE_MASS_ALL_HEADS;
  st.page_mass = sieve::make_view(scores.data(), sieve::kCpu, sieve::kF32, 2, shape);
  EXPECT_EQ(api_->observe(p, c3->get(), &st), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("a sparse layer"));
  // Wrong page_mass shape.
  shape[1] = 2;
  st.page_mass = sieve::make_view(scores.data(), sieve::kCpu, sieve::kF32, 2, shape);
  EXPECT_EQ(api_->observe(p, c2->get(), &st), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_THAT(api_->last_error(p), HasSubstr("page_mass must be"));
}

TEST_F(Delta, ValidationGivesReasons) {
  sieve_geometry g = DeltaScenario::make_geometry(16, 5, {1});
  sieve_status st;
  auto expect_reason = [&](DeltaParams p, const std::string& text) {
    const auto lines = reasons(g, p, &st);
    EXPECT_EQ(st, SIEVE_ERR_INVALID_ARGUMENT) << text;
    std::string all;
    for (const auto& l : lines) all += l + "\n";
    EXPECT_THAT(all, HasSubstr(text));
  };
  DeltaParams ok;
  EXPECT_TRUE(reasons(g, ok, &st).empty());
  EXPECT_EQ(st, SIEVE_OK);
  DeltaParams p = ok;
  p.dense = {0, 1, 2};
  expect_reason(p, "layer 2 is in both dense_layers and select_layers");
  p = ok;
  p.select = {2, 7};
  expect_reason(p, "select_layers: layer 7 does not exist (the model has 5 layers, 0-4)");
  p = ok;
  p.dense = {0};
  expect_reason(p, "layer 1 is in neither dense_layers nor select_layers, so it is sparse, but no "
                   "select layer precedes it (the first is 2)");
  p = ok;
  p.dense = {0, 1};
  p.select = {};
  expect_reason(p, "select_layers is empty");
  p = ok;
  p.select = {2, 2};
  expect_reason(p, "select_layers lists layer 2 twice");
  p = ok;
  p.token_budget = 32;
  p.recent = 48;
  expect_reason(p, "token_budget = 32 is smaller than recent = 48");
  p = ok;
  p.token_budget = 100;
  expect_reason(p, "token_budget = 100 is not a multiple of page_size = 16");
  p = ok;
  p.token_budget = 32;
  p.recent = 32;  // up to 3 pages of 16 for the window, 2 in the budget
  expect_reason(p, "cannot hold the recency window");
  // Defaults (both lists empty) fit any depth, even one layer (conformance runs a 1-layer model).
  p = ok;
  p.dense = {};
  p.select = {};
  for (int32_t layers : {1, 2, 5, 28}) {
    g.n_layers = layers;
    EXPECT_TRUE(reasons(g, p, &st).empty()) << layers << " layers";
  }
  // The paper's 28-layer recipe.
  g.n_layers = 28;
  p.dense = {0, 1};
  p.select = {2, 14, 22};
  EXPECT_TRUE(reasons(g, p, &st).empty());
}

}  // namespace
