// A stand-in engine's own paged KV cache (engine_pages.hpp).
#include "sieve/runtime/engine_pages.hpp"

#include <algorithm>
#include <numeric>

#include "sieve/runtime/session.hpp"
#include "sieve/util/error.hpp"

namespace sieve::runtime {

DeviceBytes::DeviceBytes(HostServices& s, size_t bytes) : s_(&s) {
  bytes = std::max<size_t>(bytes, 4);
  p_ = s.table()->alloc(s.table()->host_ctx, s.device(), bytes, 256);
  require(p_ != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
          "cannot allocate " + std::to_string(bytes) + " bytes on " + device_name(s.device()));
}
DeviceBytes::~DeviceBytes() { s_->table()->free(s_->table()->host_ctx, s_->device(), p_); }
void DeviceBytes::upload(const void* src, size_t n) {
  std::string e;
  require(n == 0 || s_->copy(p_, s_->device(), src, kCpu, n, &e), SIEVE_ERR_DEVICE, e);
}
void DeviceBytes::download(void* dst, size_t n) const {
  std::string e;
  require(n == 0 || s_->copy(dst, kCpu, p_, s_->device(), n, &e), SIEVE_ERR_DEVICE, e);
}

EnginePages::Shape EnginePages::Shape::for_store(const sieve_geometry& g, int32_t num_pages, const StoreEntry& store,
                                                 const ParamValues& values) {
  Shape sh;
  sh.layers = g.n_layers, sh.hkv = g.n_kv_heads, sh.head_dim = g.head_dim, sh.page = g.page_size;
  sh.num_pages = num_pages;
  sh.dtype = g.kv_dtype;
  const uint32_t in_use = store_layouts_in_use(store, values);
  sh.layout = (in_use & SIEVE_KV_LAYOUT_HND) || !in_use ? SIEVE_KV_LAYOUT_HND
              : (in_use & SIEVE_KV_LAYOUT_NHD)          ? SIEVE_KV_LAYOUT_NHD
                                                        : SIEVE_KV_LAYOUT_COMBINED;
  const int i = store.params().find("layout");
  sh.combined_hnd = sh.layout == SIEVE_KV_LAYOUT_COMBINED && i >= 0 && uint32_t(i) < values.size() &&
                    values.text(uint32_t(i)) == "combined_hnd";
  return sh;
}

EnginePages::EnginePages(HostServices& services, const Shape& shape) : s_(services), sh_(shape), rng_(shape.seed) {
  const bool combined = sh_.layout == SIEVE_KV_LAYOUT_COMBINED;
  const size_t pool = size_t(sh_.num_pages) * size_t(sh_.hkv) * size_t(sh_.page) * size_t(sh_.head_dim) * elem();
  for (int32_t l = 0; l < sh_.layers; ++l) {
    Layer& L = layers_.emplace_back();
    L.k = std::make_unique<DeviceBytes>(s_, pool * (combined ? 2 : 1));
    if (!combined) L.v = std::make_unique<DeviceBytes>(s_, pool);
    L.free.resize(size_t(sh_.num_pages));
    std::iota(L.free.begin(), L.free.end(), 0);
    std::shuffle(L.free.begin(), L.free.end(), rng_);
  }
  const int64_t N = sh_.num_pages, H = sh_.hkv, P = sh_.page, D = sh_.head_dim;
  if (combined) pool_shape_ = sh_.combined_hnd ? std::vector<int64_t>{N, 2, H, P, D} : std::vector<int64_t>{N, 2, P, H, D};
  else if (sh_.layout == SIEVE_KV_LAYOUT_NHD) pool_shape_ = {N, P, H, D};
  else pool_shape_ = {N, H, P, D};
}

int64_t EnginePages::offset(int32_t page, int kv, int32_t h, int32_t slot) const {
  const int64_t H = sh_.hkv, P = sh_.page, D = sh_.head_dim;
  if (sh_.layout == SIEVE_KV_LAYOUT_COMBINED)
    return sh_.combined_hnd ? (((int64_t(page) * 2 + kv) * H + h) * P + slot) * D
                            : (((int64_t(page) * 2 + kv) * P + slot) * H + h) * D;
  if (sh_.layout == SIEVE_KV_LAYOUT_NHD) return ((int64_t(page) * P + slot) * H + h) * D;
  return ((int64_t(page) * H + h) * P + slot) * D;
}

DeviceBytes& EnginePages::buffer(int32_t layer, int kv) const {
  const Layer& L = layers_[size_t(layer)];
  return (kv == 0 || !L.v) ? *L.k : *L.v;
}

sieve_page_release_sink EnginePages::sink() {
  return {this, [](void* ctx, int32_t layer, int32_t seq, const int32_t* pages, int32_t n) {
            auto* e = static_cast<EnginePages*>(ctx);
            Layer& L = e->layers_[size_t(layer)];
            auto& s = L.seqs[seq];
            for (int32_t i = 0; i < n; ++i) {
              auto it = std::find(s.pages.begin(), s.pages.end(), pages[i]);
              if (it == s.pages.end()) {
                ++e->bad_releases_;
                continue;
              }
              s.pages.erase(it);
              L.free.push_back(pages[i]);
              s.tokens -= e->sh_.page;
              ++e->released_;
            }
          }};
}

void EnginePages::forget(int32_t seq) {
  for (Layer& L : layers_) {
    auto it = L.seqs.find(seq);
    if (it == L.seqs.end()) continue;
    for (int32_t p : it->second.pages) L.free.push_back(p);
    L.seqs.erase(it);
  }
}

const sieve_kv_pages& EnginePages::step(int32_t layer, const std::vector<int32_t>& seq_ids,
                                        const std::vector<int32_t>& n_new, const HostTensor* k, const HostTensor* v) {
  require(layer >= 0 && layer < sh_.layers && n_new.size() == seq_ids.size() && (!k) == (!v),
          SIEVE_ERR_INVALID_ARGUMENT, "engine pages: bad step arguments");
  Layer& L = layers_[size_t(layer)];
  std::vector<unsigned char> raw(size_t(sh_.head_dim) * elem());
  L.indptr.assign(1, 0);
  L.indices.clear();
  L.last.clear();
  for (size_t b = 0, row = 0; b < seq_ids.size(); ++b) {
    Seq& s = L.seqs[seq_ids[b]];
    for (int32_t i = 0; i < n_new[b]; ++i, ++row) {
      if (s.tokens % sh_.page == 0) {
        require(!L.free.empty(), SIEVE_ERR_CAPACITY, "engine pages: pool full");
        s.pages.push_back(L.free.back());
        L.free.pop_back();
      }
      const int32_t page = s.pages[size_t(s.tokens / sh_.page)], slot = s.tokens % sh_.page;
      if (k)
        for (int kv = 0; kv < 2; ++kv)
          for (int32_t h = 0; h < sh_.hkv; ++h) {
            const DLTensor& src = (kv ? v : k)->dl();
            const int64_t at = (int64_t(row) * sh_.hkv + h) * sh_.head_dim;
            for (int32_t d = 0; d < sh_.head_dim; ++d)
              store_float(raw.data(), sh_.dtype, d, load_float(src.data, src.dtype, at + d));
            std::string e;
            require(s_.copy(static_cast<char*>(buffer(layer, kv).get()) + offset(page, kv, h, slot) * int64_t(elem()),
                            s_.device(), raw.data(), kCpu, raw.size(), &e),
                    SIEVE_ERR_DEVICE, e);
          }
      ++s.tokens;
    }
    L.indices.insert(L.indices.end(), s.pages.begin(), s.pages.end());
    L.indptr.push_back(int32_t(L.indices.size()));
    L.last.push_back(s.pages.empty() ? 0 : (s.tokens - 1) % sh_.page + 1);
  }
  return bind(layer, seq_ids, k != nullptr);
}

const sieve_kv_pages& EnginePages::table(int32_t layer, const std::vector<int32_t>& seq_ids) {
  return step(layer, seq_ids, std::vector<int32_t>(seq_ids.size(), 0));
}

std::vector<float> EnginePages::row(int32_t layer, int kv, int32_t seq, int32_t t, int32_t h) const {
  const Seq& s = layers_[size_t(layer)].seqs.at(seq);
  const int32_t page = s.pages.at(size_t(t / sh_.page));
  std::vector<unsigned char> raw(size_t(sh_.head_dim) * elem());
  std::string e;
  require(s_.copy(raw.data(), kCpu,
                  static_cast<char*>(buffer(layer, kv).get()) + offset(page, kv, h, t % sh_.page) * int64_t(elem()),
                  s_.device(), raw.size(), &e),
          SIEVE_ERR_DEVICE, e);
  std::vector<float> out(raw.size() / elem());
  for (size_t d = 0; d < out.size(); ++d) out[d] = load_float(raw.data(), sh_.dtype, int64_t(d));
  return out;
}

const sieve_kv_pages& EnginePages::bind(int32_t layer, const std::vector<int32_t>& seq_ids, bool written) {
  Layer& L = layers_[size_t(layer)];
  const DLDevice dev = s_.device();
  L.seq_ids = seq_ids;
  auto table = [&](std::unique_ptr<DeviceBytes>& d, const std::vector<int32_t>& h, std::array<int64_t, 1>& shape) {
    d = std::make_unique<DeviceBytes>(s_, h.size() * 4);
    d->upload(h.data(), h.size() * 4);
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

}  // namespace sieve::runtime
