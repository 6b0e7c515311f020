// The plugins' CUDA tests skip, with the reason, where no CUDA device is usable (include from CUDA
// test sources only). Builds on tests/cuda's helpers (no_cuda_reason, SIEVE_CUDA_OK, DeviceBuffer).
#pragma once
#include <string>

#include "../../cuda/cuda_test_util.hpp"

namespace sieve::testing {

// "" where a CUDA device is usable, else why not, as a GTEST_SKIP message ("no CUDA device: ...").
inline std::string cuda_skip_reason() {
  const std::string why = cuda_test::no_cuda_reason();
  return why.empty() ? why : "no CUDA device: " + why;
}

}  // namespace sieve::testing
