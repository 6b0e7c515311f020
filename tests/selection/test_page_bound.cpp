// page_bound.hpp / minmax_sidecar.hpp: the bound is never below a page's true largest logit
// (property test on random pages, f64 truth), it is tight for a one-token page, incremental
// min/max maintenance over ragged appends equals a recomputation bit for bit (f32 and bf16
// pages), the catch-up of unseen tokens, and page_bounds_cpu's layouts and GQA max.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sieve/selection/minmax_sidecar.hpp>
#include <sieve/selection/page_bound.hpp>
#include <sieve/util/error.hpp>
#include <sieve/util/page_layout.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "bound_rows.hpp"  // the portable CPU bound kernel (core/selection/src)
#include "common/tolerance.hpp"
#include "mocks/fake_paged_kv.hpp"
#include "mocks/mock_kv_store.hpp"
#include "support/layer_call.hpp"

namespace {

namespace sel = sieve::selection;
using namespace sieve::testing;

TEST(PageBound, NeverBelowTheTrueMaxLogitOfAPage) {
  std::mt19937 rng(3);
  for (const int32_t d : {1, 8, 33, 64, 100, 128}) {
    for (int iter = 0; iter < 400; ++iter) {
      const int32_t tokens = 1 + int32_t(rng() % 16);
      std::normal_distribution<float> n(0.f, iter % 3 == 0 ? 10.f : 1.f);
      std::vector<float> q(static_cast<size_t>(d)), k(size_t(tokens) * size_t(d)), mn(static_cast<size_t>(d)), mx(static_cast<size_t>(d));
      for (auto& v : q) v = n(rng);
      for (auto& v : k) v = n(rng) + (iter % 5 == 0 ? 3.f : 0.f);  // shifted pages too
      for (int32_t c = 0; c < d; ++c) {
        mn[size_t(c)] = mx[size_t(c)] = k[size_t(c)];
        for (int32_t t = 1; t < tokens; ++t) {
          mn[size_t(c)] = std::min(mn[size_t(c)], k[size_t(t) * d + size_t(c)]);
          mx[size_t(c)] = std::max(mx[size_t(c)], k[size_t(t) * d + size_t(c)]);
        }
      }
      double truth = -INFINITY, mag = 0.0;
      for (int32_t t = 0; t < tokens; ++t) {
        double dot = 0.0;
        for (int32_t c = 0; c < d; ++c) dot += double(q[size_t(c)]) * k[size_t(t) * d + size_t(c)];
        truth = std::max(truth, dot);
      }
      for (int32_t c = 0; c < d; ++c)
        mag += std::abs(double(q[size_t(c)])) * std::max(std::abs(mn[size_t(c)]), std::abs(mx[size_t(c)]));
      const float bound = sel::page_bound(q.data(), mn.data(), mx.data(), d);
      // The bound is a d-term f32 sum of products each at most |q_c| max(|mn_c|, |mx_c|): off by
      // at most gamma_d x mag in any order (the truth is f64).
      const double tol = sieve::tolerance::gamma(d, sieve::tolerance::kF32) * mag;
      ASSERT_GE(double(bound), truth - tol) << "d=" << d << " tokens=" << tokens << " iter " << iter;
      if (tokens == 1) {
        ASSERT_NEAR(double(bound), truth, tol) << "a one-token page's bound is its logit";
      }
    }
  }
}

// bound_term's one product q·(q >= 0 ? max : min) is the larger of the two rounded products: the
// same value, and the same bits except the sign of a zero when both products underflow (which a
// sum cannot tell apart once a non-zero term is in, and order_key ranks alike).
TEST(PageBound, OneProductTermIsTheLargerRoundedProduct) {
  std::mt19937 rng(8);
  std::normal_distribution<float> n(0.f, 3.f);
  const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 3e38f, -3e38f, 1e-45f};
  for (int iter = 0; iter < 200000; ++iter) {
    float q = n(rng), lo = n(rng), hi = n(rng);
    if (iter % 7 == 0) q = special[rng() % 7];
    if (iter % 11 == 0) lo = special[rng() % 7];
    if (iter % 13 == 0) hi = special[rng() % 7];
    if (lo > hi) std::swap(lo, hi);
    const float a = q * lo, b = q * hi;
    const float want = a > b ? a : b;
    const float got = sel::bound_term(q, lo, hi);
    uint32_t wb, gb;
    std::memcpy(&wb, &want, 4);
    std::memcpy(&gb, &got, 4);
    if (want == 0.0f) ASSERT_EQ(got, 0.0f) << "q=" << q << " min=" << lo << " max=" << hi;
    else ASSERT_EQ(gb, wb) << "q=" << q << " min=" << lo << " max=" << hi;
  }
}

// Ragged appends into a FakePagedKv; after each, the incremental sidecar equals a recomputation.
void incremental_equals_recompute(DLDataType dtype, int32_t head_dim) {
  sieve_geometry g = test_geometry(4, 3, 256);
  g.head_dim = head_dim;
  g.rope_dim = head_dim;
  g.kv_dtype = dtype;
  FakePagedKv store(test_kv_config(g, 256));
  sieve_sidecar_desc desc{SIEVE_HEADER_INIT(sieve_sidecar_desc), "quest.minmax", dtype, 2 * head_dim};
  int32_t slot = -1;
  ASSERT_EQ(store.register_sidecar(&desc, &slot), SIEVE_OK);
  std::vector<int32_t> ids(3);
  for (auto& id : ids) ASSERT_EQ(store.add_sequence(&id), SIEVE_OK);
  std::mt19937 rng(5);
  std::normal_distribution<float> n(0.f, 2.f);
  for (int round = 0; round < 12; ++round) {
    std::vector<int32_t> indptr = {0};
    for (int b = 0; b < 3; ++b) indptr.push_back(indptr.back() + int32_t(rng() % (round == 0 ? 9 : 6)));
    sieve::HostTensor k({indptr.back(), g.n_kv_heads, g.head_dim}, sieve::kF32), v = k;
    for (int64_t i = 0; i < k.numel(); ++i) k.set(i, n(rng)), v.set(i, n(rng));
    for (int32_t layer = 0; layer < g.n_layers; ++layer) {
      sieve_kv_append a{SIEVE_HEADER_INIT(sieve_kv_append), layer, 3, ids.data(), indptr.data(),
                        &k.dl(), &v.dl(), nullptr};
      ASSERT_EQ(store.append(&a), SIEVE_OK) << store.last_error();
      sieve_paged_kv view{};
      ASSERT_EQ(store.view(layer, ids.data(), 3, &view), SIEVE_OK);
      DLTensor side{};
      ASSERT_EQ(store.sidecar(layer, slot, &side), SIEVE_OK);
      sel::minmax_on_append_cpu(view, indptr.data(), side);
      std::vector<float> mn(static_cast<size_t>(head_dim)), mx(static_cast<size_t>(head_dim));
      for (int32_t b = 0; b < 3; ++b) {
        const int32_t pages = view.indptr_host[b + 1] - view.indptr_host[b];
        for (int32_t j = 0; j < pages; ++j) {
          const int32_t phys = sieve::data_ptr<int32_t>(view.indices)[view.indptr_host[b] + j];
          const int32_t tokens = j + 1 < pages ? g.page_size : view.last_page_len_host[b];
          for (int32_t h = 0; h < g.n_kv_heads; ++h) {
            sel::minmax_recompute_cpu(view, phys, h, tokens, mn.data(), mx.data());
            for (int32_t c = 0; c < head_dim; ++c) {
              const int64_t base = (int64_t(phys) * g.n_kv_heads + h) * 2 * head_dim;
              ASSERT_EQ(sieve::load_float(side.data, dtype, base + c), mn[size_t(c)])
                  << "round " << round << " seq " << b << " page " << j << " head " << h << " c " << c;
              ASSERT_EQ(sieve::load_float(side.data, dtype, base + head_dim + c), mx[size_t(c)]);
            }
          }
        }
      }
    }
  }
}

TEST(PageBound, IncrementalMinMaxEqualsRecomputationF32) { incremental_equals_recompute(sieve::kF32, 8); }
TEST(PageBound, IncrementalMinMaxEqualsRecomputationBf16) { incremental_equals_recompute(sieve::kBF16, 40); }
TEST(PageBound, IncrementalMinMaxEqualsRecomputationF16) { incremental_equals_recompute(sieve::kF16, 33); }

TEST(MinMaxSidecar, CatchesUpTokensItNeverSawAndRegistersPerInstance) {
  sieve_geometry g = test_geometry(4, 2, 128);
  FakePagedKv fake(test_kv_config(g, 64));
  ::testing::NiceMock<MockKvStore> store;
  store.delegate_to(fake);
  sel::MinMaxSidecar first(store.handle(), store.api(), g, "quest.minmax");
  sel::MinMaxSidecar second(store.handle(), store.api(), g, "quest.minmax");
  EXPECT_EQ(first.name(), "quest.minmax");
  EXPECT_EQ(second.name(), "quest.minmax.1");  // a second instance on the same store
  int32_t id = -1;
  ASSERT_EQ(fake.add_sequence(&id), SIEVE_OK);
  std::mt19937 rng(9);
  ASSERT_EQ(fake.append_random(id, 13, rng), SIEVE_OK);  // a prompt `first` never saw
  ASSERT_EQ(fake.append_random(id, 1, rng), SIEVE_OK);
  {
    LayerCall call(fake, g, SIEVE_PHASE_DECODE, 1, {id}, {1}, rng, store.handle(), store.api());
    EXPECT_TRUE(first.on_append(*call.get(), nullptr)) << "13 unseen tokens: catch-up";
    EXPECT_EQ(first.folded(1, id), 14);
    const DLTensor side = first.tensor(*call.get());
    std::vector<float> mn(8), mx(8);
    const auto& pages = fake.pages(1, id);
    for (size_t j = 0; j < pages.size(); ++j)
      for (int32_t h = 0; h < g.n_kv_heads; ++h) {
        sel::minmax_recompute_cpu(call.view(), pages[j], h, j + 1 < pages.size() ? 4 : 2, mn.data(), mx.data());
        for (int32_t c = 0; c < 8; ++c) {
          const int64_t base = (int64_t(pages[j]) * g.n_kv_heads + h) * 16;
          ASSERT_EQ(sieve::load_float(side.data, sieve::kF32, base + c), mn[size_t(c)]);
          ASSERT_EQ(sieve::load_float(side.data, sieve::kF32, base + 8 + c), mx[size_t(c)]);
        }
      }
  }
  ASSERT_EQ(fake.append_random(id, 1, rng), SIEVE_OK);
  LayerCall next(fake, g, SIEVE_PHASE_DECODE, 1, {id}, {1}, rng, store.handle(), store.api());
  EXPECT_FALSE(first.on_append(*next.get(), nullptr)) << "followed since: incremental";
}

TEST(PageBound, ScoresPerQueryHeadAndGroupMaxInBothLayouts) {
  sieve_geometry g = test_geometry(4, 2, 128);  // 4 q heads, 2 KV heads
  FakePagedKv fake(test_kv_config(g, 64));
  ::testing::NiceMock<MockKvStore> store;
  store.delegate_to(fake);
  sel::MinMaxSidecar side(store.handle(), store.api(), g, "quest.minmax");
  std::vector<int32_t> ids(2);
  std::mt19937 rng(1);
  for (auto& id : ids) ASSERT_EQ(fake.add_sequence(&id), SIEVE_OK);
  ASSERT_EQ(fake.append_random(ids[0], 17, rng), SIEVE_OK);
  ASSERT_EQ(fake.append_random(ids[1], 9, rng), SIEVE_OK);
  LayerCall call(fake, g, SIEVE_PHASE_DECODE, 0, ids, {1, 1}, rng, store.handle(), store.api());
  side.on_append(*call.get(), nullptr);  // catch-up of everything
  const DLTensor t = side.tensor(*call.get());
  const int32_t nnz = call.view().indptr_host[2];
  std::vector<float> per_head(size_t(nnz) * 4, NAN), per_head_t(size_t(nnz) * 4, NAN),
      group(size_t(nnz) * 2, NAN), scratch(size_t(sel::page_bounds_scratch_floats(4, 8)));
  sel::page_bounds_cpu(call.view(), t, *call.get()->q, call.get()->qo_indptr_host, 4, false,
                       per_head.data(), {4, 1}, scratch.data());
  sel::page_bounds_cpu(call.view(), t, *call.get()->q, call.get()->qo_indptr_host, 4, false,
                       per_head_t.data(), {1, nnz}, scratch.data());
  sel::page_bounds_cpu(call.view(), t, *call.get()->q, call.get()->qo_indptr_host, 4, true,
                       group.data(), {2, 1}, scratch.data());
  const auto* q = static_cast<const float*>(call.get()->q->data);
  for (int32_t b = 0; b < 2; ++b)
    for (int32_t j = call.view().indptr_host[b]; j < call.view().indptr_host[b + 1]; ++j) {
      const int32_t phys = sieve::data_ptr<int32_t>(call.view().indices)[j];
      for (int32_t h = 0; h < 4; ++h) {
        const float* mm = static_cast<const float*>(t.data) + (int64_t(phys) * 2 + h / 2) * 16;
        const float want = sel::page_bound(q + (b * 4 + h) * 8, mm, mm + 8, 8);
        ASSERT_EQ(per_head[size_t(j) * 4 + size_t(h)], want);
        ASSERT_EQ(per_head_t[size_t(h) * nnz + size_t(j)], want);
      }
      for (int32_t kh = 0; kh < 2; ++kh)
        ASSERT_EQ(group[size_t(j) * 2 + size_t(kh)],
                  std::max(per_head[size_t(j) * 4 + size_t(2 * kh)], per_head[size_t(j) * 4 + size_t(2 * kh + 1)]));
    }
}

// page_bounds_cpu (bound order, vectors and hardware FMA where the CPU has them, threads over a
// long sequence's pages) gives page_bound's canonical bits for every (page, head): head dims of 8
// lanes (<= 64) and 16, below, at and past one round and not a multiple of 8, groups of 1-5
// heads, f32 and bf16 sidecars, and a sequence long enough for threads (1025 pages x 2 KV heads
// x 4 x 128 multiply-adds >= 2^20).
TEST(PageBound, BoundsOfEveryHeadAreTheCanonicalBits) {
  struct Geo {
    int32_t hq, hkv, d;
    DLDataType dt;
    int32_t len0;
  };
  for (Geo geo : {Geo{4, 2, 8, sieve::kF32, 23}, Geo{5, 1, 72, sieve::kBF16, 23},
                  Geo{8, 2, 128, sieve::kF32, 23}, Geo{6, 6, 264, sieve::kBF16, 23},
                  Geo{3, 3, 131, sieve::kF32, 23}, Geo{4, 1, 64, sieve::kBF16, 23},
                  Geo{2, 2, 40, sieve::kF32, 23}, Geo{8, 2, 128, sieve::kBF16, 4097}}) {
    SCOPED_TRACE(std::to_string(geo.hq) + "q/" + std::to_string(geo.hkv) + "kv d " + std::to_string(geo.d) +
                 ", " + std::to_string(geo.len0) + " tokens");
    sieve_geometry g = test_geometry(4, 8, 8192);
    g.n_q_heads = geo.hq, g.n_kv_heads = geo.hkv, g.head_dim = geo.d, g.rope_dim = geo.d - geo.d % 2;
    g.kv_dtype = geo.dt;
    FakePagedKv fake(test_kv_config(g, geo.len0 / 4 + 8));
    ::testing::NiceMock<MockKvStore> store;
    store.delegate_to(fake);
    sel::MinMaxSidecar side(store.handle(), store.api(), g, "quest.minmax");
    std::vector<int32_t> ids(2);
    std::mt19937 rng(uint32_t(geo.d));
    for (auto& id : ids) ASSERT_EQ(fake.add_sequence(&id), SIEVE_OK);
    ASSERT_EQ(fake.append_random(ids[0], geo.len0, rng), SIEVE_OK);
    ASSERT_EQ(fake.append_random(ids[1], 6, rng), SIEVE_OK);
    LayerCall call(fake, g, SIEVE_PHASE_DECODE, 0, ids, {1, 1}, rng, store.handle(), store.api());
    side.on_append(*call.get(), nullptr);
    const DLTensor t = side.tensor(*call.get());
    const int32_t nnz = call.view().indptr_host[2], G = geo.hq / geo.hkv, d = geo.d;
    std::vector<float> per_head(size_t(nnz) * geo.hq), group(size_t(nnz) * geo.hkv),
        scratch(size_t(sel::page_bounds_scratch_floats(geo.hq, d))), q(size_t(geo.hq) * d),
        mm(size_t(2) * d);
    sel::page_bounds_cpu(call.view(), t, *call.get()->q, call.get()->qo_indptr_host, geo.hq, false,
                         per_head.data(), {geo.hq, 1}, scratch.data());
    sel::page_bounds_cpu(call.view(), t, *call.get()->q, call.get()->qo_indptr_host, geo.hq, true,
                         group.data(), {geo.hkv, 1}, scratch.data());
    const DLTensor& qt = *call.get()->q;
    for (int32_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < int64_t(geo.hq) * d; ++i)
        q[size_t(i)] = sieve::load_float(qt.data, qt.dtype, int64_t(b) * geo.hq * d + i);
      for (int32_t j = call.view().indptr_host[b]; j < call.view().indptr_host[b + 1]; ++j) {
        const int32_t phys = sieve::data_ptr<int32_t>(call.view().indices)[j];
        for (int32_t kh = 0; kh < geo.hkv; ++kh) {
          for (int32_t c = 0; c < 2 * d; ++c)
            mm[size_t(c)] = sieve::load_float(t.data, t.dtype, (int64_t(phys) * geo.hkv + kh) * 2 * d + c);
          float best = 0;
          for (int32_t u = 0; u < G; ++u) {
            const int32_t h = kh * G + u;
            const float want = sel::page_bound(q.data() + int64_t(h) * d, mm.data(), mm.data() + d, d);
            best = sel::group_max_step(best, want, u == 0);
            const float got = per_head[size_t(j) * geo.hq + size_t(h)];
            ASSERT_EQ(std::memcmp(&got, &want, sizeof want), 0) << "page " << j << " head " << h << ": " << got
                                                                 << " vs " << want;
          }
          const float got = group[size_t(j) * geo.hkv + size_t(kh)];
          ASSERT_EQ(std::memcmp(&got, &best, sizeof best), 0) << "page " << j << " KV head " << kh;
        }
      }
    }
  }
}

// The portable copy of the bound kernel (used where the CPU lacks AVX2 / FMA) on operands put in
// bound order here from its definition, against page_bound bit for bit: 8 and 16 lanes, padded
// rounds, zeros and both signs of q.
TEST(PageBound, PortableBoundKernelIsTheCanonicalSum) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int32_t d : {8, 40, 64, 72, 128, 131, 264}) {
    const int32_t lanes = sel::bound_order_lanes(d);
    const int64_t n = sel::bound_order_floats(d);
    auto to_bound_order = [&](const std::vector<float>& x) {
      std::vector<float> y(size_t(n), 0.0f);
      for (int32_t c = 0; c < d; ++c) {  // chunk c / 8 (partial chunk % lanes), step c % 8
        const int32_t chunk = c / sel::kBoundChunk, round = chunk / lanes;
        const int64_t at =
            int64_t(round) * lanes * sel::kBoundChunk + (c % sel::kBoundChunk) * lanes + chunk % lanes;
        y[size_t(at)] = x[size_t(c)];
      }
      return y;
    };
    std::vector<float> q(static_cast<size_t>(d)), lo = q, hi = q;
    for (int32_t c = 0; c < d; ++c) {
      q[size_t(c)] = c % 11 == 0 ? 0.0f : nd(rng);
      const float a = nd(rng), b = nd(rng);
      lo[size_t(c)] = std::min(a, b);
      hi[size_t(c)] = std::max(a, b);
    }
    const std::vector<float> qb = to_bound_order(q), lb = to_bound_order(lo), hb = to_bound_order(hi);
    float got = NAN;
    sel::bound_rows_impl(qb.data(), 1, lb.data(), hb.data(), d, &got);
    const float want = sel::page_bound(q.data(), lo.data(), hi.data(), d);
    ASSERT_EQ(std::memcmp(&got, &want, sizeof want), 0)
        << "head_dim " << d << ": " << got << " vs " << want;
  }
}

// Engine layouts (ABI 1.1 strided views): the same ragged appends into a compact store and into
// one that keeps its pages NHD, HND with explicit strides or as a combined pool give bit-identical
// sidecars, recomputed min/max and page bounds (the same values in the same order).
TEST(PageBound, EngineLayoutsGiveTheSameSidecarsAndBounds) {
  for (const sieve::KvLayout layout : sieve::kKvLayouts) {
    SCOPED_TRACE(sieve::kv_layout_name(layout));
    for (const DLDataType dtype : {sieve::kF32, sieve::kBF16}) {
      sieve_geometry g = test_geometry(4, 3, 256);
      g.kv_dtype = dtype;
      FakePagedKv compact(test_kv_config(g, 64)), laid(test_kv_config(g, 64));
      laid.set_layout(layout);
      sieve_sidecar_desc desc{SIEVE_HEADER_INIT(sieve_sidecar_desc), "quest.minmax", dtype, 2 * g.head_dim};
      int32_t slot = -1, slot2 = -1;
      ASSERT_EQ(compact.register_sidecar(&desc, &slot), SIEVE_OK);
      ASSERT_EQ(laid.register_sidecar(&desc, &slot2), SIEVE_OK);
      std::vector<int32_t> ids(3), ids2(3);
      for (size_t b = 0; b < 3; ++b) {
        ASSERT_EQ(compact.add_sequence(&ids[b]), SIEVE_OK);
        ASSERT_EQ(laid.add_sequence(&ids2[b]), SIEVE_OK);
      }
      std::mt19937 rng(uint32_t(11 + layout.bit + layout.combined_hnd));
      std::normal_distribution<float> n(0.f, 2.f);
      for (int round = 0; round < 6; ++round) {
        std::vector<int32_t> indptr = {0};
        for (int b = 0; b < 3; ++b) indptr.push_back(indptr.back() + 1 + int32_t(rng() % 7));
        sieve::HostTensor k({indptr.back(), g.n_kv_heads, g.head_dim}, sieve::kF32), v = k;
        for (int64_t i = 0; i < k.numel(); ++i) k.set(i, n(rng)), v.set(i, n(rng));
        sieve::HostTensor q({3, g.n_q_heads, g.head_dim}, sieve::kF32);
        for (int64_t i = 0; i < q.numel(); ++i) q.set(i, n(rng));
        const int32_t qo[4] = {0, 1, 2, 3};
        sieve_kv_append a{SIEVE_HEADER_INIT(sieve_kv_append), 0, 3, ids.data(), indptr.data(),
                          &k.dl(), &v.dl(), nullptr};
        ASSERT_EQ(compact.append(&a), SIEVE_OK);
        a.seq_ids = ids2.data();
        ASSERT_EQ(laid.append(&a), SIEVE_OK);
        sieve_paged_kv va{}, vb{};
        ASSERT_EQ(compact.view(0, ids.data(), 3, &va), SIEVE_OK);
        ASSERT_EQ(laid.view(0, ids2.data(), 3, &vb), SIEVE_OK);
        ASSERT_NE(vb.k_pages.strides, nullptr);
        DLTensor sa{}, sb{};
        ASSERT_EQ(compact.sidecar(0, slot, &sa), SIEVE_OK);
        ASSERT_EQ(laid.sidecar(0, slot2, &sb), SIEVE_OK);
        sel::minmax_on_append_cpu(va, indptr.data(), sa);
        sel::minmax_on_append_cpu(vb, indptr.data(), sb);
        const size_t side_bytes = size_t(sieve::numel(sa)) * sieve::dtype_bytes(dtype);
        ASSERT_EQ(std::memcmp(sa.data, sb.data, side_bytes), 0) << "round " << round;

        const int32_t nnz = va.indptr_host[3];
        std::vector<float> bound_a(size_t(nnz) * 4, NAN), bound_b = bound_a,
            scratch(size_t(sel::page_bounds_scratch_floats(4, 8)));
        sel::page_bounds_cpu(va, sa, q.dl(), qo, g.n_q_heads, false, bound_a.data(), {4, 1}, scratch.data());
        sel::page_bounds_cpu(vb, sb, q.dl(), qo, g.n_q_heads, false, bound_b.data(), {4, 1}, scratch.data());
        ASSERT_EQ(std::memcmp(bound_a.data(), bound_b.data(), bound_a.size() * 4), 0);
        std::vector<float> mn_a(8), mx_a(8), mn_b(8), mx_b(8);
        const int32_t phys = sieve::data_ptr<int32_t>(va.indices)[nnz - 1];
        for (int32_t h = 0; h < g.n_kv_heads; ++h) {
          sel::minmax_recompute_cpu(va, phys, h, va.last_page_len_host[2], mn_a.data(), mx_a.data());
          sel::minmax_recompute_cpu(vb, phys, h, vb.last_page_len_host[2], mn_b.data(), mx_b.data());
          ASSERT_EQ(mn_a, mn_b);
          ASSERT_EQ(mx_a, mx_b);
        }
      }
    }
  }
}

TEST(PageBound, BadKStridesAreRefusedWithOneLine) {
  sieve_geometry g = test_geometry(4, 1, 64);
  FakePagedKv fake(test_kv_config(g, 16));
  sieve_sidecar_desc desc{SIEVE_HEADER_INIT(sieve_sidecar_desc), "quest.minmax", sieve::kF32, 16};
  int32_t slot = -1, id = -1;
  ASSERT_EQ(fake.register_sidecar(&desc, &slot), SIEVE_OK);
  ASSERT_EQ(fake.add_sequence(&id), SIEVE_OK);
  std::mt19937 rng(2);
  ASSERT_EQ(fake.append_random(id, 5, rng), SIEVE_OK);
  sieve_paged_kv view{};
  ASSERT_EQ(fake.view(0, &id, 1, &view), SIEVE_OK);
  DLTensor side{};
  ASSERT_EQ(fake.sidecar(0, slot, &side), SIEVE_OK);
  int64_t overlapping[4] = {64, 32, 4, 1};  // token stride 4 < head_dim 8
  view.k_pages.strides = overlapping;
  const int32_t new_tokens[2] = {0, 5};
  try {
    sel::minmax_on_append_cpu(view, new_tokens, side);
    ADD_FAILURE() << "overlapping strides accepted";
  } catch (const sieve::Error& e) {
    EXPECT_EQ(e.status(), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_THAT(std::string(e.what()), ::testing::StartsWith("page bound: K pages: strides [64, 32, 4, 1] overlap"));
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos);
  }
}

}  // namespace
