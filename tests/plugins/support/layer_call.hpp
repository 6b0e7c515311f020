// LayerCall: a complete sieve_layer_call for one layer of a ragged batch over a FakePagedKv:
// the store's view of the layer, qo_indptr (host + a CPU DLTensor), kv_len_host, absolute query
// positions, and random post-RoPE queries. The tokens must already be in the store (the last
// n_new[b] of sequence b are its queries, as attention.h lays them out).
#pragma once
#include <gtest/gtest.h>
#include <sieve/sieve.h>
#include <sieve/util/tensor.hpp>

#include <random>
#include <string>
#include <vector>

#include "mocks/fake_paged_kv.hpp"

namespace sieve::testing {

class LayerCall {
 public:
  LayerCall(FakePagedKv& store, const sieve_geometry& geometry, uint32_t phase, int32_t layer,
            std::vector<int32_t> seq_ids, const std::vector<int32_t>& n_new, std::mt19937& rng,
            sieve_kv_store* kv = nullptr, const sieve_kv_store_api* kv_api = nullptr)
      : geometry_(geometry), seq_ids_(std::move(seq_ids)) {
    const int32_t batch = int32_t(seq_ids_.size());
    EXPECT_EQ(store.view(layer, seq_ids_.data(), batch, &view_), SIEVE_OK) << store.last_error();
    qo_indptr_.assign(1, 0);
    for (int32_t b = 0; b < batch; ++b) {
      int32_t len = 0;
      EXPECT_EQ(store.seq_len(layer, seq_ids_[size_t(b)], &len), SIEVE_OK);
      kv_len_.push_back(len);
      qo_indptr_.push_back(qo_indptr_.back() + n_new[size_t(b)]);
      for (int32_t i = 0; i < n_new[size_t(b)]; ++i) positions_.push_back(len - n_new[size_t(b)] + i);
    }
    qo_shape_ = batch + 1;
    qo_tensor_ = sieve::make_view(qo_indptr_.data(), sieve::kCpu, sieve::kI32, 1, &qo_shape_);
    q_ = sieve::HostTensor({qo_indptr_.back(), geometry.n_q_heads, geometry.head_dim}, sieve::kF32);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int64_t i = 0; i < q_.numel(); ++i) q_.set(i, u(rng));

    call_.hdr = SIEVE_HEADER_INIT(sieve_layer_call);
    call_.layer = layer;
    call_.phase = phase;
    call_.step = 0;
    call_.batch = batch;
    call_.seq_ids = seq_ids_.data();
    call_.qo_indptr = &qo_tensor_;
    call_.qo_indptr_host = qo_indptr_.data();
    call_.kv_len_host = kv_len_.data();
    call_.q = &q_.dl();
    call_.q_pre_rope = nullptr;
    call_.positions_host = positions_.data();
    call_.geometry = &geometry_;
    call_.kv = kv;
    call_.kv_api = kv_api;
    call_.kv_view = &view_;
  }
  LayerCall(const LayerCall&) = delete;
  LayerCall& operator=(const LayerCall&) = delete;

  sieve_layer_call* get() { return &call_; }
  sieve_paged_kv& view() { return view_; }
  std::vector<int32_t>& kv_len() { return kv_len_; }
  std::vector<int32_t>& qo_indptr() { return qo_indptr_; }

 private:
  sieve_geometry geometry_;
  std::vector<int32_t> seq_ids_, qo_indptr_, kv_len_, positions_;
  int64_t qo_shape_ = 0;
  DLTensor qo_tensor_{};
  sieve::HostTensor q_;
  sieve_paged_kv view_{};
  sieve_layer_call call_{};
};

// A geometry for tests (CPU, f32 unless changed).
inline sieve_geometry test_geometry(int32_t page_size, int32_t max_batch = 8,
                                    int32_t max_seq_len = 512) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 2;
  g.n_q_heads = 4;
  g.n_kv_heads = 2;
  g.head_dim = 8;
  g.page_size = page_size;
  g.max_batch = max_batch;
  g.max_seq_len = max_seq_len;
  g.kv_dtype = sieve::kF32;
  g.device = sieve::kCpu;
  g.rope_theta = 10000.f;
  g.rope_dim = 8;
  return g;
}

inline sieve_kv_config test_kv_config(const sieve_geometry& g, int32_t pages_per_layer) {
  sieve_kv_config c{};
  c.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
  c.geometry = g;
  c.pages_per_layer = pages_per_layer;
  c.keep_pre_rope_k = 0;
  return c;
}

// Collects the lines a reason/err sink receives.
struct ReasonLog {
  std::vector<std::string> lines;
  sieve_reason_sink sink() {
    return {this, [](void* ctx, const char* m) { static_cast<ReasonLog*>(ctx)->lines.push_back(m ? m : "(null)"); }};
  }
  std::string all() const {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
};

}  // namespace sieve::testing
