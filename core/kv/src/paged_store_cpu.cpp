// Paged KV store in host memory.
//
// Each layer's K, V (and pre-RoPE K) pool is one reserved mapping of pages_per_layer pages
// (MAP_NORESERVE): the kernel commits memory only when a page is first written, so a large pool
// costs nothing until used, and eviction really returns memory (madvise(MADV_DONTNEED) on every
// OS page that the freed KV pages cover completely; the pages read as zero afterwards).
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <memory>

#include "sieve/kv/paged_store.hpp"
#include "sieve/kv/paged_store_api.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kv {
namespace {

class Mapping {
 public:
  Mapping() = default;
  explicit Mapping(size_t bytes) : bytes_(bytes) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    require(p != MAP_FAILED, SIEVE_ERR_OUT_OF_MEMORY,
            "KV store: cannot reserve " + std::to_string(bytes) + " bytes of address space");
    data_ = static_cast<char*>(p);
  }
  ~Mapping() {
    if (data_) munmap(data_, bytes_);
  }
  Mapping(Mapping&& o) noexcept : data_(o.data_), bytes_(o.bytes_) { o.data_ = nullptr; }
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  char* data() const { return data_; }
  // Give back the OS pages lying entirely inside [offset, offset + len).
  void release(size_t offset, size_t len) {
    static const size_t os_page = size_t(sysconf(_SC_PAGESIZE));
    size_t lo = (offset + os_page - 1) / os_page * os_page;
    size_t hi = (offset + len) / os_page * os_page;
    if (hi > lo) madvise(data_ + lo, hi - lo, MADV_DONTNEED);
  }

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

class PagedCpuStore final : public PagedStoreBase {
 public:
  PagedCpuStore(const sieve_host_services* services, const sieve_kv_config& config)
      : PagedStoreBase(services, config) {
    require(config.geometry.device.device_type == kDLCPU, SIEVE_ERR_INVALID_ARGUMENT,
            "paged-cpu store: geometry.device must be cpu, got " + device_name(config.geometry.device));
    allocate_pools();
  }

 protected:
  struct Layer {
    Mapping k, v, k_pre;
    std::array<int64_t, 4> page_shape{};
    std::array<int64_t, 1> indptr_shape{}, indices_shape{}, last_shape{};
    std::vector<std::vector<unsigned char>> sidecars;  // per slot
    std::vector<std::array<int64_t, 3>> sidecar_shapes;
    std::array<std::vector<int32_t>, 2> indices;  // the current view's and the previous one's
    int current = 0;
  };

  void allocate_pools() override {
    const auto& g = geometry();
    const size_t pool = size_t(config().pages_per_layer) * page_elems() * elem_bytes();
    layers_.resize(size_t(g.n_layers));
    for (auto& l : layers_) {
      l.k = Mapping(pool);
      l.v = Mapping(pool);
      if (config().keep_pre_rope_k) l.k_pre = Mapping(pool);
      l.page_shape = {config().pages_per_layer, g.n_kv_heads, g.page_size, g.head_dim};
    }
  }

  // The view's last_page_len is the base's host array itself: publishing `view_last` is the
  // base's copy into it.
  bool write_tokens(int32_t layer, const std::vector<TokenSlot>& slots, const sieve_kv_append& a,
                    const int32_t* view_last) override {
    const auto& g = geometry();
    Layer& l = layers_[size_t(layer)];
    auto copy = [&](const DLTensor* src, const Mapping& dst) {
      scatter_tokens_cpu(slots, *src, compact_hnd(dst.data(), g.n_kv_heads, g.page_size, g.head_dim), g.kv_dtype,
                         g.n_kv_heads, g.head_dim);
    };
    copy(a.k, l.k);
    copy(a.v, l.v);
    if (config().keep_pre_rope_k) copy(a.k_pre_rope, l.k_pre);
    return view_last != nullptr;
  }

  void allocate_sidecar(int32_t slot) override {
    const Sidecar& s = sidecars_[size_t(slot)];
    for (auto& l : layers_) {
      l.sidecars.emplace_back(size_t(config().pages_per_layer) * s.bytes_per_page, 0);
      l.sidecar_shapes.push_back({config().pages_per_layer, geometry().n_kv_heads, s.elems_per_head});
    }
  }

  void clear_sidecar_page(int32_t layer, int32_t slot, int32_t page) override {
    const Sidecar& s = sidecars_[size_t(slot)];
    auto& buf = layers_[size_t(layer)].sidecars[size_t(slot)];
    std::memset(buf.data() + size_t(page) * s.bytes_per_page, 0, s.bytes_per_page);
  }

  void release_pages(int32_t layer, const std::vector<int32_t>& pages) override {
    Layer& l = layers_[size_t(layer)];
    const size_t bytes = page_elems() * elem_bytes();
    for (int32_t p : pages) {
      l.k.release(size_t(p) * bytes, bytes);
      l.v.release(size_t(p) * bytes, bytes);
      if (config().keep_pre_rope_k) l.k_pre.release(size_t(p) * bytes, bytes);
    }
  }

  // The indices are merged from the previous view's (view_delta.hpp) into the other of two
  // buffers, as the CUDA store does on the device; indptr and last_page_len borrow the base's
  // packed array.
  void publish_view(int32_t layer, const ViewDelta& d, sieve_paged_kv* out) override {
    Layer& l = layers_[size_t(layer)];
    if (d.change == ViewChange::kPages) {
      std::vector<int32_t>& next = l.indices[l.current ^ 1];
      next.resize(size_t(d.nnz));
      apply_view_delta(d.packed, d.batch, l.indices[l.current].data(), next.data());
      l.current ^= 1;
    }
    const DLDataType dt = geometry().kv_dtype;
    out->k_pages = make_view(l.k.data(), kCpu, dt, 4, l.page_shape.data());
    out->v_pages = make_view(l.v.data(), kCpu, dt, 4, l.page_shape.data());
    out->k_pre_rope_pages = make_view(config().keep_pre_rope_k ? l.k_pre.data() : nullptr, kCpu, dt, 4,
                                      l.page_shape.data());
    l.indptr_shape[0] = int64_t(d.batch) + 1;
    l.indices_shape[0] = int64_t(d.nnz);
    l.last_shape[0] = int64_t(d.batch);
    // An empty list still needs a valid pointer.
    static int32_t empty = 0;
    int32_t* packed = const_cast<int32_t*>(d.packed);
    std::vector<int32_t>& indices = l.indices[l.current];
    out->indptr = make_view(packed, kCpu, kI32, 1, l.indptr_shape.data());
    out->indices = make_view(indices.empty() ? &empty : indices.data(), kCpu, kI32, 1, l.indices_shape.data());
    out->last_page_len = make_view(d.batch ? packed + ViewDelta::last_at(d.batch) : &empty, kCpu, kI32, 1,
                                   l.last_shape.data());
    out->indptr_host = packed;
    out->last_page_len_host = packed + ViewDelta::last_at(d.batch);
  }

  void sidecar_tensor(int32_t layer, int32_t slot, DLTensor* out) override {
    Layer& l = layers_[size_t(layer)];
    *out = make_view(l.sidecars[size_t(slot)].data(), kCpu, sidecars_[size_t(slot)].dtype, 3,
                     l.sidecar_shapes[size_t(slot)].data());
  }

  DLDevice device() const override { return kCpu; }

 private:
  std::vector<Layer> layers_;
};

}  // namespace

const sieve_kv_store_api* paged_cpu_store_api() { return make_store_api<PagedCpuStore>("paged-cpu"); }

}  // namespace sieve::kv
