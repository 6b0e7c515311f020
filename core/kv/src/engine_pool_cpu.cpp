// The engine-pool store on the CPU: the engine's pool is host memory; Sieve keeps the sidecars
// and the pre-RoPE key pool (when kept) for every page id of the engine's pool.
#include <array>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "sieve/kv/engine_pool_base.hpp"
#include "sieve/kv/page_zero.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kv {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using HostBytes = std::unique_ptr<unsigned char, FreeDeleter>;

// calloc: a large pool is committed only where written.
HostBytes zeroed(size_t bytes, const char* what) {
  HostBytes p(static_cast<unsigned char*>(std::calloc(bytes ? bytes : 1, 1)));
  require(p != nullptr, SIEVE_ERR_OUT_OF_MEMORY,
          "engine_pool store: cannot allocate " + std::to_string(bytes) + " bytes for " + what);
  return p;
}

class EnginePoolCpu final : public EnginePoolBase {
 public:
  EnginePoolCpu(const sieve_host_services* services, const sieve_kv_config& config)
      : EnginePoolBase(services, config) {
    layers_.resize(size_t(geometry().n_layers));
    if (config.keep_pre_rope_k)
      for (auto& l : layers_) l.pre = zeroed(size_t(config.pages_per_layer) * page_bytes(), "pre-RoPE key pages");
  }

 protected:
  DLDevice device() const override { return kCpu; }

  void write_tokens(const std::vector<TokenSlot>& slots, const DLTensor* const inputs[3],
                    const PoolTarget targets[3]) override {
    const auto& g = geometry();
    for (int i = 0; i < 3; ++i)
      if (inputs[i]) scatter_tokens_cpu(slots, *inputs[i], targets[i], g.kv_dtype, g.n_kv_heads, g.head_dim);
  }

  void allocate_sidecar(int32_t slot) override {
    const Sidecar& s = sidecars_[size_t(slot)];
    for (auto& l : layers_) {
      l.sidecars.push_back(zeroed(size_t(config().pages_per_layer) * s.bytes_per_page, "a sidecar"));
      l.sidecar_shapes.push_back({config().pages_per_layer, geometry().n_kv_heads, s.elems_per_head});
    }
  }

  void clear_sidecar_pages(int32_t layer, const std::vector<int32_t>& pages) override {
    std::vector<void*> bases;
    for (auto& p : layers_[size_t(layer)].sidecars) bases.push_back(p.get());
    zero_pages_cpu(sidecar_pages(bases), pages);
  }

  void sidecar_tensor(int32_t layer, int32_t slot, DLTensor* out) override {
    Layer& l = layers_[size_t(layer)];
    *out = make_view(l.sidecars[size_t(slot)].get(), kCpu, sidecars_[size_t(slot)].dtype, 3,
                     l.sidecar_shapes[size_t(slot)].data());
  }

  void* pre_rope_pool(int32_t layer) override { return layers_[size_t(layer)].pre.get(); }

 private:
  struct Layer {
    HostBytes pre;
    std::vector<HostBytes> sidecars;
    std::vector<std::array<int64_t, 3>> sidecar_shapes;
  };
  std::vector<Layer> layers_;
};

}  // namespace

EnginePoolBase* make_engine_pool_cpu(const sieve_host_services* services, const sieve_kv_config& config) {
  return new EnginePoolCpu(services, config);
}

}  // namespace sieve::kv
