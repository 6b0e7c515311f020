// LayerRunner's internal record of one run_layer call, shared by its translation units
// (layer_runner.cpp: the eager steps; layer_runner_graphs.cpp: the CUDA-graph path).
#pragma once
#include <cstdint>
#include <vector>

#include "sieve/kernels/attention_args.hpp"
#include "sieve/runtime/layer_runner.hpp"

namespace sieve::runtime {

// What the steps of one run_layer call share.
struct LayerRunner::LayerStep {
  int32_t L = 0;
  int32_t n_new = 0;
  const std::vector<size_t>* chain = nullptr;
  sieve_kv_append app{};
  sieve_paged_kv view{};
  sieve_layer_call call{};
  int64_t capacity = 0;
  int64_t indptr_shape[1] = {0}, indices_shape[1] = {0};
  sieve_selection sel{};
  sieve_attention_args args{};
  uint32_t stats = SIEVE_STATS_NONE;
  std::vector<int32_t> observers;
  int32_t override_by = -1;
};

}  // namespace sieve::runtime
