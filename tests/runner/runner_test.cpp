// The layer runner, through the synthetic session that `sieve attn` and `sieve conform` use:
// chains produce the attention of the selection they made (checked against f64), misbehaving
// plugins are named with their layer and hook, and the numeric conformance part passes on the
// in-tree plugins and fails on the broken fixtures.
#include <gtest/gtest.h>

#include <unistd.h>

#include <iostream>
#include <string>

#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/conformance.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/workload/synthetic.hpp"
#include "sieve/util/tensor.hpp"
#include "../plugins/support/chain_session.hpp"
#include "../plugins/support/run_command.hpp"

using namespace sieve;
using namespace sieve::runtime;

namespace {

using sieve::testing::CommandResult;
using sieve::testing::parse_chain;
using sieve::testing::registry_with;
using sieve::testing::run_command;

SyntheticSpec small(uint32_t phase) { return sieve::testing::small_session(phase, 64, {300, 77, 16}, 40); }

}  // namespace

TEST(LayerRunner, AnEmptyChainIsDenseAttentionOfTheCoreKernel) {
  Registry reg = registry_with({SIEVE_PLUGIN_DIR});
  for (uint32_t phase : {uint32_t(SIEVE_PHASE_DECODE), uint32_t(SIEVE_PHASE_PREFILL)}) {
    SyntheticReport r;
    std::string error;
    ASSERT_TRUE(run_synthetic(small(phase), ChainSpec{}, reg, &r, &error)) << error;
    EXPECT_LT(r.rel_err, 1e-5);
    EXPECT_LT(r.kernel_rel_err, 1e-5);
    EXPECT_DOUBLE_EQ(r.recall, 1.0);
    EXPECT_DOUBLE_EQ(r.attended_fraction, 1.0);
    EXPECT_EQ(r.non_finite, 0);
    // 3 sequences, pages of 2 heads x 16 tokens x 64 dims x f32 for K and V.
    EXPECT_EQ(r.kv_bytes, uint64_t(19 + 5 + 1) * 2 * 2 * 16 * 64 * 4);
  }
}

TEST(LayerRunner, StreamingAttendsItsWindowExactlyAndLosesTheRestOfTheMass) {
  Registry reg = registry_with({SIEVE_PLUGIN_DIR});
  ASSERT_NE(reg.find("streaming"), nullptr);
  for (uint32_t phase : {uint32_t(SIEVE_PHASE_DECODE), uint32_t(SIEVE_PHASE_PREFILL)}) {
    SyntheticReport r;
    std::string error;
    ASSERT_TRUE(run_synthetic(small(phase), parse_chain("*=streaming(sink=4,window=32)"), reg, &r, &error)) << error;
    EXPECT_LT(r.kernel_rel_err, 1e-5) << "the output is the attention over the pages streaming selected";
    EXPECT_GT(r.rel_err, 1e-3) << "a 32-token window differs from dense on a 300-token context";
    EXPECT_LT(r.recall, 0.999);
    EXPECT_GT(r.recall, 0.0);
    EXPECT_LT(r.attended_fraction, 0.9);
    EXPECT_EQ(r.hook_allocations, 0u);
  }
  // A window that covers everything is dense again.
  SyntheticReport r;
  std::string error;
  ASSERT_TRUE(run_synthetic(small(SIEVE_PHASE_DECODE), parse_chain("*=streaming(sink=0,window=4096)"), reg, &r, &error))
      << error;
  EXPECT_DOUBLE_EQ(r.recall, 1.0);
  EXPECT_LT(r.rel_err, 1e-5);
  // And `dense` after `streaming` ends dense.
  ASSERT_TRUE(run_synthetic(small(SIEVE_PHASE_DECODE), parse_chain("*=streaming(window=16)>dense"), reg, &r, &error))
      << error;
  EXPECT_DOUBLE_EQ(r.recall, 1.0);
}

TEST(LayerRunner, MisbehavingPluginsAreNamedWithLayerAndHook) {
  Registry reg = registry_with({SIEVE_PLUGIN_DIR, SIEVE_FIXTURE_DIR});
  struct Case {
    const char* chain;
    const char* expect;
  } cases[] = {
      {"decode:*=bad_page_id", "plugin 'bad_page_id' (instance bad_page_id), layer 0, hook select: selection row 0"},
      {"decode:*=returns_error", "plugin 'returns_error' (instance returns_error), layer 0, hook select: SIEVE_ERR_INTERNAL"},
      {"decode:*=writes_nan", "plugin 'writes_nan' (instance writes_nan), layer 0, hook attend: output is NaN"},
  };
  for (const auto& c : cases) {
    SyntheticReport r;
    std::string error;
    EXPECT_FALSE(run_synthetic(small(SIEVE_PHASE_DECODE), parse_chain(c.chain), reg, &r, &error)) << c.chain;
    EXPECT_NE(error.find(c.expect), std::string::npos) << c.chain << ": " << error;
  }
  // Resolution errors are refused before anything runs.
  SyntheticReport r;
  std::string error;
  EXPECT_FALSE(run_synthetic(small(SIEVE_PHASE_DECODE), parse_chain("3=streaming"), reg, &r, &error));
  EXPECT_NE(error.find("layer 3 does not exist"), std::string::npos) << error;
}

TEST(Conformance, InTreePluginsPassTheNumericPartAndFixturesFailIt) {
  ConformOptions o;
  // In-process: earlier tests of this binary started OpenMP's thread pool, and a forked child of
  // a process with live OpenMP threads can deadlock in libgomp. `sieve conform` forks from a fresh
  // process and keeps the isolation.
  o.isolate = false;
  for (const char* name : {"dense", "streaming"}) {
    ConformReport rep = conform(std::string(SIEVE_PLUGIN_DIR) + "/libsieve_" + name + ".so", o);
    for (const auto& c : rep.checks) EXPECT_FALSE(!c.passed && !c.skipped) << name << ": " << c.name << ": " << c.detail;
    const ConformCheck* cpu = rep.find("numeric_cpu_decode");
    ASSERT_NE(cpu, nullptr) << name;
    EXPECT_TRUE(cpu->passed) << cpu->detail;
    ASSERT_NE(rep.find("hooks_reject_null_arguments"), nullptr);
    EXPECT_TRUE(rep.passed());
    if (cuda_devices() > 0) {  // on the GPU machine the CUDA half must really run
      for (const char* check : {"numeric_cuda_decode", "numeric_cuda_prefill"}) {
        const ConformCheck* g = rep.find(check);
        ASSERT_NE(g, nullptr) << name << ": " << check << " did not run";
        EXPECT_TRUE(g->passed) << name << ": " << g->detail;
        std::cout << name << " " << check << ": " << g->detail << "\n";
      }
    }
  }
  ConformReport bad = conform(std::string(SIEVE_FIXTURE_DIR) + "/libsieve_bad_page_id.so", o);
  EXPECT_FALSE(bad.passed());
  const ConformCheck* c = bad.find("numeric_cpu_decode");
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->passed);
  EXPECT_NE(c->detail.find("hook select"), std::string::npos) << c->detail;
  ConformReport nan = conform(std::string(SIEVE_FIXTURE_DIR) + "/libsieve_writes_nan.so", o);
  c = nan.find("numeric_cpu_decode");
  ASSERT_NE(c, nullptr);
  EXPECT_FALSE(c->passed);
  EXPECT_NE(c->detail.find("NaN"), std::string::npos) << c->detail;
}

// `sieve attn` with no chain runs the built-in workload (`sieve` alone runs the model: tests/model).
TEST(SieveCli, TheDefaultJobRunsDenseAndStreamingWithFidelity) {
  const std::string bin = std::string(SIEVE_BIN_DIR) + "/sieve";
  if (access(bin.c_str(), X_OK) != 0)
    GTEST_SKIP() << "the sieve CLI was not built (Boost.program_options missing at configure time)";
  CommandResult r = run_command(bin + " attn 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("dense                                1.0000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("streaming(sink=4,window=256)"), std::string::npos) << r.out;
  // JSON for machines, and bad input gets one line and a non-zero status.
  r = run_command(bin + " attn --chain 'streaming(window=64)' --context 500 --q-heads 4 --kv-heads 2 --head-dim 8 --json 2>&1");
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("\"recall\""), std::string::npos) << r.out;
  r = run_command(bin + " attn --chain 'streaming(window=-1)' 2>&1");
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(r.out, "sieve attn: streaming: window=-1 is out of range [1, 2147483647]\n");
}

// The same session on a CUDA device: the CUDA store, the CUDA kernels and the plugins' CUDA code
// give the attention of the same selection as on the CPU.
TEST(LayerRunnerCuda, ChainsOnCudaMatchTheReferenceAndTheCpuSelection) {
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: this test runs on the GPU machine";
  Registry reg = registry_with({SIEVE_PLUGIN_DIR});
  for (uint32_t phase : {uint32_t(SIEVE_PHASE_DECODE), uint32_t(SIEVE_PHASE_PREFILL)}) {
    for (const char* c : {"", "*=streaming(sink=4,window=32)", "*=dense"}) {
      for (DLDataType dt : {kF32, kBF16}) {
        SyntheticSpec s = small(phase);
        s.kv_dtype = dt;
        SyntheticReport cpu, gpu;
        std::string error;
        ChainSpec spec = *c ? parse_chain(c) : ChainSpec{};
        ASSERT_TRUE(run_synthetic(s, spec, reg, &cpu, &error)) << error;
        s.device = DLDevice{kDLCUDA, 0};
        ASSERT_TRUE(run_synthetic(s, spec, reg, &gpu, &error)) << c << ": " << error;
        const double tol = same_dtype(dt, kF32) ? 1e-5 : 1e-2;
        EXPECT_LT(gpu.kernel_rel_err, tol) << c;
        EXPECT_EQ(gpu.non_finite, 0) << c;
        EXPECT_DOUBLE_EQ(gpu.recall, cpu.recall) << c << ": CPU and CUDA attend the same keys";
        EXPECT_EQ(gpu.kv_bytes, cpu.kv_bytes) << c;
        EXPECT_EQ(gpu.hook_allocations, 0u) << c;
      }
    }
  }
}

// A plugin with CUDA kernels loaded and dropped before CUDA is initialised, then loaded again and
// used on the GPU: crashed at the first launch until the loader pinned plugin code (loader.hpp).
// It must be the first CUDA use of its process, as under ctest (one process per test).
TEST(LayerRunnerCuda, APluginDroppedBeforeCudaStartsWorksWhenLoadedAgain) {
  {  // CPU only: nothing has touched CUDA yet (not even the device count below)
    Registry first = registry_with({SIEVE_PLUGIN_DIR});
    SyntheticReport r;
    std::string error;
    ASSERT_TRUE(run_synthetic(small(SIEVE_PHASE_DECODE), parse_chain("*=streaming(window=32)"), first, &r, &error)) << error;
  }
  if (cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: this test runs on the GPU machine";
  Registry again = registry_with({SIEVE_PLUGIN_DIR});
  SyntheticSpec s = small(SIEVE_PHASE_DECODE);
  s.device = DLDevice{kDLCUDA, 0};
  SyntheticReport r;
  std::string error;
  ASSERT_TRUE(run_synthetic(s, parse_chain("*=streaming(window=32)"), again, &r, &error)) << error;
  EXPECT_LT(r.kernel_rel_err, 1e-5);
}
