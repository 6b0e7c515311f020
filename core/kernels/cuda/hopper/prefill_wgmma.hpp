// The Hopper prefill kernel (prefill_wgmma.cu): where it applies, and its launch. The caller
// (attention_cuda.cu, with SIEVE_CUDA_HOPPER) asks prefill_wgmma_unsupported first and takes the
// mma.sync kernel whenever it answers a reason. Internal to core/kernels/cuda.
#pragma once
#include <cuda_runtime.h>

#include <string>

#include "../attention_cuda_common.cuh"

namespace sieve::kernels::cuda::sm90 {

// "" when the Hopper kernel serves a prefill of this head_dim and page size on `device`, else why
// not (one line). The caller has checked the rest: q and K/V of one 16-bit dtype, 16-byte aligned
// (the mma.sync kernel's conditions), every query row computed (no q_rows).
std::string prefill_wgmma_unsupported(int device, int32_t head_dim, int32_t page_size);

// The same tiles as launch_prefill_attention_mma (max_tiles query tiles per head unit and
// sequence, tile_tokens * hg <= 128 rows each), walked by `ctas` persistent CTAs (0: one per SM;
// never more than the tiles). When q or the K/V pool cannot be described to TMA, returns
// cudaErrorInvalidValue with the reason in *why.
cudaError_t launch_prefill_attention_wgmma(const AttnParams& p, Storage kv_dt, int32_t max_tiles, int32_t tile_tokens,
                                           int ctas, cudaStream_t stream, std::string* why);

}  // namespace sieve::kernels::cuda::sm90
