// conformance_store_engine.hpp: the suite as the engine of an ENGINE_PAGES store.
#include "conformance_store_engine.hpp"

#include <algorithm>

#include "sieve/util/tensor.hpp"

namespace sieve::runtime::store_conform {

const char* EngineLayout::name() const {
  if (bit == SIEVE_KV_LAYOUT_NHD) return "nhd";
  if (bit == SIEVE_KV_LAYOUT_COMBINED) return combined_hnd ? "combined_hnd" : "combined";
  return "hnd";
}

EnginePool::EnginePool(HostServices& host, const Shape& s, int32_t layers, EngineLayout layout)
    : host_(host), shape_(s), layout_(layout), layers_(size_t(layers)) {
  const int64_t N = s.capacity, H = s.n_kv_heads, P = s.page_size, D = s.head_dim;
  const bool combined = layout.bit == SIEVE_KV_LAYOUT_COMBINED;
  const size_t bytes = size_t(N * H * P * D) * dtype_bytes(s.dtype) * (combined ? 2 : 1);
  const std::vector<unsigned char> zeros(bytes, 0);
  std::mt19937 rng(7);
  for (auto& l : layers_) {
    l.k = std::make_unique<DeviceBuffer>(host, bytes);
    l.k->upload(zeros.data(), bytes);
    if (!combined) {
      l.v = std::make_unique<DeviceBuffer>(host, bytes);
      l.v->upload(zeros.data(), bytes);
    }
    for (int32_t p = 0; p < N; ++p) l.free.push_back(p);
    std::shuffle(l.free.begin(), l.free.end(), rng);  // tables name pages out of order
    l.indptr = std::make_unique<DeviceBuffer>(host, size_t(N + 2) * 4);
    l.indices = std::make_unique<DeviceBuffer>(host, size_t(N + 1) * 4);
    l.last = std::make_unique<DeviceBuffer>(host, size_t(N + 1) * 4);
  }
  if (layout.bit == SIEVE_KV_LAYOUT_HND) {
    const int64_t shp[4] = {N, H, P, D};
    std::copy(shp, shp + 4, pool_shape_);
  } else if (layout.bit == SIEVE_KV_LAYOUT_NHD) {
    const int64_t shp[4] = {N, P, H, D};
    std::copy(shp, shp + 4, pool_shape_);
  } else {
    const int64_t shp[5] = {N, 2, layout.combined_hnd ? H : P, layout.combined_hnd ? P : H, D};
    std::copy(shp, shp + 5, pool_shape_);
  }
}

sieve_page_release_sink EnginePool::sink() { return {this, &EnginePool::release}; }

void EnginePool::release(void* ctx, int32_t layer, int32_t seq, const int32_t* pages, int32_t n) {
  auto* e = static_cast<EnginePool*>(ctx);
  auto it = e->seqs_.find({layer, seq});
  for (int32_t i = 0; i < n; ++i) {
    const int32_t p = pages ? pages[i] : -1;
    auto at = it == e->seqs_.end() ? std::vector<int32_t>::iterator{} : std::find(it->second.pages.begin(), it->second.pages.end(), p);
    if (it == e->seqs_.end() || at == it->second.pages.end()) {
      e->problems_.push_back("the release sink got page " + std::to_string(p) + ", not a page of sequence " +
                             std::to_string(seq) + " in layer " + std::to_string(layer));
      continue;
    }
    it->second.pages.erase(at);  // the engine drops exactly the pages Sieve evicted
    it->second.tokens -= e->shape_.page_size;
    e->layers_[size_t(layer)].free.push_back(p);
  }
}

bool EnginePool::reserve(int32_t layer, int32_t seq, int32_t tokens) {
  if (layer < 0 || layer >= int32_t(layers_.size())) return true;  // the store refuses the layer
  Seq& s = seqs_[{layer, seq}];
  auto& free = layers_[size_t(layer)].free;
  const size_t want = size_t((tokens + shape_.page_size - 1) / shape_.page_size);
  if (want > s.pages.size() && want - s.pages.size() > free.size()) return false;
  while (s.pages.size() < want) {
    s.pages.push_back(free.back());
    free.pop_back();
  }
  return true;
}

void EnginePool::trim(int32_t layer, int32_t seq) {
  auto it = seqs_.find({layer, seq});
  if (it == seqs_.end()) return;
  Seq& s = it->second;
  auto& free = layers_[size_t(layer)].free;
  const size_t keep = size_t((s.tokens + shape_.page_size - 1) / shape_.page_size);
  while (s.pages.size() > keep) {
    free.push_back(s.pages.back());
    s.pages.pop_back();
  }
}

int32_t EnginePool::tokens(int32_t layer, int32_t seq) const {
  auto it = seqs_.find({layer, seq});
  return it == seqs_.end() ? 0 : it->second.tokens;
}

void EnginePool::forget(int32_t seq) {
  for (auto it = seqs_.begin(); it != seqs_.end();) {
    if (it->first.second == seq) {
      auto& free = layers_[size_t(it->first.first)].free;
      free.insert(free.end(), it->second.pages.begin(), it->second.pages.end());
      it = seqs_.erase(it);
    } else {
      ++it;
    }
  }
}

sieve_status EnginePool::bind(const sieve_kv_store_api* api, sieve_kv_store* store, int32_t layer,
                              const std::vector<int32_t>& ids, const std::vector<int32_t>& tokens) {
  const int32_t B = int32_t(ids.size());
  const int32_t L = std::clamp<int32_t>(layer, 0, int32_t(layers_.size()) - 1);  // a bad layer is the store's to refuse
  Layer& l = layers_[size_t(L)];
  l.indptr_h.assign(1, 0);
  l.indices_h.clear();
  l.last_h.clear();
  for (int32_t b = 0; b < B; ++b) {
    auto it = seqs_.find({layer, ids[b]});
    const std::vector<int32_t> none;
    const auto& pages = it == seqs_.end() ? none : it->second.pages;
    const size_t n = size_t((tokens[size_t(b)] + shape_.page_size - 1) / shape_.page_size);
    l.indices_h.insert(l.indices_h.end(), pages.begin(), pages.begin() + ptrdiff_t(std::min(n, pages.size())));
    l.indptr_h.push_back(int32_t(l.indices_h.size()));
    l.last_h.push_back(n ? tokens[size_t(b)] - int32_t(n - 1) * shape_.page_size : 0);
  }
  l.indptr->upload(l.indptr_h.data(), l.indptr_h.size() * 4);
  if (!l.indices_h.empty()) l.indices->upload(l.indices_h.data(), l.indices_h.size() * 4);
  if (!l.last_h.empty()) l.last->upload(l.last_h.data(), l.last_h.size() * 4);
  indptr_shape_[0] = B + 1;
  indices_shape_[0] = int64_t(l.indices_h.size());
  last_shape_[0] = B;
  sieve_kv_pages p{};
  p.hdr = SIEVE_HEADER_INIT(sieve_kv_pages);
  p.layer = layer;
  p.batch = B;
  p.seq_ids = ids.data();
  p.layout = layout_.bit;
  p.combined_hnd = layout_.combined_hnd;
  const bool combined = layout_.bit == SIEVE_KV_LAYOUT_COMBINED;
  p.k_pool = make_view(l.k->data(), shape_.device, shape_.dtype, combined ? 5 : 4, pool_shape_);
  p.v_pool = combined ? DLTensor{} : make_view(l.v->data(), shape_.device, shape_.dtype, 4, pool_shape_);
  if (combined) p.v_pool.device = shape_.device;
  p.indptr = make_view(l.indptr->data(), shape_.device, kI32, 1, indptr_shape_);
  p.indices = make_view(l.indices->data(), shape_.device, kI32, 1, indices_shape_);
  p.last_page_len = make_view(l.last->data(), shape_.device, kI32, 1, last_shape_);
  p.indptr_host = l.indptr_h.data();
  p.last_page_len_host = l.last_h.data();
  p.indices_host = l.indices_h.data();
  p.new_tokens_written = 0;  // the store writes appended tokens into the pages the table names
  return api->bind_pages(store, &p);
}

}  // namespace sieve::runtime::store_conform
