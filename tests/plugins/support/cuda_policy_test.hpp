// CudaPolicyTest: the fixture of the policy plugins' CUDA tests that run a plugin against the mock
// host services with device memory and a stream of its own (include from CUDA test sources only).
#pragma once
#include <cuda_runtime.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mocks/mock_host_services.hpp"
#include "sieve/util/tensor.hpp"
#include "support/cuda_device.hpp"
#include "support/plugin_library.hpp"

namespace sieve::testing {

// Skips without a device; loads and negotiates the plugin; gives the mock host cudaMalloc'd
// device memory and a non-blocking stream (its cuda_stream()); at the end destroys the policies
// create_policy made and checks that the host got all its memory back.
class CudaPolicyTest : public ::testing::Test {
 protected:
  // `plugin` as in sieve_add_plugin(NAME ...).
  explicit CudaPolicyTest(const std::string& plugin) : lib_(plugin) {}

  void SetUp() override {
    const std::string why = cuda_skip_reason();
    if (!why.empty()) GTEST_SKIP() << why;
    api_ = lib_.policy();
    ASSERT_NE(api_, nullptr);
    host_.set_device_allocator(
        [](DLDevice, size_t bytes) -> void* {
          void* p = nullptr;
          return cudaMalloc(&p, bytes) == cudaSuccess ? p : nullptr;
        },
        [](DLDevice, void* p) { cudaFree(p); });
    SIEVE_CUDA_OK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    ON_CALL(host_, cuda_stream()).WillByDefault(::testing::Return(static_cast<void*>(stream_)));
  }
  void TearDown() override {
    if (!api_) return;
    for (sieve_policy* p : policies_) api_->destroy(p);
    EXPECT_EQ(host_.live_allocations(), 0u);
    cudaStreamDestroy(stream_);
  }

  // A policy on `g` (its device decides the path) with these parameter values, destroyed at
  // TearDown; NULL after a test failure naming the device, the status and the plugin's reason.
  sieve_policy* create_policy(const sieve_geometry& g, const sieve_param_value* values, uint32_t n_values) {
    sieve_policy* p = create_or_fail(api_, host_.table(), g, values, n_values, "create on " + device_name(g.device));
    if (p) policies_.push_back(p);
    return p;
  }

  PluginLibrary lib_;
  const sieve_policy_api* api_ = nullptr;
  ::testing::NiceMock<MockHostServices> host_;
  cudaStream_t stream_ = nullptr;
  std::vector<sieve_policy*> policies_;
};

}  // namespace sieve::testing
