// The core kernels' extension point (sieve_attention_variant) on CUDA against its f64 reference
// (common/variant_case.hpp), into NaN-poisoned outputs: the FMA variant kernel (f32, head_dim 40,
// tensor cores off) and the tensor-core one (f16/bf16 at head_dim 64 and 128), every row head
// kind, counts and biases each optional, SIEVE_VARIANT_F32_WEIGHTS; a malformed span is skipped
// and reported by cuda_attention_check_errors. Skips without a device.
#include <gtest/gtest.h>

#include <string>

#include "common/variant_case.hpp"
#include "cuda_test_util.hpp"
#include "device_call.hpp"

namespace sieve {
namespace {

using cuda_test::CudaTest;
using cuda_test::DeviceCall;
using cuda_test::DeviceTensor;
using kernels::CudaAttentionOptions;
using reference::Workload;
using variant_test::VariantCase;

// DeviceCall (the workload on the device) plus the variant's tensors.
class DeviceVariantCall : public DeviceCall {
 public:
  DeviceVariantCall(Workload& w, VariantCase& c) : DeviceCall(w) {
    row_spans_ = DeviceTensor(c.row_spans);
    spans_ = DeviceTensor(c.spans);
    pos_ = DeviceTensor(c.packed_pos);
    count_ = DeviceTensor(c.packed_count);
    bias_ = DeviceTensor(c.packed_bias);
    v_ = c.v;
    v_.row_spans = row_spans_.dl;
    v_.spans = spans_.dl;
    v_.packed_pos = pos_.dl;
    if (c.v.packed_count.data) v_.packed_count = count_.dl;
    if (c.v.packed_bias.data) v_.packed_bias = bias_.dl;
    args.variant = &v_;
  }

 private:
  DeviceTensor row_spans_, spans_, pos_, count_, bias_;
  sieve_attention_variant v_{};
};

class AttentionVariantCuda : public CudaTest {
 protected:
  // Runs the case and compares; `kernel`: the plan attend_cuda must pick.
  void check(DLDataType dt, int32_t d, uint32_t heads, int32_t q_block, bool tensor_cores, const char* kernel,
             bool counts = true, bool biases = true) {
    SCOPED_TRACE(testing::Message() << dtype_name(dt) << " d " << d << " heads " << heads << " q_block " << q_block
                                    << " tensor_cores " << tensor_cores << " counts " << counts << " biases " << biases);
    Workload w(variant_test::ragged_prefill(dt, d));
    w.request_lse();
    VariantCase c(w, heads, q_block, 100 + heads * 7 + uint64_t(q_block) + uint64_t(d), counts, biases);
    DeviceVariantCall call(w, c);
    CudaAttentionOptions o;
    o.tensor_cores = tensor_cores;
    kernels::CudaAttentionPlan plan;
    std::string err;
    ASSERT_EQ(kernels::cuda_attention_plan(call.args, o, &plan, &err), SIEVE_OK) << err;
    EXPECT_STREQ(plan.kernel, kernel);
    ASSERT_EQ(call.run(stream_, o, &err), SIEVE_OK) << err;
    ASSERT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_OK) << err;
    const bool mma = std::string(kernel) == "variant-mma";
    variant_test::expect_matches_reference(w, c, mma ? tolerance::unit_roundoff(dt) : 0);
  }
};

TEST_F(AttentionVariantCuda, FmaKernelMatchesTheF64Reference) {
  for (uint32_t heads : {SIEVE_SEL_PER_SEQUENCE, SIEVE_SEL_PER_KV_HEAD, SIEVE_SEL_PER_Q_HEAD})
    for (int32_t q_block : {1, 16, 64}) check(kF32, 40, heads, q_block, true, "variant-fma");
  check(kBF16, 128, SIEVE_SEL_PER_KV_HEAD, 16, false, "variant-fma");
  check(kF32, 256, SIEVE_SEL_PER_Q_HEAD, 64, true, "variant-fma");
}

TEST_F(AttentionVariantCuda, TensorCoreKernelMatchesTheF64Reference) {
  for (DLDataType dt : {kBF16, kF16})
    for (int32_t d : {64, 128})
      for (uint32_t heads : {SIEVE_SEL_PER_SEQUENCE, SIEVE_SEL_PER_KV_HEAD, SIEVE_SEL_PER_Q_HEAD})
        check(dt, d, heads, heads == SIEVE_SEL_PER_KV_HEAD ? 64 : 16, true, "variant-mma");
}

TEST_F(AttentionVariantCuda, CountsAndBiasesAreEachOptional) {
  for (bool mma : {false, true}) {
    check(kBF16, 64, SIEVE_SEL_PER_KV_HEAD, 16, mma, mma ? "variant-mma" : "variant-fma", false, true);
    check(kBF16, 64, SIEVE_SEL_PER_KV_HEAD, 16, mma, mma ? "variant-mma" : "variant-fma", true, false);
  }
}

// SIEVE_VARIANT_F32_WEIGHTS keeps the weights f32: the FMA kernel, to the f32 bound, where the
// tensor-core one would otherwise run.
TEST_F(AttentionVariantCuda, F32WeightsTakeTheFmaKernel) {
  Workload w(variant_test::ragged_prefill(kBF16, 128));
  w.request_lse();
  VariantCase c(w, SIEVE_SEL_PER_KV_HEAD, 16, 77);
  c.v.flags = SIEVE_VARIANT_F32_WEIGHTS;
  DeviceVariantCall call(w, c);
  kernels::CudaAttentionPlan plan;
  std::string err;
  ASSERT_EQ(kernels::cuda_attention_plan(call.args, CudaAttentionOptions{}, &plan, &err), SIEVE_OK) << err;
  EXPECT_STREQ(plan.kernel, "variant-fma");
  ASSERT_EQ(call.run(stream_, CudaAttentionOptions{}, &err), SIEVE_OK) << err;
  variant_test::expect_matches_reference(w, c);
}

// A span outside the packed keys cannot be checked on the host without a sync: the kernels skip
// it and record it, and the next check reports it in one line.
TEST_F(AttentionVariantCuda, AMalformedSpanIsSkippedAndReported) {
  for (bool mma : {false, true}) {
    Workload w(variant_test::ragged_prefill(kBF16, 64));
    w.request_lse();
    VariantCase c(w, SIEVE_SEL_PER_Q_HEAD, 16, 9);
    c.spans.data<int32_t>()[0] = SIEVE_SPAN_PACKED;
    c.spans.data<int32_t>()[1] = 0;
    c.spans.data<int32_t>()[2] = int32_t(c.packed_pos.numel()) + 5;
    c.row_spans.data<int32_t>()[0] = 0;
    c.row_spans.data<int32_t>()[1] = 1;
    DeviceVariantCall call(w, c);
    CudaAttentionOptions o;
    o.tensor_cores = mma;
    std::string err;
    ASSERT_EQ(call.run(stream_, o, &err), SIEVE_OK) << err;
    EXPECT_EQ(kernels::cuda_attention_check_errors(0, stream_, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(err.find("variant.spans[0]"), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace sieve
