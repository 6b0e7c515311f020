// A build without CUDA: the CUDA backend refuses with the reason.
#include "ops.hpp"
#include "sieve/util/error.hpp"

namespace sieve::model::detail {
std::unique_ptr<Ops> make_cuda_ops(DLDevice, void*) {
  fail(SIEVE_ERR_UNSUPPORTED, "model: this build of Sieve has no CUDA support (--device cuda)");
}
}  // namespace sieve::model::detail
