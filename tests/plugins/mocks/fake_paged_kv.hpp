// FakePagedKv: a small in-memory paged KV store on the host, for tests that need real page tables
// (and real K/V bytes) without the core's stores. FlashInfer layout as kv_store.h describes:
// per layer a pool of `pages_per_layer` pages [n_kv_heads, page_size, head_dim] of the configured
// dtype, a free list, and per (sequence, layer) the list of physical pages in token order.
// Sidecars are zeroed when a page is (re)allocated; eviction removes pages from a sequence's list
// and returns them to the pool. set_layout keeps the pages as an engine does instead (NHD, or K
// and V halves of one combined pool), handing strided views (ABI 1.1). Every method returns a status and sets last_error() on failure.
// MockKvStore (mock_kv_store.hpp) puts the sieve_kv_store_api table in front of it.
#pragma once
#include <sieve/sieve.h>
#include <sieve/util/page_layout.hpp>
#include <sieve/util/tensor.hpp>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace sieve::testing {

class FakePagedKv {
 public:
  explicit FakePagedKv(const sieve_kv_config& config) : config_(config) {
    const sieve_geometry& g = config_.geometry;
    elem_ = sieve::dtype_bytes(g.kv_dtype);
    page_elems_ = size_t(g.n_kv_heads) * g.page_size * g.head_dim;
    layers_.resize(size_t(g.n_layers));
    for (Layer& l : layers_) {
      const size_t bytes = size_t(config_.pages_per_layer) * page_elems_ * elem_;
      l.k.assign(bytes, 0);
      l.v.assign(bytes, 0);
      if (config_.keep_pre_rope_k) l.k_pre.assign(bytes, 0);
      for (int32_t p = config_.pages_per_layer - 1; p >= 0; --p) l.free_pages.push_back(p);
    }
    page_shape_ = {config_.pages_per_layer, g.n_kv_heads, g.page_size, g.head_dim};
    at_ = compact_hnd_strides(g.n_kv_heads, g.page_size, g.head_dim);
  }

  // Keeps the pages in `layout` (before any append): views carry its strides, and in a combined
  // pool V is the same buffer at a byte_offset of one K page. Pre-RoPE keys use K's strides.
  void set_layout(sieve::KvLayout layout) {
    const sieve_geometry& g = config_.geometry;
    strided_ = true;
    at_ = layout_strides(layout, g.n_kv_heads, g.page_size, g.head_dim);
    stride_array_ = {at_.page, at_.head, at_.token, 1};
    combined_ = layout.bit == SIEVE_KV_LAYOUT_COMBINED;
    const size_t bytes = size_t(config_.pages_per_layer) * page_elems_ * elem_ * (combined_ ? 2 : 1);
    for (Layer& l : layers_) {
      l.k.assign(bytes, 0);
      l.v.assign(combined_ ? 0 : bytes, 0);
      if (config_.keep_pre_rope_k) l.k_pre.assign(bytes, 0);
    }
  }

  const sieve_kv_config& config() const { return config_; }
  const std::string& last_error() const { return error_; }

  sieve_status add_sequence(int32_t* seq_id) {
    if (!seq_id) return fail(SIEVE_ERR_INVALID_ARGUMENT, "add_sequence: seq_id is NULL");
    Sequence s;
    s.pages.resize(layers_.size());
    s.len.assign(layers_.size(), 0);
    *seq_id = next_id_++;
    seqs_[*seq_id] = std::move(s);
    return SIEVE_OK;
  }

  sieve_status remove_sequence(int32_t seq_id) {
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end()) return fail(SIEVE_ERR_NOT_FOUND, "remove_sequence: unknown sequence ", seq_id);
    for (size_t l = 0; l < layers_.size(); ++l)
      for (int32_t p : it->second.pages[l]) layers_[l].free_pages.push_back(p);
    seqs_.erase(it);
    return SIEVE_OK;
  }

  sieve_status seq_len(int32_t layer, int32_t seq_id, int32_t* len) const {
    const Sequence* s = find(layer, seq_id);
    if (!s || !len) return SIEVE_ERR_NOT_FOUND;
    *len = s->len[size_t(layer)];
    return SIEVE_OK;
  }

  sieve_status append(const sieve_kv_append* a) {
    if (!a || !a->seq_ids || !a->token_indptr || !a->k || !a->v)
      return fail(SIEVE_ERR_INVALID_ARGUMENT, "append: NULL argument");
    if (a->layer < 0 || size_t(a->layer) >= layers_.size())
      return fail(SIEVE_ERR_NOT_FOUND, "append: layer ", a->layer, " out of range");
    const sieve_geometry& g = config_.geometry;
    Layer& layer = layers_[size_t(a->layer)];
    for (int32_t b = 0; b < a->batch; ++b) {
      Sequence* s = find(a->layer, a->seq_ids[b]);
      if (!s) return fail(SIEVE_ERR_NOT_FOUND, "append: unknown sequence ", a->seq_ids[b]);
      auto& pages = s->pages[size_t(a->layer)];
      int32_t& len = s->len[size_t(a->layer)];
      for (int32_t tok = a->token_indptr[b]; tok < a->token_indptr[b + 1]; ++tok) {
        // The last page is full exactly when every resident page is (evictions keep pages full).
        if (int64_t(len) == int64_t(pages.size()) * g.page_size) {
          if (layer.free_pages.empty())
            return fail(SIEVE_ERR_CAPACITY, "append: layer ", a->layer, " has no free page");
          const int32_t p = layer.free_pages.back();
          layer.free_pages.pop_back();
          for (auto& [slot, sc] : sidecars_) {
            auto& bytes = layer.sidecars[slot];
            std::fill_n(bytes.begin() + ptrdiff_t(size_t(p) * sc.page_bytes), sc.page_bytes, 0);
          }
          pages.push_back(p);
        }
        const int32_t page = pages.back(), slot = len % g.page_size;
        for (int32_t h = 0; h < g.n_kv_heads; ++h)
          for (int32_t d = 0; d < g.head_dim; ++d) {
            const int64_t dst = at_.row(page, h, slot) + d;
            sieve::store_float(layer.k.data(), g.kv_dtype, dst, load(*a->k, tok, h, d));
            sieve::store_float(v_data(layer), g.kv_dtype, dst, load(*a->v, tok, h, d));
            if (config_.keep_pre_rope_k && a->k_pre_rope)
              sieve::store_float(layer.k_pre.data(), g.kv_dtype, int64_t(dst),
                                 load(*a->k_pre_rope, tok, h, d));
          }
        ++len;
      }
    }
    return SIEVE_OK;
  }

  // Valid until the next append/evict/remove, like a real store's.
  sieve_status view(int32_t layer_id, const int32_t* seq_ids, int32_t batch, sieve_paged_kv* out) {
    if (!out || (batch > 0 && !seq_ids) || batch < 0)
      return fail(SIEVE_ERR_INVALID_ARGUMENT, "view: bad arguments");
    if (layer_id < 0 || size_t(layer_id) >= layers_.size())
      return fail(SIEVE_ERR_NOT_FOUND, "view: layer ", layer_id, " out of range");
    Layer& layer = layers_[size_t(layer_id)];
    const int32_t page_size = config_.geometry.page_size;
    layer.indptr.assign(1, 0);
    layer.indices.clear();
    layer.last_page_len.clear();
    for (int32_t b = 0; b < batch; ++b) {
      const Sequence* s = find(layer_id, seq_ids[b]);
      if (!s) return fail(SIEVE_ERR_NOT_FOUND, "view: unknown sequence ", seq_ids[b]);
      const auto& pages = s->pages[size_t(layer_id)];
      const int32_t len = s->len[size_t(layer_id)];
      layer.indices.insert(layer.indices.end(), pages.begin(), pages.end());
      layer.indptr.push_back(int32_t(layer.indices.size()));
      layer.last_page_len.push_back(pages.empty() ? 0 : len - int32_t(pages.size() - 1) * page_size);
    }
    layer.shapes = {batch + 1, int64_t(layer.indices.size()), batch};
    const DLDevice cpu = sieve::kCpu;
    *out = sieve_paged_kv{};
    out->hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
    out->batch = batch;
    out->page_size = page_size;
    const DLDataType dt = config_.geometry.kv_dtype;
    int64_t* strides = strided_ ? stride_array_.data() : nullptr;
    out->k_pages = sieve::make_view(layer.k.data(), cpu, dt, 4, page_shape_.data(), strides);
    out->v_pages = sieve::make_view(combined_ ? layer.k.data() : layer.v.data(), cpu, dt, 4,
                                    page_shape_.data(), strides);
    out->v_pages.byte_offset = combined_ ? page_elems_ * elem_ : 0;
    out->indptr = sieve::make_view(layer.indptr.data(), cpu, sieve::kI32, 1, &layer.shapes[0]);
    out->indices = sieve::make_view(layer.indices.data(), cpu, sieve::kI32, 1, &layer.shapes[1]);
    out->last_page_len = sieve::make_view(layer.last_page_len.data(), cpu, sieve::kI32, 1, &layer.shapes[2]);
    out->indptr_host = layer.indptr.data();
    out->last_page_len_host = layer.last_page_len.data();
    out->k_pre_rope_pages = sieve::make_view(config_.keep_pre_rope_k ? layer.k_pre.data() : nullptr,
                                             cpu, dt, 4, page_shape_.data(), strides);
    return SIEVE_OK;
  }

  sieve_status register_sidecar(const sieve_sidecar_desc* desc, int32_t* slot) {
    if (!desc || !slot || !desc->name || desc->elems_per_head <= 0)
      return fail(SIEVE_ERR_INVALID_ARGUMENT, "register_sidecar: bad descriptor");
    for (auto& [s, sc] : sidecars_)
      if (sc.name == desc->name)
        return fail(SIEVE_ERR_INVALID_ARGUMENT, "register_sidecar: '", desc->name, "' exists");
    Sidecar sc;
    sc.name = desc->name;
    sc.dtype = desc->dtype;
    sc.shape = {config_.pages_per_layer, config_.geometry.n_kv_heads, desc->elems_per_head};
    sc.page_bytes = size_t(config_.geometry.n_kv_heads) * desc->elems_per_head * sieve::dtype_bytes(desc->dtype);
    *slot = int32_t(sidecars_.size());
    for (Layer& l : layers_) l.sidecars[*slot].assign(sc.page_bytes * size_t(config_.pages_per_layer), 0);
    sidecars_[*slot] = std::move(sc);
    return SIEVE_OK;
  }

  sieve_status sidecar(int32_t layer, int32_t slot, DLTensor* out) {
    auto it = sidecars_.find(slot);
    if (!out || it == sidecars_.end() || layer < 0 || size_t(layer) >= layers_.size())
      return fail(SIEVE_ERR_NOT_FOUND, "sidecar: no slot ", slot, " in layer ", layer);
    *out = sieve::make_view(layers_[size_t(layer)].sidecars[slot].data(), sieve::kCpu,
                            it->second.dtype, 3, it->second.shape.data());
    return SIEVE_OK;
  }

  sieve_status evict(int32_t layer, int32_t seq_id, const int32_t* logical, int32_t n,
                     uint64_t* freed_bytes) {
    Sequence* s = find(layer, seq_id);
    if (!s) return fail(SIEVE_ERR_NOT_FOUND, "evict: unknown sequence ", seq_id, " / layer ", layer);
    if (n > 0 && !logical) return fail(SIEVE_ERR_INVALID_ARGUMENT, "evict: NULL page list");
    auto& pages = s->pages[size_t(layer)];
    std::vector<int32_t> sorted(logical, logical + std::max(n, 0));
    std::sort(sorted.begin(), sorted.end());
    for (size_t i = 0; i < sorted.size(); ++i) {
      if (sorted[i] < 0 || sorted[i] + 1 >= int32_t(pages.size()))
        return fail(SIEVE_ERR_INVALID_ARGUMENT, "evict: logical page ", sorted[i],
                    " is not an evictable page of a ", pages.size(), "-page sequence");
      if (i && sorted[i] == sorted[i - 1])
        return fail(SIEVE_ERR_INVALID_ARGUMENT, "evict: page ", sorted[i], " listed twice");
    }
    for (auto it = sorted.rbegin(); it != sorted.rend(); ++it) {
      layers_[size_t(layer)].free_pages.push_back(pages[size_t(*it)]);
      pages.erase(pages.begin() + *it);
    }
    s->len[size_t(layer)] -= int32_t(sorted.size()) * config_.geometry.page_size;
    if (freed_bytes) *freed_bytes = sorted.size() * page_bytes();
    return SIEVE_OK;
  }

  sieve_status bytes_in_use(uint64_t* bytes) const {
    if (!bytes) return SIEVE_ERR_INVALID_ARGUMENT;
    uint64_t pages = 0;
    for (const auto& [id, s] : seqs_)
      for (const auto& p : s.pages) pages += p.size();
    *bytes = pages * page_bytes();
    return SIEVE_OK;
  }

  // ---- test conveniences ----------------------------------------------------------------------
  // Physical pages of a sequence in one layer, in logical order.
  const std::vector<int32_t>& pages(int32_t layer, int32_t seq_id) const {
    return seqs_.at(seq_id).pages.at(size_t(layer));
  }
  // Append n tokens of fresh random K/V (uniform in [-1, 1), f32 input) to every layer.
  sieve_status append_random(int32_t seq_id, int32_t n_tokens, std::mt19937& rng) {
    const sieve_geometry& g = config_.geometry;
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    sieve::HostTensor k({n_tokens, g.n_kv_heads, g.head_dim}, sieve::kF32), v = k, kp = k;
    for (int32_t layer = 0; layer < g.n_layers; ++layer) {
      for (int64_t i = 0; i < k.numel(); ++i) {
        k.set(i, u(rng));
        v.set(i, u(rng));
        kp.set(i, u(rng));
      }
      const int32_t indptr[2] = {0, n_tokens};
      sieve_kv_append a{};
      a.hdr = SIEVE_HEADER_INIT(sieve_kv_append);
      a.layer = layer;
      a.batch = 1;
      a.seq_ids = &seq_id;
      a.token_indptr = indptr;
      a.k = &k.dl();
      a.v = &v.dl();
      a.k_pre_rope = &kp.dl();
      if (sieve_status s = append(&a); s != SIEVE_OK) return s;
    }
    return SIEVE_OK;
  }

 private:
  struct Sequence {
    std::vector<std::vector<int32_t>> pages;  // [layer] -> physical ids
    std::vector<int32_t> len;                 // [layer] -> resident tokens
  };
  struct Sidecar {
    std::string name;
    DLDataType dtype;
    std::vector<int64_t> shape;
    size_t page_bytes;
  };
  struct Layer {
    std::vector<unsigned char> k, v, k_pre;
    std::vector<int32_t> free_pages;
    std::map<int32_t, std::vector<unsigned char>> sidecars;
    std::vector<int32_t> indptr, indices, last_page_len;  // the last view
    std::vector<int64_t> shapes{0, 0, 0};
  };

  template <class... A>
  sieve_status fail(sieve_status s, A&&... parts) {
    error_.clear();
    ((error_ += to_text(parts)), ...);
    return s;
  }
  template <class T>
  static std::string to_text(const T& v) {
    if constexpr (std::is_convertible_v<T, std::string>) return std::string(v);
    else return std::to_string(v);
  }
  Sequence* find(int32_t layer, int32_t seq_id) {
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end() || layer < 0 || size_t(layer) >= layers_.size()) return nullptr;
    return &it->second;
  }
  const Sequence* find(int32_t layer, int32_t seq_id) const {
    return const_cast<FakePagedKv*>(this)->find(layer, seq_id);
  }
  static float load(const DLTensor& t, int64_t tok, int32_t h, int32_t d) {
    const int64_t i = tok * sieve::stride(t, 0) + h * sieve::stride(t, 1) + d * sieve::stride(t, 2);
    return sieve::load_float(sieve::data_ptr(t), t.dtype, i);
  }
  uint64_t page_bytes() const {
    uint64_t b = page_elems_ * elem_ * (config_.keep_pre_rope_k ? 3 : 2);
    for (const auto& [slot, sc] : sidecars_) b += sc.page_bytes;
    return b;
  }

  unsigned char* v_data(Layer& l) { return combined_ ? l.k.data() + page_elems_ * elem_ : l.v.data(); }

  sieve_kv_config config_;
  size_t elem_ = 0, page_elems_ = 0;
  std::vector<int64_t> page_shape_;
  sieve::PageStrides at_;                  // where a row lives (compact HND unless set_layout)
  std::vector<int64_t> stride_array_;      // the views' strides after set_layout
  bool strided_ = false, combined_ = false;
  std::vector<Layer> layers_;
  std::map<int32_t, Sequence> seqs_;
  std::map<int32_t, Sidecar> sidecars_;
  int32_t next_id_ = 0;
  std::string error_;
};

}  // namespace sieve::testing
