// The fixture both CUDA attention test files use (attention_cuda_test.cpp: the FMA kernels;
// attention_cuda_tensor_core_test.cpp: the tensor-core ones): a call on the device copy of a
// workload, checked against the f64 reference with no device-side error.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "../kernels/attention_test_cases.hpp"
#include "cuda_test_util.hpp"
#include "device_call.hpp"
#include "sieve/kernels/attention_cuda.hpp"
#include "sieve/kernels/attention_cuda_checks.hpp"
#include "sieve/reference/workload.hpp"

namespace sieve::cuda_test {

class AttentionCuda : public CudaTest {
 protected:
  // attend_cuda on the device copy of `w`, then the reference comparison; no device-side error.
  void expect_matches_reference(reference::Workload& w, const kernels::CudaAttentionOptions& opt = {}) {
    DeviceCall call(w);
    std::string err;
    ASSERT_EQ(call.run(stream_, opt, &err), SIEVE_OK) << err;
    ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_OK) << err;
    attention_test::expect_outputs_match(w);
  }
  // The same with the default options, for the shared cases.
  attention_test::Expect expect_on_device() {
    return [this](reference::Workload& w) { expect_matches_reference(w); };
  }
  // The split-KV count attend_cuda picks for the device copy of `w` (0 when it refuses).
  int splits_for(reference::Workload& w, const kernels::CudaAttentionOptions& opt) {
    DeviceCall call(w);
    std::string err;
    const int n = kernels::cuda_attention_kv_splits(call.args, opt, &err);
    EXPECT_GT(n, 0) << err;
    return n;
  }
};

inline std::string dt(DLDataType t) { return dtype_name(t); }

}  // namespace sieve::cuda_test
