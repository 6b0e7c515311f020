// What dpxa's drivers (select and DeltaX's attend, CPU and CUDA) share: select's settings, the
// checks of a layer call's CPU tensors, f32 copies of one head's queries or keys, the dtype code
// of the CUDA launches, the host's metric callback, and the allocator the policy lends them.
#pragma once
#include <sieve/plugin/policy_base.hpp>
#include <sieve/sieve.h>
#include <sieve/util/page_layout.hpp>

#include <cstdint>
#include <functional>
#include <vector>

#include "math/dpxa_math.hpp"

namespace sieve::dpxa {

// Device memory on the instance's device, through the host (the policy's allocate(); create only).
using Allocate = std::function<plugin::HostBuffer(size_t bytes)>;

// What select runs with: the estimator, τ (per layer and q head from `thresholds`, `tau` where
// it has no entry) and the rows (per KV head: the union of the group's q heads).
struct SelectConfig {
  Config cfg;
  bool per_kv_head = false;
  float tau = 0.9f;
  const Thresholds* thresholds = nullptr;
};

// q [n_q, n_q_heads, d] a contiguous f32/f16/bf16 tensor, the view's k_pages
// [-1, n_kv_heads, page_size, d] in a layout page_strides accepts and its page indices present;
// throws otherwise.
void check_cpu_tensors(const sieve_geometry& g, const sieve_layer_call& call, const sieve_paged_kv& view);

// Where (physical page, KV head, slot) of a view's page tensor lives, in any layout kv_store.h
// allows (dpxa declares them all); of K and V together (one layout); INVALID_ARGUMENT otherwise.
PageStrides page_strides_of(const DLTensor& pages, const char* what);
PageStrides view_strides(const sieve_paged_kv& view);

// Query head h of sequence b (the call's queries) as contiguous f32 [n_new, d].
void gather_q(const sieve_geometry& g, const sieve_layer_call& call, int32_t b, int32_t h, std::vector<float>& out);

// KV head kvh of sequence b's first kv_len tokens of `pages` (the view's K or V, read through
// its strides) as contiguous f32 [kv_len, d].
void gather_pages(const sieve_geometry& g, const sieve_paged_kv& view, const DLTensor& pages, int32_t b, int32_t kvh,
                  int64_t kv_len, std::vector<float>& out);

// One value through the host's metric callback, when it has one.
void metric(const sieve_host_services& s, const char* name, int32_t layer, double value, int32_t head = -1);

}  // namespace sieve::dpxa
