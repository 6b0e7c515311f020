// DELTA through the real runtime on the real model (stories260K, 5 layers), measured by the host's
// fidelity path (evaluate_fidelity reads the selection each layer's runner really used): dense and
// Δ-layers attend everything, the sparse layers attend a budget-bounded subset with high recall,
// nothing is evicted, a budget covering the context is exactly dense; on CUDA (skipped without a
// GPU) the same numbers as on the CPU — the kernel's page statistics, the CUDA top-k and the
// device-to-device copies together. And `sieve calibrate delta` (when the CLI was built).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "../support/chain_session.hpp"
#include "../support/run_command.hpp"
#include "model_files.hpp"
#include "sieve/model/fidelity_eval.hpp"
#include "sieve/model/tokenizer.hpp"
#include "sieve/runtime/host_services.hpp"
#include "sieve/runtime/registry.hpp"

using namespace sieve;

namespace {

using test::stories;

runtime::Registry& plugins() {
  static runtime::Registry r = sieve::testing::registry_with();
  return r;
}

model::EvalReport eval(const std::string& chain, int32_t steps, DLDevice dev = kCpu) {
  const model::Tokenizer t = model::Tokenizer::load(test::default_tokenizer_path(), 512);
  const std::vector<std::vector<int32_t>> prompts = {
      t.encode("Once upon a time", true, false),
      t.encode("Lily and Ben went to the park. They saw a big tree and a small bird. The bird was singing.", true,
               false)};
  model::EvalOptions o;
  o.steps = steps;
  o.engine.device = dev;
  return model::evaluate_fidelity(stories(), prompts, model::parse_chain_argument(chain), plugins(), o);
}

const char* kSmall = "decode:*=delta(token_budget=32,recent=8,dense_layers=[0,1],select_layers=[2])";

TEST(DeltaModel, SparseLayersAttendTheBudgetAndDenseLayersEverything) {
  ASSERT_NE(plugins().find("delta"), nullptr) << "the delta plugin was not built into " SIEVE_PLUGIN_DIR;
  const model::EvalReport r = eval(kSmall, 96);
  ASSERT_EQ(r.layers.size(), 5u);
  for (int32_t l : {0, 1, 2}) {
    EXPECT_DOUBLE_EQ(r.layers[size_t(l)].decode.recall, 1.0) << "layer " << l << " is dense / a Δ-layer";
    EXPECT_DOUBLE_EQ(r.layers[size_t(l)].decode.attended, 1.0) << "layer " << l;
    EXPECT_LT(r.layers[size_t(l)].decode.out_rel_err, 1e-5) << "layer " << l;
  }
  for (int32_t l : {3, 4}) {
    const model::AttentionFidelity& a = r.layers[size_t(l)].decode;
    EXPECT_LT(a.attended, 0.7) << "layer " << l << " is sparse: 32 of up to ~120 tokens";
    EXPECT_LT(a.recall, 1.0) << "layer " << l;
    EXPECT_GT(a.recall, 0.6) << "layer " << l << ": the Δ-layer's pages keep most of the mass";
  }
  for (const auto& l : r.layers) {
    EXPECT_DOUBLE_EQ(l.prefill.recall, 1.0) << "DELTA is decode only";
    EXPECT_DOUBLE_EQ(l.resident_fraction, 1.0) << "DELTA never evicts";
  }
  EXPECT_EQ(r.kv_bytes_chain, r.kv_bytes_dense);
  EXPECT_GT(r.top1_agreement, 0.8);
}

TEST(DeltaModel, ABudgetCoveringTheContextIsDense) {
  const model::EvalReport r =
      eval("decode:*=delta(token_budget=512,recent=32,dense_layers=[0,1],select_layers=[2,3])", 32);
  EXPECT_DOUBLE_EQ(r.decode.recall, 1.0);
  EXPECT_DOUBLE_EQ(r.decode.attended, 1.0);
  EXPECT_EQ(r.kl_max, 0.0) << "every page attended: the dense kernel calls, bit-identical logits";
  EXPECT_EQ(r.top1_agreement, 1.0);
  EXPECT_EQ(r.token_agreement, 1.0);
}

TEST(DeltaModel, CudaMatchesTheCpu) {
  if (runtime::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: the CUDA path is checked on the GPU machine";
  const DLDevice gpu{kDLCUDA, 0};
  for (const char* chain : {kSmall, "decode:*=delta(token_budget=32,recent=8,dense_layers=[0,1],select_layers=[2,4],"
                                    "per_kv_head=true)"}) {
    SCOPED_TRACE(chain);
    const model::EvalReport g = eval(chain, 64, gpu);
    const model::EvalReport c = eval(chain, 64, kCpu);
    for (size_t l = 0; l < c.layers.size(); ++l) {
      EXPECT_NEAR(g.layers[l].decode.recall, c.layers[l].decode.recall, 1e-4) << "layer " << l;
      // The same pages (up to page scores within f32 rounding of a tie).
      EXPECT_NEAR(g.layers[l].decode.attended, c.layers[l].decode.attended, 1e-3) << "layer " << l;
    }
    EXPECT_NEAR(g.kl_mean, c.kl_mean, 1e-3 + 0.05 * c.kl_mean);
    EXPECT_EQ(g.dense_tokens, c.dense_tokens);
  }
}

sieve::testing::CommandResult sieve_cli(const std::string& args) {
  return sieve::testing::run_command(std::string(SIEVE_BIN_DIR) + "/sieve " + args + " 2>&1");
}

TEST(DeltaCalibrate, PrintsPerLayerShiftsAndSuggestsDeltaLayers) {
  if (!std::filesystem::exists(std::string(SIEVE_BIN_DIR) + "/sieve"))
    GTEST_SKIP() << "the sieve executable was not built (no Boost.program_options)";
  const auto r = sieve_cli("calibrate delta --steps 40 --select 2 --json");
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["layers"].size(), 5u);
  EXPECT_EQ(j["dense_layers"], nlohmann::json({0, 1}));
  ASSERT_EQ(j["select_layers"].size(), 2u);
  EXPECT_EQ(j["select_layers"][0], 2) << "the first layer after the dense ones must select";
  // The second Δ-layer is the later layer of largest shift.
  const int second = j["select_layers"][1];
  const double s3 = j["layers"][3]["shift_tv"], s4 = j["layers"][4]["shift_tv"];
  EXPECT_EQ(second, s3 >= s4 ? 3 : 4);
  for (const auto& l : j["layers"]) {
    EXPECT_GT(l["shift_tv"].get<double>(), 0.0);
    EXPECT_LE(l["shift_tv"].get<double>(), 1.0) << "a total variation";
    EXPECT_EQ(l["shift_rows"].get<int64_t>(), 4 * 39 * 8) << "prompts x step pairs x heads";
  }
  EXPECT_THAT(j["chain_file"].get<std::string>(), ::testing::HasSubstr("decode:*=delta@d"));
  EXPECT_EQ(sieve_cli("calibrate nosuch").status, 2);
  const auto bad = sieve_cli("calibrate delta --token-budget 100");
  EXPECT_EQ(bad.status, 2);
  EXPECT_THAT(bad.out, ::testing::HasSubstr("must be a multiple of the page size"));
}

}  // namespace
