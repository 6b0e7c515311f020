// Paged KV store on a CUDA device.
//
// Memory: each layer's K, V (and pre-RoPE K) pool of pages_per_layer pages, the per-layer view
// arrays (the packed view description of view_delta.hpp, whose first 2 * batch + 1 entries are
// the view's indptr and last_page_len, [5 * max_batch + 2 + pages_per_layer]; two indices
// buffers [pages_per_layer], the current view's and the previous one's) and every sidecar are
// allocated once, in the constructor / register_sidecar, through the host's services->alloc on {kDLCUDA, device}, and freed through services->free in the destructor.
// Eviction returns pages to the free list, so bytes_in_use drops and the pages are reused by
// later appends, but the device pool itself stays reserved (unlike the CPU store, which gives
// evicted pages back to the OS): a device pool cannot be partially released, and a page-granular
// device allocator would put allocation on the hot path.
//
// Work: everything is enqueued on services->cuda_stream(host_ctx) and nothing synchronises.
//   - append scatters the new tokens of K, V and pre-RoPE K in one kernel per chunk of slots
//     (one per dtype when they differ; dtype conversion f32 / f16 / bf16 -> storage dtype,
//     strided input rows allowed); a decode step's launch also writes the layer's view
//     last_page_len when the base knows it (write_tokens' view_last), so that view has nothing
//     left to publish;
//   - view publishes what changed in the layer's page table since its previous view
//     (view_delta.hpp): nothing, the last_page_len slice, or the packed description with the
//     indices merged from the previous buffer into the other, in one kernel; host work and
//     bytes are O(batch + pages added), not O(pages), except for a full rebuild (first view,
//     another batch, after an eviction);
//   - a sidecar's slots of a newly taken page are zeroed with cudaMemsetAsync (runs of
//     consecutive page ids merged into one memset).
//
// Host -> device without a synchronisation: a decode step's slot list (up to 128 tokens) and
// view change (up to 900 ints) ride in the kernel's parameters, so a decode step copies nothing
// and never waits; larger ones go through the pinned staging ring of token_writer.cuh, which the
// engine-pool store shares.
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <vector>

#include "sieve/kv/paged_store.hpp"
#include "sieve/kv/paged_store_api.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"
#include "token_writer.cuh"

namespace sieve::kv {
namespace {

void check_cuda(cudaError_t e, const char* what) { kv::check_cuda(e, "paged-cuda store", what); }

// ---- the view's indices -----------------------------------------------------------------------

// A small int32 array carried in a kernel's parameters: what a decode step changes in a view
// (its last_page_len, or the packed description of a page boundary) reaches the device without a
// copy, a staging buffer or an event.
constexpr int32_t kInlineInts = 900;  // 3.6 KB of the 4 KB of kernel parameters
struct InlineInts {
  int32_t n;
  int32_t v[kInlineInts];
};

static_assert(sizeof(InlineInts) + 4 * sizeof(void*) + 2 * sizeof(int32_t) <= 4096,
              "publish_view_table's parameters must stay within 4 KB");

// Writes small.v[0, small.n) to table[0, small.n), and indices[0, nnz) merged from `previous`
// by the packed description: `packed` (device) when given, else small.v itself.
__global__ void publish_view_table(const __grid_constant__ InlineInts small, const int32_t* packed, int32_t* table,
                                   int32_t batch, int32_t nnz, const int32_t* previous, int32_t* indices) {
  const int32_t* desc = packed ? packed : small.v;
  const int32_t total = max(nnz, small.n);
  for (int32_t i = int32_t(blockIdx.x * blockDim.x + threadIdx.x); i < total; i += int32_t(gridDim.x * blockDim.x)) {
    if (i < small.n) table[i] = small.v[i];
    if (i < nnz) indices[i] = merged_page(desc, batch, previous, i);
  }
}

// ---- the store ---------------------------------------------------------------------------------

class PagedCudaStore final : public PagedStoreBase {
 public:
  PagedCudaStore(const sieve_host_services* services, const sieve_kv_config& config)
      : PagedStoreBase(services, config) {
    const auto& g = config.geometry;
    require(g.device.device_type == kDLCUDA, SIEVE_ERR_INVALID_ARGUMENT,
            "paged-cuda store: geometry.device must be cuda, got " + device_name(g.device));
    require(services && services->hdr.struct_size >= sizeof(sieve_host_services) && services->alloc &&
                services->free,
            SIEVE_ERR_INVALID_ARGUMENT, "paged-cuda store: host services with alloc/free are required");
    require(g.max_batch > 0, SIEVE_ERR_INVALID_ARGUMENT,
            "paged-cuda store: geometry.max_batch must be > 0 (it sizes the view arrays), got " +
                std::to_string(g.max_batch));
    int n = 0;
    check_cuda(cudaGetDeviceCount(&n), "cudaGetDeviceCount");
    require(g.device.device_id >= 0 && g.device.device_id < n, SIEVE_ERR_INVALID_ARGUMENT,
            "paged-cuda store: " + device_name(g.device) + " does not exist (" + std::to_string(n) +
                " CUDA devices)");
    stream_ = services->cuda_stream ? static_cast<cudaStream_t>(services->cuda_stream(services->host_ctx)) : nullptr;
    try {
      allocate_pools();
    } catch (...) {
      release_all();
      throw;
    }
  }
  ~PagedCudaStore() override { release_all(); }

 protected:
  struct Layer {
    void* k = nullptr;
    void* v = nullptr;
    void* k_pre = nullptr;
    int32_t* packed = nullptr;  // the view's packed description (indptr, last_page_len first)
    std::array<int32_t*, 2> indices{};  // the current view's indices and the previous one's
    int current = 0;
    std::array<int64_t, 4> page_shape{};
    std::array<int64_t, 1> indptr_shape{}, indices_shape{}, last_shape{};
    std::vector<void*> sidecars;  // per slot
    std::vector<std::array<int64_t, 3>> sidecar_shapes;
  };

  DLDevice device() const override { return geometry().device; }

  void allocate_pools() override {
    const auto& g = geometry();
    DeviceScope scope(g.device.device_id);
    const size_t pool = size_t(config().pages_per_layer) * page_elems() * elem_bytes();
    layers_.resize(size_t(g.n_layers));
    for (auto& l : layers_) {
      l.k = device_alloc(pool, "K pages");
      l.v = device_alloc(pool, "V pages");
      if (config().keep_pre_rope_k) l.k_pre = device_alloc(pool, "pre-RoPE K pages");
      const size_t packed = ViewDelta::packed_size(g.max_batch, config().pages_per_layer);
      l.packed = static_cast<int32_t*>(device_alloc(sizeof(int32_t) * packed, "view page table"));
      for (auto& ix : l.indices)
        ix = static_cast<int32_t*>(device_alloc(sizeof(int32_t) * size_t(config().pages_per_layer), "view indices"));
      l.page_shape = {config().pages_per_layer, g.n_kv_heads, g.page_size, g.head_dim};
    }
    writer_ = std::make_unique<TokenWriter>(services_, g.device, stream_, "paged-cuda store");
  }

  bool write_tokens(int32_t layer, const std::vector<TokenSlot>& slots, const sieve_kv_append& a,
                    const int32_t* view_last) override {
    const auto& g = geometry();
    DeviceScope scope(g.device.device_id);
    flush_sidecar_clears();
    Layer& l = layers_[size_t(layer)];
    const DLTensor* inputs[3] = {a.k, a.v, config().keep_pre_rope_k ? a.k_pre_rope : nullptr};
    const PoolTarget targets[3] = {compact_hnd(l.k, g.n_kv_heads, g.page_size, g.head_dim),
                                   compact_hnd(l.v, g.n_kv_heads, g.page_size, g.head_dim),
                                   compact_hnd(l.k_pre, g.n_kv_heads, g.page_size, g.head_dim)};
    return writer_->write(slots, inputs, targets, g.kv_dtype, g.n_kv_heads, g.head_dim,
                          l.packed + ViewDelta::last_at(a.batch), view_last, a.batch);
  }

  void allocate_sidecar(int32_t slot) override {
    const Sidecar& s = sidecars_[size_t(slot)];
    DeviceScope scope(geometry().device.device_id);
    const size_t bytes = size_t(config().pages_per_layer) * s.bytes_per_page;
    size_t done = 0;
    for (auto& l : layers_) {  // no reallocation (and no throw) inside the loop below
      l.sidecars.reserve(l.sidecars.size() + 1);
      l.sidecar_shapes.reserve(l.sidecar_shapes.size() + 1);
    }
    try {
      for (auto& l : layers_) {
        void* p = raw_alloc(bytes, "sidecar");
        l.sidecars.push_back(p);
        l.sidecar_shapes.push_back({config().pages_per_layer, geometry().n_kv_heads, s.elems_per_head});
        ++done;
        check_cuda(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync(sidecar)");
      }
    } catch (...) {  // leave no half-registered slot behind (the base pops the descriptor)
      for (size_t i = 0; i < done; ++i) {
        services_->free(services_->host_ctx, geometry().device, layers_[i].sidecars.back());
        layers_[i].sidecars.pop_back();
        layers_[i].sidecar_shapes.pop_back();
      }
      throw;
    }
  }

  // Called for every page taken, before write_tokens: runs of consecutive page ids of one
  // (layer, slot) collapse into one memset, issued at the next flush.
  void clear_sidecar_page(int32_t layer, int32_t slot, int32_t page) override {
    // The base clears every slot of a page in turn, so a slot's open run is among the last few.
    const size_t look = std::min(pending_.size(), sidecars_.size());
    for (size_t i = pending_.size(); i > pending_.size() - look; --i) {
      ClearRun& r = pending_[i - 1];
      if (r.layer == layer && r.slot == slot) {
        if (r.first + r.count == page) {
          ++r.count;
          return;
        }
        break;
      }
    }
    pending_.push_back({layer, slot, page, 1});
  }

  void release_pages(int32_t, const std::vector<int32_t>&) override {
    // The pool stays reserved (see the header comment); the base returns the ids to the free list.
  }

  void publish_view(int32_t layer, const ViewDelta& d, sieve_paged_kv* out) override {
    const auto& g = geometry();
    if (d.batch > g.max_batch)
      fail(SIEVE_ERR_CAPACITY, "view: batch " + std::to_string(d.batch) + " exceeds geometry.max_batch " +
                                   std::to_string(g.max_batch) + " (the device view arrays are sized at setup)");
    if (d.nnz > config().pages_per_layer)  // only a sequence listed twice gets here
      fail(SIEVE_ERR_CAPACITY, "view: " + std::to_string(d.nnz) + " pages exceed the " +
                                   std::to_string(config().pages_per_layer) +
                                   " entries of the device indices (is a sequence listed twice?)");
    DeviceScope scope(g.device.device_id);
    flush_sidecar_clears();
    Layer& l = layers_[size_t(layer)];
    // Stream order keeps the contract: these writes land after every kernel already enqueued
    // on the previous view, and the indices buffer written is not the current view's. A decode
    // step's change fits in the kernel's parameters (InlineInts); a larger one (a full rebuild,
    // a batch beyond ~170 sequences growing at once) goes through the staging ring first.
    InlineInts small;
    small.n = 0;
    if (d.change == ViewChange::kPages) {
      const size_t n = ViewDelta::packed_size(d.batch, d.n_added);
      const int32_t* packed = nullptr;
      if (n <= size_t(kInlineInts)) {
        small.n = int32_t(n);
        std::memcpy(small.v, d.packed, n * sizeof(int32_t));
      } else {
        writer_->upload(l.packed, d.packed, n * sizeof(int32_t));
        packed = l.packed;
      }
      publish_table(small, packed, l.packed, d.batch, d.nnz, l.indices[l.current], l.indices[l.current ^ 1]);
      l.current ^= 1;
    } else if (d.change == ViewChange::kLastPageLen) {
      const size_t at = ViewDelta::last_at(d.batch);
      if (d.batch <= kInlineInts) {
        small.n = d.batch;
        std::memcpy(small.v, d.packed + at, size_t(d.batch) * sizeof(int32_t));
        publish_table(small, nullptr, l.packed + at, d.batch, 0, nullptr, nullptr);
      } else {
        writer_->upload(l.packed + at, d.packed + at, size_t(d.batch) * sizeof(int32_t));
      }
    }
    const DLDataType dt = g.kv_dtype;
    out->k_pages = make_view(l.k, g.device, dt, 4, l.page_shape.data());
    out->v_pages = make_view(l.v, g.device, dt, 4, l.page_shape.data());
    out->k_pre_rope_pages = make_view(l.k_pre, g.device, dt, 4, l.page_shape.data());
    l.indptr_shape[0] = int64_t(d.batch) + 1;
    l.indices_shape[0] = int64_t(d.nnz);
    l.last_shape[0] = int64_t(d.batch);
    out->indptr = make_view(l.packed, g.device, kI32, 1, l.indptr_shape.data());
    out->indices = make_view(l.indices[l.current], g.device, kI32, 1, l.indices_shape.data());
    out->last_page_len = make_view(l.packed + ViewDelta::last_at(d.batch), g.device, kI32, 1, l.last_shape.data());
    out->indptr_host = d.packed;
    out->last_page_len_host = d.packed + ViewDelta::last_at(d.batch);
  }

  void sidecar_tensor(int32_t layer, int32_t slot, DLTensor* out) override {
    {
      DeviceScope scope(geometry().device.device_id);
      flush_sidecar_clears();
    }
    Layer& l = layers_[size_t(layer)];
    *out = make_view(l.sidecars[size_t(slot)], geometry().device, sidecars_[size_t(slot)].dtype, 3,
                     l.sidecar_shapes[size_t(slot)].data());
  }

 private:
  struct ClearRun {
    int32_t layer, slot, first, count;
  };

  void* raw_alloc(size_t bytes, const char* what) {
    void* p = services_->alloc(services_->host_ctx, geometry().device, bytes, 256);
    require(p != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
            std::string("paged-cuda store: cannot allocate ") + std::to_string(bytes) + " bytes of " +
                device_name(geometry().device) + " memory for " + what);
    return p;
  }
  // An allocation freed with the store (pools, view arrays, the slot list).
  void* device_alloc(size_t bytes, const char* what) {
    owned_.reserve(owned_.size() + 1);  // so push_back cannot throw after the allocation
    void* p = raw_alloc(bytes, what);
    owned_.push_back(p);
    return p;
  }

  void publish_table(const InlineInts& small, const int32_t* packed, int32_t* table, int32_t batch, int32_t nnz,
                     const int32_t* previous, int32_t* indices) {
    const int64_t total = std::max<int64_t>(nnz, small.n);
    if (total == 0) return;
    const int threads = 256;
    const int blocks = int(std::min<int64_t>((total + threads - 1) / threads, 1024));
    publish_view_table<<<blocks, threads, 0, stream_>>>(small, packed, table, batch, nnz, previous, indices);
    check_cuda(cudaGetLastError(), "view table kernel launch");
  }

  void flush_sidecar_clears() {
    for (const ClearRun& r : pending_) {
      const Sidecar& s = sidecars_[size_t(r.slot)];
      char* base = static_cast<char*>(layers_[size_t(r.layer)].sidecars[size_t(r.slot)]);
      check_cuda(cudaMemsetAsync(base + size_t(r.first) * s.bytes_per_page, 0, size_t(r.count) * s.bytes_per_page,
                                 stream_),
                 "cudaMemsetAsync(sidecar pages)");
    }
    pending_.clear();
  }

  void release_all() noexcept {
    const int dev = geometry().device.device_id;
    int prev = 0;
    const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
    if (have_prev && prev != dev) cudaSetDevice(dev);
    // Pending device work may still read the pools and the staging ring: drain the stream first
    // (teardown is not the hot path).
    cudaStreamSynchronize(stream_);
    writer_.reset();
    for (void* p : owned_) services_->free(services_->host_ctx, geometry().device, p);
    for (auto& l : layers_)
      for (void* p : l.sidecars) services_->free(services_->host_ctx, geometry().device, p);
    owned_.clear();
    layers_.clear();
    if (have_prev && prev != dev) cudaSetDevice(prev);
  }

  cudaStream_t stream_ = nullptr;
  std::vector<Layer> layers_;
  std::vector<void*> owned_;  // pools and view arrays (sidecars are owned by their layer)
  std::unique_ptr<TokenWriter> writer_;  // the token scatter and the staging ring
  std::vector<ClearRun> pending_;
};

}  // namespace

const sieve_kv_store_api* paged_cuda_store_api() { return make_store_api<PagedCudaStore>("paged-cuda"); }

}  // namespace sieve::kv
