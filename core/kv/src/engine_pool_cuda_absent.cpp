// A build without CUDA: the engine-pool store refuses a CUDA geometry with a reason.
#include "sieve/kv/engine_pool_base.hpp"
#include "sieve/util/error.hpp"

namespace sieve::kv {
EnginePoolBase* make_engine_pool_cuda(const sieve_host_services*, const sieve_kv_config&) {
  fail(SIEVE_ERR_UNSUPPORTED, "engine_pool store: this build has no CUDA support");
}
}  // namespace sieve::kv
