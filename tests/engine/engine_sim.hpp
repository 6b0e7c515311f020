// A stand-in for an inference engine that keeps its own paged KV cache, the way vLLM and SGLang
// do: one pool per layer in the engine's layout (HND, NHD, or one combined [pages, 2, ...] K/V
// tensor), pages handed out from a shuffled free list (so physical order never matches token
// order), per-sequence page lists, FlashInfer CSR tables built per call, and a release sink that
// takes evicted pages back into the free list. Device memory through the runtime's host services
// (CPU or CUDA), so the same engine serves the CPU tests here and the CUDA tests on the GPU.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "sieve/kv_store.h"
#include "sieve/runtime/host_services.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::engine_test {

struct EngineShape {
  int32_t layers = 1, hkv = 2, head_dim = 64, page = 16, num_pages = 64;
  DLDataType dtype = kF32;
  uint32_t layout = SIEVE_KV_LAYOUT_HND;
  int32_t combined_hnd = 0;
  uint32_t seed = 7;
};

// The four pool layouts of the `layout` parameter, in its order.
struct LayoutCase {
  const char* name;
  uint32_t layout;
  int32_t combined_hnd;
  int64_t choice;  // index of the `layout` choice
};
inline constexpr LayoutCase kLayouts[] = {{"hnd", SIEVE_KV_LAYOUT_HND, 0, 0},
                                          {"nhd", SIEVE_KV_LAYOUT_NHD, 0, 1},
                                          {"combined", SIEVE_KV_LAYOUT_COMBINED, 0, 2},
                                          {"combined_hnd", SIEVE_KV_LAYOUT_COMBINED, 1, 3}};

// Device memory from the host services, freed with the object.
class DeviceBytes {
 public:
  DeviceBytes(runtime::HostServices& s, size_t bytes) : s_(&s), bytes_(std::max<size_t>(bytes, 4)) {
    p_ = s.table()->alloc(s.table()->host_ctx, s.device(), bytes_, 256);
    EXPECT_NE(p_, nullptr);
  }
  ~DeviceBytes() {
    if (p_) s_->table()->free(s_->table()->host_ctx, s_->device(), p_);
  }
  DeviceBytes(const DeviceBytes&) = delete;
  DeviceBytes& operator=(const DeviceBytes&) = delete;
  void* get() const { return p_; }
  void upload(const void* src, size_t n) {
    std::string e;
    EXPECT_TRUE(s_->copy(p_, s_->device(), src, kCpu, n, &e)) << e;
  }
  void download(void* dst, size_t n) const {
    std::string e;
    EXPECT_TRUE(s_->copy(dst, kCpu, p_, s_->device(), n, &e)) << e;
  }

 private:
  runtime::HostServices* s_;
  size_t bytes_;
  void* p_ = nullptr;
};

class EngineSim {
 public:
  EngineSim(runtime::HostServices& services, const EngineShape& shape)
      : s_(services), sh_(shape), rng_(shape.seed) {
    const bool combined = sh_.layout == SIEVE_KV_LAYOUT_COMBINED;
    for (int32_t l = 0; l < sh_.layers; ++l) {
      Layer& L = layers_.emplace_back();
      L.k = std::make_unique<DeviceBytes>(s_, pool_bytes() * (combined ? 2 : 1));
      if (!combined) L.v = std::make_unique<DeviceBytes>(s_, pool_bytes());
      L.free.resize(size_t(sh_.num_pages));
      for (int32_t p = 0; p < sh_.num_pages; ++p) L.free[size_t(p)] = p;
      std::shuffle(L.free.begin(), L.free.end(), rng_);
    }
    if (combined) pool_shape_ = sh_.combined_hnd ? std::vector<int64_t>{sh_.num_pages, 2, sh_.hkv, sh_.page, sh_.head_dim}
                                                 : std::vector<int64_t>{sh_.num_pages, 2, sh_.page, sh_.hkv, sh_.head_dim};
    else if (sh_.layout == SIEVE_KV_LAYOUT_NHD) pool_shape_ = {sh_.num_pages, sh_.page, sh_.hkv, sh_.head_dim};
    else pool_shape_ = {sh_.num_pages, sh_.hkv, sh_.page, sh_.head_dim};
  }
  EngineSim(const EngineSim&) = delete;
  EngineSim& operator=(const EngineSim&) = delete;

  const EngineShape& shape() const { return sh_; }
  size_t elem() const { return dtype_bytes(sh_.dtype); }
  size_t pool_bytes() const { return size_t(sh_.num_pages) * sh_.hkv * sh_.page * sh_.head_dim * elem(); }

  // Element offset of (page, kv (0: K, 1: V), head, slot, 0) in the buffer that holds it.
  int64_t offset(int32_t page, int kv, int32_t h, int32_t slot) const {
    const int64_t H = sh_.hkv, P = sh_.page, D = sh_.head_dim;
    if (sh_.layout == SIEVE_KV_LAYOUT_COMBINED)
      return sh_.combined_hnd ? (((int64_t(page) * 2 + kv) * H + h) * P + slot) * D
                              : (((int64_t(page) * 2 + kv) * P + slot) * H + h) * D;
    if (sh_.layout == SIEVE_KV_LAYOUT_NHD) return ((int64_t(page) * P + slot) * H + h) * D;
    return ((int64_t(page) * H + h) * P + slot) * D;
  }
  DeviceBytes& buffer(int32_t layer, int kv) {
    Layer& L = layers_[size_t(layer)];
    return (kv == 0 || !L.v) ? *L.k : *L.v;
  }

  // The release sink the engine registers: evicted pages leave the sequence's list and go back
  // to the free list.
  sieve_page_release_sink sink() {
    return {this, [](void* ctx, int32_t layer, int32_t seq, const int32_t* pages, int32_t n) {
              auto* e = static_cast<EngineSim*>(ctx);
              Layer& L = e->layers_[size_t(layer)];
              auto& list = L.seqs[seq].pages;
              for (int32_t i = 0; i < n; ++i) {
                auto it = std::find(list.begin(), list.end(), pages[i]);
                ASSERT_NE(it, list.end()) << "released page " << pages[i] << " is not sequence " << seq << "'s";
                list.erase(it);
                L.free.push_back(pages[i]);
                L.seqs[seq].tokens -= e->sh_.page;
                ++e->released_;
              }
            }};
  }
  int64_t released() const { return released_; }
  void forget(int32_t seq) {
    for (Layer& L : layers_) {
      auto it = L.seqs.find(seq);
      if (it == L.seqs.end()) continue;
      for (int32_t p : it->second.pages) L.free.push_back(p);
      L.seqs.erase(it);
    }
  }

  // The engine's side of one layer call: each sequence's table grows by n_new[b] tokens (pages
  // from the shuffled free list); when `write`, the engine writes the new rows of k/v
  // ([sum n_new, hkv, head_dim] host tensors, in batch order) itself, as vLLM's reshape_and_cache
  // does. Returns the pages to bind (valid until the next step of the layer).
  const sieve_kv_pages& step(int32_t layer, const std::vector<int32_t>& seq_ids, const std::vector<int32_t>& n_new,
                             bool write, const HostTensor* k, const HostTensor* v) {
    Layer& L = layers_[size_t(layer)];
    const int32_t B = int32_t(seq_ids.size());
    L.indptr.assign(1, 0);
    L.indices.clear();
    L.last.clear();
    for (int32_t b = 0, row = 0; b < B; ++b) {
      Seq& s = L.seqs[seq_ids[size_t(b)]];
      for (int32_t i = 0; i < n_new[size_t(b)]; ++i, ++row) {
        if (s.tokens % sh_.page == 0) {
          EXPECT_FALSE(L.free.empty()) << "engine pool full";
          s.pages.push_back(L.free.back());
          L.free.pop_back();
        }
        const int32_t page = s.pages[size_t(s.tokens / sh_.page)], slot = s.tokens % sh_.page;
        if (write)
          for (int kv = 0; kv < 2; ++kv)
            for (int32_t h = 0; h < sh_.hkv; ++h)
              put_row(layer, kv, page, h, slot, (kv ? v : k)->dl(), (int64_t(row) * sh_.hkv + h) * sh_.head_dim);
        ++s.tokens;
      }
      L.indices.insert(L.indices.end(), s.pages.begin(), s.pages.end());
      L.indptr.push_back(int32_t(L.indices.size()));
      L.last.push_back(s.pages.empty() ? 0 : (s.tokens - 1) % sh_.page + 1);
    }
    return bind(layer, seq_ids, write);
  }

  // The table as it stands (no new tokens), e.g. after an eviction.
  const sieve_kv_pages& table(int32_t layer, const std::vector<int32_t>& seq_ids) {
    return step(layer, seq_ids, std::vector<int32_t>(seq_ids.size(), 0), true, nullptr, nullptr);
  }

  // Row (seq's token t, head h) of K (kv 0) or V (kv 1), read back from the pool.
  std::vector<float> row(int32_t layer, int kv, int32_t seq, int32_t t, int32_t h) {
    const Seq& s = layers_[size_t(layer)].seqs.at(seq);
    const int32_t page = s.pages[size_t(t / sh_.page)];
    std::vector<unsigned char> raw(size_t(sh_.head_dim) * elem());
    std::string e;
    EXPECT_TRUE(s_.copy(raw.data(), kCpu,
                        static_cast<char*>(buffer(layer, kv).get()) + offset(page, kv, h, t % sh_.page) * int64_t(elem()),
                        s_.device(), raw.size(), &e))
        << e;
    std::vector<float> out(size_t(sh_.head_dim));
    for (int32_t d = 0; d < sh_.head_dim; ++d) out[size_t(d)] = load_float(raw.data(), sh_.dtype, d);
    return out;
  }
  const std::vector<int32_t>& pages_of(int32_t layer, int32_t seq) { return layers_[size_t(layer)].seqs[seq].pages; }

 private:
  struct Seq {
    std::vector<int32_t> pages;
    int32_t tokens = 0;
  };
  struct Layer {
    std::unique_ptr<DeviceBytes> k, v;  // v null: combined
    std::vector<int32_t> free;
    std::map<int32_t, Seq> seqs;
    std::vector<int32_t> indptr, indices, last, seq_ids;
    std::unique_ptr<DeviceBytes> d_indptr, d_indices, d_last;
    std::array<int64_t, 1> indptr_shape{}, indices_shape{}, last_shape{};
    sieve_kv_pages pages{};
  };

  void put_row(int32_t layer, int kv, int32_t page, int32_t h, int32_t slot, const DLTensor& src, int64_t at) {
    std::vector<unsigned char> raw(size_t(sh_.head_dim) * elem());
    for (int32_t d = 0; d < sh_.head_dim; ++d) store_float(raw.data(), sh_.dtype, d, load_float(src.data, src.dtype, at + d));
    std::string e;
    EXPECT_TRUE(s_.copy(static_cast<char*>(buffer(layer, kv).get()) + offset(page, kv, h, slot) * int64_t(elem()),
                        s_.device(), raw.data(), kCpu, raw.size(), &e))
        << e;
  }

  const sieve_kv_pages& bind(int32_t layer, const std::vector<int32_t>& seq_ids, bool written) {
    Layer& L = layers_[size_t(layer)];
    const DLDevice dev = s_.device();
    L.seq_ids = seq_ids;
    auto table = [&](std::unique_ptr<DeviceBytes>& d, const std::vector<int32_t>& h, std::array<int64_t, 1>& shape) {
      d = std::make_unique<DeviceBytes>(s_, h.size() * 4);
      if (!h.empty()) d->upload(h.data(), h.size() * 4);
      shape[0] = int64_t(h.size());
      return make_view(d->get(), dev, kI32, 1, shape.data());
    };
    sieve_kv_pages& p = L.pages;
    p = sieve_kv_pages{};
    p.hdr = SIEVE_HEADER_INIT(sieve_kv_pages);
    p.layer = layer;
    p.batch = int32_t(seq_ids.size());
    p.seq_ids = L.seq_ids.data();
    p.layout = sh_.layout;
    p.combined_hnd = sh_.combined_hnd;
    p.k_pool = make_view(L.k->get(), dev, sh_.dtype, int(pool_shape_.size()), pool_shape_.data());
    if (L.v) p.v_pool = make_view(L.v->get(), dev, sh_.dtype, int(pool_shape_.size()), pool_shape_.data());
    p.indptr = table(L.d_indptr, L.indptr, L.indptr_shape);
    p.indices = table(L.d_indices, L.indices, L.indices_shape);
    p.last_page_len = table(L.d_last, L.last, L.last_shape);
    p.indptr_host = L.indptr.data();
    p.last_page_len_host = L.last.data();
    p.indices_host = L.indices.data();
    p.new_tokens_written = written ? 1 : 0;
    return p;
  }

  runtime::HostServices& s_;
  EngineShape sh_;
  std::mt19937 rng_;
  std::vector<Layer> layers_;
  std::vector<int64_t> pool_shape_;
  int64_t released_ = 0;
};

}  // namespace sieve::engine_test
