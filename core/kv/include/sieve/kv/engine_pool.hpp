// The engine-pool store: the engine (vLLM, SGLang, any host with a paged cache) owns the K/V page
// pool and the page tables; Sieve borrows them per call (bind_pages) and copies no K/V. See
// engine_pool_base.hpp for what it checks and keeps, docs/abi.md for the ownership rules.
#pragma once
#include "sieve/kv_store.h"

namespace sieve::kv {
// One table for both devices: create picks the CPU or the CUDA store by geometry.device
// (CUDA refused with a clear reason in a build without CUDA). Descriptor name "engine_pool";
// parameter `layout` = hnd | nhd | combined | combined_hnd.
const sieve_kv_store_api* engine_pool_store_api();
}  // namespace sieve::kv
