// The engine-pool store on a CUDA device: the engine's pool is device memory; Sieve's sidecars and
// pre-RoPE key pool (when kept) are allocated once, through services->alloc, for every page id of
// the engine's pool, and freed with the store. Tokens are written by the core stores' TokenWriter
// (same kernel, strided destination); sidecar pages new to a sequence are zeroed by one
// PageZeroer launch for all of them (the engine's pages come in shuffled order: a memset per
// page cost a 4096-token Quest prefill 0.34 ms). Everything is enqueued on
// services->cuda_stream and nothing synchronises.
#include <cuda_runtime.h>

#include <array>
#include <memory>
#include <vector>

#include "sieve/kv/engine_pool_base.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"
#include "page_zeroer.cuh"
#include "token_writer.cuh"

namespace sieve::kv {
namespace {

constexpr const char* kWho = "engine_pool store (cuda)";

class EnginePoolCuda final : public EnginePoolBase {
 public:
  EnginePoolCuda(const sieve_host_services* services, const sieve_kv_config& config)
      : EnginePoolBase(services, config) {
    const auto& g = config.geometry;
    require(services && services->hdr.struct_size >= sizeof(sieve_host_services) && services->alloc && services->free,
            SIEVE_ERR_INVALID_ARGUMENT, std::string(kWho) + ": host services with alloc/free are required");
    int n = 0;
    check_cuda(cudaGetDeviceCount(&n), kWho, "cudaGetDeviceCount");
    require(g.device.device_id >= 0 && g.device.device_id < n, SIEVE_ERR_INVALID_ARGUMENT,
            std::string(kWho) + ": " + device_name(g.device) + " does not exist (" + std::to_string(n) +
                " CUDA devices)");
    stream_ = services->cuda_stream ? static_cast<cudaStream_t>(services->cuda_stream(services->host_ctx)) : nullptr;
    DeviceScope scope(g.device.device_id);
    layers_.resize(size_t(g.n_layers));
    try {
      if (config.keep_pre_rope_k)
        for (auto& l : layers_) l.pre = zeroed(size_t(config.pages_per_layer) * page_bytes(), "pre-RoPE key pages");
      writer_ = std::make_unique<TokenWriter>(services, g.device, stream_, kWho);
      zeroer_ = std::make_unique<PageZeroer>(services, g.device, stream_, *writer_, kWho);
    } catch (...) {
      release_all();
      throw;
    }
  }
  ~EnginePoolCuda() override { release_all(); }

 protected:
  DLDevice device() const override { return geometry().device; }

  void write_tokens(const std::vector<TokenSlot>& slots, const DLTensor* const inputs[3],
                    const PoolTarget targets[3]) override {
    const auto& g = geometry();
    DeviceScope scope(g.device.device_id);
    writer_->write(slots, inputs, targets, g.kv_dtype, g.n_kv_heads, g.head_dim, nullptr, nullptr, 0);
  }

  void allocate_sidecar(int32_t slot) override {
    const Sidecar& s = sidecars_[size_t(slot)];
    DeviceScope scope(geometry().device.device_id);
    for (auto& l : layers_) {  // no reallocation (and no throw) after an allocation below
      l.sidecars.reserve(l.sidecars.size() + 1);
      l.sidecar_shapes.reserve(l.sidecar_shapes.size() + 1);
    }
    size_t done = 0;
    try {
      for (auto& l : layers_) {
        l.sidecars.push_back(zeroed(size_t(config().pages_per_layer) * s.bytes_per_page, "a sidecar"));
        l.sidecar_shapes.push_back({config().pages_per_layer, geometry().n_kv_heads, s.elems_per_head});
        ++done;
      }
    } catch (...) {  // leave no half-registered slot behind (the base pops the descriptor)
      for (size_t i = 0; i < done; ++i) {
        free_device(layers_[i].sidecars.back());
        layers_[i].sidecars.pop_back();
        layers_[i].sidecar_shapes.pop_back();
      }
      throw;
    }
  }

  void clear_sidecar_pages(int32_t layer, const std::vector<int32_t>& pages) override {
    DeviceScope scope(geometry().device.device_id);
    zeroer_->zero(sidecar_pages(layers_[size_t(layer)].sidecars), pages);
  }

  void sidecar_tensor(int32_t layer, int32_t slot, DLTensor* out) override {
    Layer& l = layers_[size_t(layer)];
    *out = make_view(l.sidecars[size_t(slot)], geometry().device, sidecars_[size_t(slot)].dtype, 3,
                     l.sidecar_shapes[size_t(slot)].data());
  }

  void* pre_rope_pool(int32_t layer) override { return layers_[size_t(layer)].pre; }

 private:
  struct Layer {
    void* pre = nullptr;
    std::vector<void*> sidecars;
    std::vector<std::array<int64_t, 3>> sidecar_shapes;
  };

  void* zeroed(size_t bytes, const char* what) {
    void* p = services_->alloc(services_->host_ctx, geometry().device, bytes, 256);
    require(p != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
            std::string(kWho) + ": cannot allocate " + std::to_string(bytes) + " bytes of " +
                device_name(geometry().device) + " memory for " + what);
    const cudaError_t e = cudaMemsetAsync(p, 0, bytes, stream_);
    if (e != cudaSuccess) free_device(p);
    check_cuda(e, kWho, "cudaMemsetAsync");
    return p;
  }
  void free_device(void* p) noexcept { services_->free(services_->host_ctx, geometry().device, p); }

  void release_all() noexcept {
    const int dev = geometry().device.device_id;
    int prev = 0;
    const bool have_prev = cudaGetDevice(&prev) == cudaSuccess;
    if (have_prev && prev != dev) cudaSetDevice(dev);
    cudaStreamSynchronize(stream_);  // pending work may still read Sieve's pools (teardown only)
    zeroer_.reset();  // before the ring it uploads through
    writer_.reset();
    for (auto& l : layers_) {
      if (l.pre) free_device(l.pre);
      for (void* p : l.sidecars) free_device(p);
    }
    layers_.clear();
    if (have_prev && prev != dev) cudaSetDevice(prev);
  }

  cudaStream_t stream_ = nullptr;
  std::vector<Layer> layers_;
  std::unique_ptr<TokenWriter> writer_;
  std::unique_ptr<PageZeroer> zeroer_;
};

}  // namespace

EnginePoolBase* make_engine_pool_cuda(const sieve_host_services* services, const sieve_kv_config& config) {
  return new EnginePoolCuda(services, config);
}

}  // namespace sieve::kv
