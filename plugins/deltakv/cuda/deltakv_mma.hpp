// The tensor-core stage 3 of deltakv (deltakv_attend_mma.cu), internal to the CUDA half.
#pragma once
#include <cuda_runtime.h>

#include "cuda/deltakv_cuda.hpp"

namespace sieve::deltakv {

// q and K/V of one 16-bit dtype, head_dim 64 or 128, phase2 on or only.
bool mma_attend_applies(const CudaLaunch& a);
// Enqueues the kernel on a.stream (stages 1-2 must be enqueued before).
cudaError_t launch_attend_mma(const CudaLaunch& a);

}  // namespace sieve::deltakv
