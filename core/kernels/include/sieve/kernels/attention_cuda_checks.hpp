// What the CUDA attention kernel offers beyond attention_cuda.hpp: tuning knobs for tests and
// benchmarks, the split-KV count it would pick, and the device-side content checks.
//
// Why device-side checks: selection lists, page tables and q_rows live on the device, and reading
// them on the host would synchronise. So attend_cuda does not look at their contents up front; its
// kernels skip any out-of-range or misordered entry (nothing is read out of bounds) and record the
// first offender in a small per-device record. The host asks for it when it syncs anyway
// (cuda_attention_check_errors), and reports the plugin that produced the bad selection.
#pragma once
#include <string>

#include "sieve/attention.h"

namespace sieve::kernels {

struct CudaAttentionOptions {
  // Split-KV chunks of the row kernel (decode, and prefill rows listed in q_rows) per
  // (query row, head unit): 0 = automatic (from the SM count), 1 = off, n = exactly n (<= 256).
  int kv_splits = 0;
  // Tensor-core kernels (mma.sync) where they apply: q and K/V of one 16-bit dtype, head_dim 64
  // or 128. false: the f32 FMA kernels for everything (a baseline; f32 storage, mixed q/KV dtypes
  // and head_dim 8 always take them).
  bool tensor_cores = true;
  // Prefill over every query token on Hopper's wgmma + TMA kernel where this build has it
  // (SIEVE_CUDA_HOPPER), the device is compute capability 9.0 and the shape fits (head_dim 128,
  // page size 8..128 dividing 128); false, or anything else: the mma.sync kernel.
  bool hopper = true;
  // The Hopper kernel's persistent CTAs, each walking query tiles in turn: 0 = one per SM; fewer
  // stress the hand-over between tiles (tests), more than the tiles give one tile per CTA.
  int hopper_ctas = 0;
  // Tensor-core row kernel with automatic splits: a row whose key list (dense keys, or selected
  // pages) is short uses one split per this many keys begun (at most kv_splits); a row that takes
  // one split skips the combine. 0 = the default (256).
  int split_min_keys = 0;
};

// attend_cuda (attention_cuda.hpp) with explicit options.
sieve_status attend_cuda(const sieve_attention_args& args, const CudaAttentionOptions& options,
                         void* cuda_stream, std::string* error);

// How attend_cuda would run `args`: which kernel family and how it splits the work.
struct CudaAttentionPlan {
  const char* kernel = "";  // "row-fma", "row-mma", "prefill-fma", "prefill-mma", "prefill-wgmma",
                            // "variant-fma" or "variant-mma"
  int kv_splits = 1;        // split-KV CTAs per (row, head unit); an upper bound for row-mma
  int heads_per_cta = 1;    // query heads that share each K/V load
  // How split-KV partial states are merged: "none" (one split), "cluster" (row-mma on sm_90 with
  // at most 8 splits: a thread-block cluster through distributed shared memory, in the row
  // kernel) or "combine" (a second kernel over partials in global memory).
  const char* merge = "none";
};
// Fills *plan; on refusal returns the status attend_cuda would and writes *error. Host-only, like
// cuda_attention_kv_splits.
sieve_status cuda_attention_plan(const sieve_attention_args& args, const CudaAttentionOptions& options,
                                 CudaAttentionPlan* plan, std::string* error);

// The split-KV count attend_cuda would use for `args` (1 when it would not split, e.g. a tiled
// prefill). Returns 0 and writes *error when attend_cuda would refuse the arguments. Host-only: no
// device work besides reading the device's SM count once.
int cuda_attention_kv_splits(const sieve_attention_args& args, const CudaAttentionOptions& options,
                             std::string* error);

// Waits for `cuda_stream` (this call synchronises), then reads and clears the first bad entry the
// attention kernels met on CUDA device `device` since the last check: a selection key block out of
// range or not strictly increasing, a selection row outside its indices, a page id outside the
// pool, a q_rows entry outside the query tokens. SIEVE_OK when there was none; else
// SIEVE_ERR_INVALID_ARGUMENT and one line naming the row and entry in *error. SIEVE_ERR_DEVICE when
// a CUDA call fails (the stream's own error included).
sieve_status cuda_attention_check_errors(int device, void* cuda_stream, std::string* error);

}  // namespace sieve::kernels
