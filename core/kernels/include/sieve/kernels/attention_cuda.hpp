// The core attention kernel on a CUDA device (cuda/attention_cuda.cu). In a build without CUDA
// (cpu/attention_cuda_absent.cpp) attend_cuda returns SIEVE_ERR_UNSUPPORTED, "built without CUDA",
// and cuda_device_count() returns 0, so callers need no #ifdef.
#pragma once
#include <string>

#include "sieve/attention.h"

namespace sieve::kernels {

// Paged attention for `args` (semantics: api/sieve/attention.h) with every tensor on one CUDA
// device, enqueued on `cuda_stream` (a cudaStream_t; nullptr = the default stream). Never
// synchronises the device with the host. On failure returns the status and writes one line to
// *error (when error != nullptr).
sieve_status attend_cuda(const sieve_attention_args& args, void* cuda_stream, std::string* error);

// Number of usable CUDA devices; 0 without CUDA, a driver or a device (never fails).
int cuda_device_count();

}  // namespace sieve::kernels
