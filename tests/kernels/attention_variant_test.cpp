// The core kernels' extension point (sieve_attention_variant, ABI 1.1) on the CPU against its f64
// reference (common/variant_case.hpp): key spans, packed keys with a count weighting (causally
// clipped) and a logit bias per key, ragged GQA prefill, every row head kind and a decode, into
// NaN-poisoned outputs; a variant listing every visible key once equals plain attention; malformed
// variants get one line naming the field.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "common/variant_case.hpp"
#include "sieve/kernels/attention_cpu.hpp"

namespace sieve {
namespace {

using reference::Workload;
using reference::WorkloadSpec;
using variant_test::expect_matches_reference;
using variant_test::ragged_prefill;
using variant_test::VariantCase;

TEST(AttentionVariantCpu, MatchesTheF64ReferenceForEveryRowHeadKind) {
  for (DLDataType dt : {kF32, kBF16})
    for (uint32_t heads : {SIEVE_SEL_PER_SEQUENCE, SIEVE_SEL_PER_KV_HEAD, SIEVE_SEL_PER_Q_HEAD})
      for (int32_t q_block : {1, 16, 64}) {
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " heads " << heads << " q_block " << q_block);
        Workload w(ragged_prefill(dt, 40));
        w.request_lse();
        VariantCase c(w, heads, q_block, 7 + heads * 10 + uint64_t(q_block));
        w.poison_outputs();
        std::string err;
        ASSERT_EQ(kernels::attend_cpu(w.args, &err), SIEVE_OK) << err;
        expect_matches_reference(w, c);
      }
}

TEST(AttentionVariantCpu, CountsAndBiasesAreEachOptional) {
  for (int mode = 0; mode < 3; ++mode) {
    Workload w(ragged_prefill(kF32, 64));
    w.request_lse();
    VariantCase c(w, SIEVE_SEL_PER_KV_HEAD, 16, 3, /*counts=*/mode != 1, /*biases=*/mode != 2);
    w.poison_outputs();
    std::string err;
    ASSERT_EQ(kernels::attend_cpu(w.args, &err), SIEVE_OK) << err;
    expect_matches_reference(w, c);
  }
}

TEST(AttentionVariantCpu, DecodeRowsAreOneTokenBlocks) {
  WorkloadSpec s = ragged_prefill(kF32, 64);
  s.phase = SIEVE_PHASE_DECODE;
  s.n_new.clear();
  Workload w(s);
  w.request_lse();
  VariantCase c(w, SIEVE_SEL_PER_Q_HEAD, 1, 11);
  w.poison_outputs();
  std::string err;
  ASSERT_EQ(kernels::attend_cpu(w.args, &err), SIEVE_OK) << err;
  expect_matches_reference(w, c);
}

// One KEYS span [0, kv_len) per row is plain causal attention: the same kernel's dense result.
TEST(AttentionVariantCpu, EveryKeyOnceIsPlainAttention) {
  Workload w(ragged_prefill(kF32, 64));
  std::string err;
  w.poison_outputs();
  ASSERT_EQ(kernels::attend_cpu(w.args, &err), SIEVE_OK) << err;
  const HostTensor dense = w.out;
  VariantCase c(w, SIEVE_SEL_PER_SEQUENCE, 1 << 20, 1);
  c.spans = HostTensor({w.batch, 3}, kI32);
  c.row_spans = HostTensor({w.batch, 2}, kI32);
  int32_t r = 0;
  for (int32_t b = 0; b < w.batch; ++b) {
    const int32_t span[3] = {SIEVE_SPAN_KEYS, 0, w.kv_len[size_t(b)]};
    std::copy(span, span + 3, c.spans.data<int32_t>() + 3 * b);
    if (w.n_new[size_t(b)] == 0) continue;  // no row
    c.row_spans.data<int32_t>()[2 * r] = b;
    c.row_spans.data<int32_t>()[2 * r + 1] = b + 1;
    ++r;
  }
  c.v.n_rows = r;
  c.row_spans.dl().shape[0] = r;
  c.v.row_spans = c.row_spans.dl();
  c.v.spans = c.spans.dl();
  w.poison_outputs();
  ASSERT_EQ(kernels::attend_cpu(w.args, &err), SIEVE_OK) << err;
  const tolerance::AttentionBound bound = tolerance::attention_bound(w);
  for (int64_t i = 0; i < dense.numel(); ++i) ASSERT_NEAR(w.out.get(i), dense.get(i), 2 * bound.element) << i;
}

TEST(AttentionVariantCpu, MalformedVariantsGetOneLineNamingTheField) {
  struct Tamper {
    const char* what;
    void (*apply)(VariantCase&);
    const char* expect;
  };
  const Tamper cases[] = {
      {"n_rows", [](VariantCase& c) { c.v.n_rows += 1; }, "variant.n_rows"},
      {"q_block", [](VariantCase& c) { c.v.q_block = 0; }, "variant.q_block"},
      {"heads", [](VariantCase& c) { c.v.heads = 7; }, "variant.heads"},
      {"span kind", [](VariantCase& c) { c.spans.data<int32_t>()[0] = 5; }, "kind"},
      {"span range", [](VariantCase& c) { c.spans.data<int32_t>()[2] = int32_t(c.packed_pos.numel()) + 1; }, "variant.spans[0]"},
      {"row range", [](VariantCase& c) { c.row_spans.data<int32_t>()[1] = int32_t(c.spans.numel()); }, "variant row 0"},
      {"packed pos", [](VariantCase& c) { c.packed_pos.data<int32_t>()[0] = 1 << 20; }, "variant.packed_pos[0]"},
      {"count", [](VariantCase& c) { c.packed_count.data<int32_t>()[0] = 0; }, "variant.packed_count[0]"},
      {"count dtype", [](VariantCase& c) { c.v.packed_count.dtype = kF32; }, "variant.packed_count: dtype"},
  };
  for (const Tamper& t : cases) {
    SCOPED_TRACE(t.what);
    Workload w(ragged_prefill(kF32, 64));
    VariantCase c(w, SIEVE_SEL_PER_Q_HEAD, 16, 5);
    // Row 0's first span is PACKED over sequence 0's KV head 0 list, which starts at entry 0.
    c.spans.data<int32_t>()[0] = SIEVE_SPAN_PACKED;
    c.spans.data<int32_t>()[1] = 0;
    c.spans.data<int32_t>()[2] = 1;
    c.row_spans.data<int32_t>()[0] = 0;
    c.row_spans.data<int32_t>()[1] = 1;
    t.apply(c);
    std::string err;
    EXPECT_EQ(kernels::attend_cpu(w.args, &err), SIEVE_ERR_INVALID_ARGUMENT);
    EXPECT_NE(err.find(t.expect), std::string::npos) << err;
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
}

TEST(AttentionVariantCpu, RefusesASelectionBesideTheVariant) {
  Workload w(ragged_prefill(kF32, 64));
  w.set_selection(SIEVE_SEL_PER_SEQUENCE, 16, 1, w.random_selection_rows(SIEVE_SEL_PER_SEQUENCE, 16, 1, 0.5, 2));
  VariantCase c(w, SIEVE_SEL_PER_Q_HEAD, 16, 5);
  std::string err;
  EXPECT_EQ(kernels::attend_cpu(w.args, &err), SIEVE_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("replace the selection"), std::string::npos) << err;
}

// A 1.0 producer's args end before `variant`: accepted, computed as plain attention.
TEST(AttentionVariantCpu, ArgsOfABI10CarryNoVariant) {
  Workload w(ragged_prefill(kF32, 64));
  std::string err;
  ASSERT_EQ(kernels::attend_cpu(w.args, &err), SIEVE_OK) << err;
  const HostTensor dense = w.out;
  VariantCase c(w, SIEVE_SEL_PER_Q_HEAD, 16, 5);
  w.args.hdr.struct_size = uint32_t(offsetof(sieve_attention_args, variant));
  w.poison_outputs();
  ASSERT_EQ(kernels::attend_cpu(w.args, &err), SIEVE_OK) << err;
  for (int64_t i = 0; i < dense.numel(); ++i) ASSERT_EQ(w.out.get(i), dense.get(i)) << i;
}

}  // namespace
}  // namespace sieve
