// The benchmark's cases, their block selections, and what each moves and computes (the numerators
// of GB/s and TFLOP/s). Internal to bench/.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sieve/attention.h"
#include "sieve/reference/workload.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::bench {

enum class Backend { kCpu, kCuda };

struct Case {
  std::string name;   // unique benchmark name
  std::string shape;  // the (dense) shape: "decode/64q8kv128/bs16/ctx32768/bf16", shared by its
                      // sparse variants and the PyTorch SDPA entry
  Backend backend = Backend::kCuda;
  sieve_phase phase = SIEVE_PHASE_DECODE;
  int32_t hq = 64, hkv = 8, d = 128, page_size = 16;
  int32_t batch = 1, ctx = 8192;  // decode: ctx keys cached; prefill: a ctx-token prompt
  DLDataType dtype = kBF16;       // q, K/V and out
  double sparsity = 0;            // fraction of the key blocks a selection row drops; 0 = dense
  int32_t q_block = 1;            // selection query block (prefill)
  int32_t k_block_pages = 4;      // selection key block, in pages (64 keys at page 16)
  bool tensor_cores = true;       // false: the FMA kernels (baseline)
  bool hopper = true;             // CudaAttentionOptions::hopper (sieve_bench --no-hopper)
  int hopper_ctas = 0;            // CudaAttentionOptions::hopper_ctas (sieve_bench --hopper-ctas)
  bool cpu_portable = false;      // CPU: the portable loops instead of the SIMD decode kernel
  int32_t kv_splits = 0;          // CudaAttentionOptions::kv_splits (0: automatic)
  int32_t split_min_keys = 0;     // CudaAttentionOptions::split_min_keys (0: default)
  bool sdpa = false;              // PyTorch SDPA runs the same shape
  int samples = 10;               // timed samples (medians are over these)

  bool dense() const { return sparsity <= 0; }
  bool prefill() const { return phase == SIEVE_PHASE_PREFILL; }
};

// What a case attends, from its selection (or dense).
struct Work {
  double kv_bytes = 0;      // K and V of every attended key, once per (sequence, KV head)
  double qo_bytes = 0;      // q read + out written
  double flops = 0;         // 4·d per (query row, head, attended key): QKᵀ and PV
  double kept = 1;          // attended keys / causal dense keys
  double bytes() const { return kv_bytes + qo_bytes; }
};

// The cases of a run (quick: a small smoke set).
std::vector<Case> gpu_cases(bool quick);
std::vector<Case> cpu_cases(bool quick);

// Query tokens per sequence and keys of sequence b (decode: 1 and ctx; prefill: ctx and ctx).
inline int32_t n_new(const Case& c) { return c.prefill() ? c.ctx : 1; }

// The case's block selection (PER_KV_HEAD rows, as SeerAttention-R's GQA-shared blocks): each row
// keeps round((1 - sparsity) x its visible key blocks), at least one, always the block holding the
// query's own position (the local block), the rest uniformly at random. Empty for dense cases.
reference::SelectionRows make_selection(const Case& c, uint64_t seed);

// Bytes and flops of the case under `rows` (empty rows = dense).
Work case_work(const Case& c, const reference::SelectionRows& rows);

}  // namespace sieve::bench
