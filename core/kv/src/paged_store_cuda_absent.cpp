// A build without CUDA has no CUDA store; hosts see nullptr and say so.
#include "sieve/kv/paged_store.hpp"

namespace sieve::kv {
const sieve_kv_store_api* paged_cuda_store_api() { return nullptr; }
}  // namespace sieve::kv
