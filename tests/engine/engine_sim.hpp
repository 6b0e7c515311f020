// What the engine-pool tests share: the pool layouts of the `layout` parameter, and the runtime's
// stand-in engine (sieve/runtime/engine_pages.hpp: its own pool in shuffled page order, CSR tables
// per call, a release sink), on the CPU here and on CUDA on the GPU machine.
#pragma once
#include <cstdint>

#include "sieve/kv_store.h"
#include "sieve/runtime/engine_pages.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::engine_test {

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

// The stand-in engine lives in the runtime (sieve_bench uses it too).
using EngineShape = runtime::EnginePages::Shape;
using EngineSim = runtime::EnginePages;
using runtime::DeviceBytes;

}  // namespace sieve::engine_test
