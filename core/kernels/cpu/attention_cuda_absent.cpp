// attend_cuda / cuda_device_count in a build without CUDA (SIEVE_WITH_CUDA=OFF): callers need no
// #ifdef, they get a status and a reason.
#include "sieve/kernels/attention_cuda.hpp"

namespace sieve::kernels {

sieve_status attend_cuda(const sieve_attention_args&, void*, std::string* error) {
  if (error) *error = "built without CUDA";
  return SIEVE_ERR_UNSUPPORTED;
}

int cuda_device_count() { return 0; }

}  // namespace sieve::kernels
