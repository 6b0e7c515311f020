// A long random run of what a serving loop does to a paged store — ragged prefills, many decode
// steps across page boundaries (appending in the views' order, or in another), RaaS-style
// eviction of middle pages, remove_sequence then a new sequence reusing the freed pages (and the
// id), the batch reordered or shrunk, the same view taken twice — with every view checked against
// a model of which tokens each sequence holds.
// Each token's K and V rows carry a value unique to it, so a stale, partial or misordered page
// table reads back a wrong value. The views are incremental (view_delta.hpp); this is what
// catches a delta that drops or misplaces a page. Shared by the CPU store's tests and the CUDA
// store's (a Backend moves tokens and views between the host and the store's device).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kv_test_support.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kv_test {

// A host copy of a view: the page table (device arrays and host mirrors) and the K / V pools.
struct ViewTables {
  std::vector<int32_t> indptr, indices, last;       // the DLTensors' contents
  std::vector<int32_t> indptr_host, last_host;      // the host mirrors
  std::vector<float> k, v;                          // pools, f32
};

struct Backend {
  virtual ~Backend() = default;
  // The store-side tensor of host tokens, alive until the next call.
  virtual const DLTensor* tokens(const HostTensor& h, int which) = 0;
  virtual ViewTables read(const sieve_paged_kv& view) = 0;
};

class ViewScenario {
 public:
  static constexpr int kLayers = 2, kHkv = 1, kD = 4, kPage = 16, kPages = 192;

  ViewScenario(Store& st, Backend& be, int max_batch, uint32_t seed)
      : st_(st), be_(be), max_batch_(max_batch), rng_(seed) {}

  // `steps` random operations, each followed by views of both layers (checked).
  void run(int steps) {
    for (int i = 0; i < max_batch_; ++i) add_sequence();
    batch_ = ids_;
    for (int step = 0; step < steps && !::testing::Test::HasFatalFailure(); ++step) {
      const int op = int(rng_() % 20);
      if (op < 10) append_decode();
      else if (op < 12) append_decode_reordered();
      else if (op < 14) append_ragged();
      else if (op < 16) evict_middle_page();
      else if (op < 17) replace_sequence();
      else if (op < 19) reorder_batch();
      // else: nothing changed; the views below are taken again as they were.
      for (int layer = 0; layer < kLayers; ++layer) check_view(layer, step);
      if (rng_() % 4 == 0) check_view(int(rng_() % kLayers), step);  // the same view twice
    }
  }

  int64_t views_checked() const { return views_; }

 private:
  struct Seq {
    int32_t id;
    std::vector<std::vector<float>> tokens;  // per layer: the resident tokens' values, in order
  };

  Seq& seq(int32_t id) {
    return *std::find_if(seqs_.begin(), seqs_.end(), [&](const Seq& s) { return s.id == id; });
  }
  int64_t pages_used(int layer) const {
    int64_t n = 0;
    for (const Seq& s : seqs_) n += (int64_t(s.tokens[size_t(layer)].size()) + kPage - 1) / kPage;
    return n;
  }

  void add_sequence() {
    Seq s{st_.add(), std::vector<std::vector<float>>(kLayers)};
    ids_.push_back(s.id);
    seqs_.push_back(std::move(s));
  }

  // Appends counts[b] tokens to ids[b] in both layers (as a model step does), if they fit.
  void append(const std::vector<int32_t>& counts) { append(batch_, counts); }
  void append(const std::vector<int32_t>& order, const std::vector<int32_t>& counts) {
    for (int layer = 0; layer < kLayers; ++layer) {
      int64_t need = pages_used(layer);
      for (size_t b = 0; b < order.size(); ++b) {
        const int64_t len = int64_t(seq(order[b]).tokens[size_t(layer)].size());
        need += (len + counts[b] + kPage - 1) / kPage - (len + kPage - 1) / kPage;
      }
      if (need > kPages) return;  // the pool is full: the scenario evicts or replaces instead
    }
    std::vector<int32_t> indptr = {0};
    for (int32_t c : counts) indptr.push_back(indptr.back() + c);
    for (int layer = 0; layer < kLayers; ++layer) {
      HostTensor k({indptr.back(), kHkv, kD}, kF32), v({indptr.back(), kHkv, kD}, kF32);
      for (size_t b = 0; b < order.size(); ++b)
        for (int32_t r = indptr[b]; r < indptr[b + 1]; ++r) {
          const float value = float(++next_value_);  // exact in f32 far beyond this run
          for (int i = 0; i < kHkv * kD; ++i) {
            k.set(int64_t(r) * kHkv * kD + i, value);
            v.set(int64_t(r) * kHkv * kD + i, -value);
          }
          seq(order[b]).tokens[size_t(layer)].push_back(value);
        }
      std::vector<int32_t> ids = order;
      auto a = make_append(layer, ids, indptr, be_.tokens(k, 0), be_.tokens(v, 1));
      ASSERT_EQ(st_.api->append(st_.s, &a), SIEVE_OK) << st_.error();
    }
  }
  void append_decode() { append(std::vector<int32_t>(batch_.size(), 1)); }
  // A decode step listing the batch in another order than the views: the store cannot publish
  // the view's change with the tokens, the next view does.
  void append_decode_reordered() {
    std::vector<int32_t> order = batch_;
    std::shuffle(order.begin(), order.end(), rng_);
    append(order, std::vector<int32_t>(order.size(), 1));
  }
  void append_ragged() {
    std::vector<int32_t> counts;
    for (size_t b = 0; b < batch_.size(); ++b) counts.push_back(int32_t(rng_() % 3 == 0 ? 0 : rng_() % 40));
    append(counts);
  }

  // One middle page (never the last) of one sequence in one layer, as RaaS evicts.
  void evict_middle_page() {
    Seq& s = seq(batch_[rng_() % batch_.size()]);
    const int layer = int(rng_() % kLayers);
    auto& t = s.tokens[size_t(layer)];
    const int32_t pages = int32_t((t.size() + kPage - 1) / kPage);
    if (pages < 3) return;
    const int32_t p = 1 + int32_t(rng_() % uint32_t(pages - 2));
    uint64_t freed = 0;
    ASSERT_EQ(st_.api->evict(st_.s, layer, s.id, &p, 1, &freed), SIEVE_OK) << st_.error();
    t.erase(t.begin() + int64_t(p) * kPage, t.begin() + int64_t(p + 1) * kPage);  // middle pages are full
  }

  // A sequence leaves; a new one (the store reuses the id and the pages) takes its place.
  void replace_sequence() {
    const size_t at = rng_() % batch_.size();
    const int32_t gone = batch_[at];
    ASSERT_EQ(st_.api->remove_sequence(st_.s, gone), SIEVE_OK) << st_.error();
    seqs_.erase(std::find_if(seqs_.begin(), seqs_.end(), [&](const Seq& s) { return s.id == gone; }));
    ids_.erase(std::find(ids_.begin(), ids_.end(), gone));
    add_sequence();
    batch_[at] = ids_.back();
    std::vector<int32_t> counts(batch_.size(), 0);
    counts[at] = int32_t(1 + rng_() % 50);
    append(counts);
  }

  // Another order, sometimes fewer sequences, sometimes all of them again.
  void reorder_batch() {
    batch_ = ids_;
    std::shuffle(batch_.begin(), batch_.end(), rng_);
    if (rng_() % 2) batch_.resize(1 + rng_() % batch_.size());
  }

  void check_view(int layer, int step) {
    sieve_paged_kv view{};
    ASSERT_EQ(st_.api->view(st_.s, layer, batch_.data(), int32_t(batch_.size()), &view), SIEVE_OK) << st_.error();
    ++views_;
    const ViewTables t = be_.read(view);
    const std::string where = "step " + std::to_string(step) + ", layer " + std::to_string(layer);
    ASSERT_EQ(view.batch, int32_t(batch_.size())) << where;
    ASSERT_EQ(t.indptr.size(), batch_.size() + 1) << where;
    ASSERT_EQ(t.last.size(), batch_.size()) << where;
    ASSERT_EQ(t.indptr, t.indptr_host) << where;
    ASSERT_EQ(t.last, t.last_host) << where;
    ASSERT_EQ(t.indptr[0], 0) << where;
    ASSERT_EQ(int64_t(t.indices.size()), int64_t(t.indptr.back())) << where;
    std::vector<char> seen(size_t(kPages), 0);
    for (size_t b = 0; b < batch_.size(); ++b) {
      const auto& want = seq(batch_[b]).tokens[size_t(layer)];
      const int32_t np = t.indptr[b + 1] - t.indptr[b];
      ASSERT_EQ(np, int32_t((want.size() + kPage - 1) / kPage)) << where << ", sequence " << b;
      ASSERT_EQ(t.last[b], np ? int32_t(want.size()) - (np - 1) * kPage : 0) << where << ", sequence " << b;
      for (int32_t i = 0; i < np; ++i) {
        const int32_t page = t.indices[size_t(t.indptr[b] + i)];
        ASSERT_TRUE(page >= 0 && page < kPages) << where << ": page id " << page;
        ASSERT_FALSE(seen[size_t(page)]) << where << ": page " << page << " listed twice";
        seen[size_t(page)] = 1;
      }
      for (size_t tok = 0; tok < want.size(); ++tok) {
        const int32_t page = t.indices[size_t(t.indptr[b]) + tok / kPage];
        for (int h = 0; h < kHkv; ++h) {
          const size_t at = ((size_t(page) * kHkv + size_t(h)) * kPage + tok % kPage) * kD;
          ASSERT_EQ(t.k[at], want[tok]) << where << ", sequence " << b << ", token " << tok;
          ASSERT_EQ(t.v[at + kD - 1], -want[tok]) << where << ", sequence " << b << ", token " << tok;
        }
      }
    }
  }

  Store& st_;
  Backend& be_;
  int max_batch_;
  std::mt19937 rng_;
  std::vector<Seq> seqs_;
  std::vector<int32_t> ids_;    // live sequences
  std::vector<int32_t> batch_;  // the sequences of the next append / view, in batch order
  int64_t next_value_ = 0;
  int64_t views_ = 0;
};

}  // namespace sieve::kv_test
