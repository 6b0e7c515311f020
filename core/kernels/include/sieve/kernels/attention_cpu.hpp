// The core attention kernel on the CPU: dense or block-sparse paged attention, decode or causal
// prefill, optionally for a subset of query rows, optionally emitting page statistics
// (semantics: api/sieve/attention.h).
#pragma once
#include <string>

#include "sieve/attention.h"

namespace sieve::kernels {

// Instruction sets of the decode and prefill kernels. kAuto: the widest this CPU has; a named one
// is the widest allowed, and a call it does not fit steps down to the next: kAvx512Bf16
// (AVX512_BF16 dot products, decode only; prefill runs kAvx512) takes bf16 q and K/V with head
// dims that are multiples of 32 and rounds the softmax weights to bf16 for P.V, as the CUDA
// tensor-core kernels do; kAvx512 head dims that are multiples of 16, kAvx2 of 8; portable: plain
// loops the compiler vectorizes for the build's target, and cblas_sgemm for prefill tiles.
enum class CpuIsa { kAuto, kPortable, kAvx2, kAvx512, kAvx512Bf16 };

// Whether this CPU runs `isa` (kAuto and kPortable: always).
bool cpu_isa_available(CpuIsa isa);

// Tuning knobs; the defaults are what the runtime uses. Tests and benchmarks set them to reach
// every code path on any machine.
struct CpuAttentionOptions {
  int threads = 0;       // OpenMP threads for this call; 0: omp_get_max_threads()
  int kv_splits = 0;     // decode split-KV chunks per (sequence, head group): 0 auto, 1 off
  // cblas_sgemm for prefill tiles with head_dim >= 32 and >= 16 rows that no SIMD kernel takes
  bool use_blas = true;
  CpuIsa isa = CpuIsa::kAuto;  // SIMD kernels; SIEVE_ERR_UNSUPPORTED if this CPU lacks the one named
  bool prefetch = true;  // SIMD decode: software prefetch of the next chunk of K/V rows
};

// Runs `args` with every tensor in host memory (kDLCPU). Checks the arguments
// (check_attention_args), the page table's physical ids, the selection's contents (key blocks in
// range, strictly increasing) and q_rows before computing anything; on failure returns
// SIEVE_ERR_INVALID_ARGUMENT (SIEVE_ERR_UNSUPPORTED for requests v1 does not do, e.g. prefill
// statistics) with one line naming the offending argument, row and index in *error (when
// error != nullptr). Never throws.
//
// f32 accumulation whatever the storage dtype; rows not computed (q_rows) are left untouched in
// `out` and `lse`; page_mass rows of pages no computed query attended are 0.
sieve_status attend_cpu(const sieve_attention_args& args, std::string* error);
sieve_status attend_cpu(const sieve_attention_args& args, const CpuAttentionOptions& options,
                        std::string* error);

}  // namespace sieve::kernels
