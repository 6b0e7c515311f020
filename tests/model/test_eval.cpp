// The fidelity path on the real model: the dense chain is exactly dense (recall 1, KL 0, top-1
// and token agreement 1); a small StreamingLLM window loses attention mass and changes logits,
// and the numbers say so; the CLI prints them (and `sieve` alone tells the known story).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tolerance.hpp"
#include "model_files.hpp"
#include "sieve/model/fidelity_eval.hpp"
#include "sieve/model/llama2c.hpp"
#include "sieve/model/tokenizer.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/util/error.hpp"
#include "../plugins/support/chain_session.hpp"
#include "../plugins/support/run_command.hpp"

using ::testing::HasSubstr;
using namespace sieve;

namespace {

using test::stories;

runtime::Registry& plugins() {
  static runtime::Registry r = sieve::testing::registry_with();
  return r;
}

std::vector<std::vector<int32_t>> prompts() {
  const model::Tokenizer t = model::Tokenizer::load(test::default_tokenizer_path(), 512);
  return {t.encode("Once upon a time", true, false),
          t.encode("Lily and Ben went to the park. They saw a big tree and a small bird. The bird was singing a happy "
                   "song. Lily wanted to catch the bird, but Ben said no. They sat down under the tree and ate "
                   "their apples. Then the bird",
                   true, false)};
}

model::EvalReport eval(const std::string& chain, int32_t steps = 64, DLDevice dev = kCpu) {
  model::EvalOptions o;
  o.steps = steps;
  o.engine.device = dev;
  return model::evaluate_fidelity(stories(), prompts(), model::parse_chain_argument(chain), plugins(), o);
}

TEST(Eval, DenseChainIsExactlyDense) {
  ASSERT_NE(plugins().find("dense"), nullptr) << "the dense plugin was not built into " SIEVE_PLUGIN_DIR;
  const model::EvalReport r = eval("dense");
  EXPECT_EQ(r.prompts, 2);
  EXPECT_EQ(r.positions, 2 * 64);
  ASSERT_EQ(r.layers.size(), 5u);
  for (const auto& l : r.layers) {
    EXPECT_GT(l.prefill.rows, 0);
    EXPECT_GT(l.decode.rows, 0);
    EXPECT_EQ(l.prefill.recall, 1.0);
    EXPECT_EQ(l.decode.recall, 1.0);
    EXPECT_EQ(l.decode.min_recall, 1.0);
    EXPECT_EQ(l.decode.attended, 1.0);
    EXPECT_EQ(l.resident_fraction, 1.0);
    // The f32 core kernel against the f64 reference on the same inputs.
    EXPECT_LT(l.prefill.out_rel_err, 1e-5);
    EXPECT_LT(l.decode.out_rel_err, 1e-5);
  }
  // The dense chain makes the core kernel's calls unchanged: bit-identical logits, KL exactly 0.
  EXPECT_EQ(r.kl_mean, 0.0);
  EXPECT_EQ(r.kl_max, 0.0);
  EXPECT_EQ(r.top1_agreement, 1.0);
  EXPECT_EQ(r.token_agreement, 1.0);
  EXPECT_THAT(r.first_divergence, ::testing::Each(-1));
  EXPECT_EQ(r.dense_tokens, r.chain_tokens);
  EXPECT_EQ(r.kv_bytes_dense, r.kv_bytes_chain);
  EXPECT_GT(r.kv_bytes_dense, 0u);
}

TEST(Eval, SmallStreamingWindowLosesMassAndChangesLogits) {
  ASSERT_NE(plugins().find("streaming"), nullptr) << "the streaming plugin was not built into " SIEVE_PLUGIN_DIR;
  const model::EvalReport r = eval("streaming(sink=4,window=16)");
  // Decode contexts reach 80+ tokens: sink page + a window of at most 2 pages of 16 leaves keys out.
  EXPECT_LT(r.decode.recall, 1.0);
  EXPECT_GT(r.decode.recall, 0.2);  // the window holds the local attention this model has
  EXPECT_LT(r.decode.min_recall, r.decode.recall);
  EXPECT_LT(r.decode.attended, 0.8);
  EXPECT_GT(r.decode.out_rel_err, 1e-3);
  EXPECT_GT(r.kl_mean, 0.0);
  EXPECT_GT(r.kl_max, r.kl_mean);
  EXPECT_LE(r.top1_agreement, 1.0);
  // The second prompt (over 48 tokens) reaches past the sink page + the window pages of its
  // 16-query blocks: its prefill is sparse too.
  EXPECT_LT(r.prefill.recall, 1.0);
  for (const auto& l : r.layers) {
    EXPECT_LT(l.decode.recall, 1.0) << "layer " << l.layer;
    EXPECT_EQ(l.resident_fraction, 1.0);  // streaming selects, it does not evict
  }
  EXPECT_EQ(r.kv_bytes_dense, r.kv_bytes_chain);

  // A decode-only chain leaves the prefill dense.
  const model::EvalReport d = eval("decode:*=streaming(sink=4,window=16)", 32);
  EXPECT_EQ(d.prefill.recall, 1.0);
  EXPECT_LT(d.decode.recall, 1.0);
  // A wider window keeps more of the mass.
  const model::EvalReport w = eval("streaming(sink=4,window=48)");
  EXPECT_GT(w.decode.recall, r.decode.recall);
  EXPECT_LT(w.kl_mean, r.kl_mean);
}

// The same path on the GPU: the CUDA store, the streaming plugin's CUDA selection, probes that
// copy device tensors. Same numbers as the CPU up to f32 rounding.
TEST(Eval, OnCuda) {
  if (runtime::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: the CUDA eval path is checked on the GPU machine";
  const DLDevice gpu{kDLCUDA, 0};
  const model::EvalReport d = eval("dense", 32, gpu);
  EXPECT_EQ(d.decode.recall, 1.0);
  EXPECT_EQ(d.kl_max, 0.0) << "the same kernel calls as the dense engine";
  EXPECT_EQ(d.top1_agreement, 1.0);
  EXPECT_LT(d.decode.out_rel_err, 1e-5);
  EXPECT_LT(d.prefill.out_rel_err, 1e-5);
  const model::EvalReport g = eval("streaming(sink=4,window=16)", 32, gpu);
  const model::EvalReport c = eval("streaming(sink=4,window=16)", 32, kCpu);
  EXPECT_LT(g.decode.recall, 1.0);
  EXPECT_NEAR(g.decode.recall, c.decode.recall, 1e-4);
  EXPECT_NEAR(g.prefill.recall, c.prefill.recall, 1e-4);
  EXPECT_NEAR(g.decode.attended, c.decode.attended, 1e-12);
  EXPECT_NEAR(g.kl_mean, c.kl_mean, 1e-3 + 0.05 * c.kl_mean);
  EXPECT_EQ(g.dense_tokens, c.dense_tokens);
}

TEST(Eval, KlDivergence) {
  const std::vector<float> p = {1.f, 2.f, 3.f}, q = {3.f, 2.f, 1.f};
  EXPECT_DOUBLE_EQ(model::kl_divergence(p, p), 0.0);
  // Direct: Σ p (log p − log q) with p = softmax(1,2,3), q = softmax(3,2,1) = reverse of p.
  double z = std::exp(1.0) + std::exp(2.0) + std::exp(3.0), kl = 0;
  for (int i = 0; i < 3; ++i) kl += std::exp(double(p[i])) / z * (double(p[i]) - double(q[i]));
  // f64 on both sides: a log-softmax entry (3-term exp sum, log, subtraction) is off by at most
  // gamma(8) x (|logit| + lse) <= gamma(8) x 7 per side; KL sums 3 terms p (lp - lq), |lp - lq| <= 2.
  namespace tol = sieve::tolerance;
  EXPECT_NEAR(model::kl_divergence(p, q), kl,
              tol::kSafety * (2 * 7 * tol::gamma(8, tol::kF64) + 2 * tol::gamma(6, tol::kF64)));
}

TEST(Eval, RefusesBadChains) {
  auto msg = [](auto f) {
    try {
      f();
    } catch (const sieve::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(msg([] { eval("nosuch(window=4)", 4); }), HasSubstr("unknown policy 'nosuch'"));
  EXPECT_THAT(msg([] { eval("7=streaming", 4); }), HasSubstr("7"));
  EXPECT_THAT(msg([] { eval("streaming(window=0)", 4); }), HasSubstr("window"));
  EXPECT_THAT(msg([] { model::parse_chain_argument("*=streaming(("); }), HasSubstr("chain spec, col"));
}

// ---- the CLI --------------------------------------------------------------------------------

using CliRun = sieve::testing::CommandResult;

CliRun sieve_cli(const std::string& args) {
  // From another directory: the embedded model needs no file.
  return sieve::testing::run_command("cd / && '" + std::string(SIEVE_BIN_DIR) + "/sieve' " + args + " 2>&1");
}

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(SIEVE_BIN_DIR) + "/sieve"))
      GTEST_SKIP() << "the sieve executable was not built (no Boost.program_options)";
  }
};

TEST_F(Cli, NoArgumentsTellsTheStory) {
  const CliRun r = sieve_cli("");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::StartsWith("Once upon a time, there was a little girl named Lily. She loved to play "
                                           "outside in the park."));
  EXPECT_THAT(r.out, HasSubstr("tokens/s"));
  EXPECT_THAT(r.out, HasSubstr("KV bytes"));
}

TEST_F(Cli, RunWithPromptAndChain) {
  const CliRun r = sieve_cli("run --prompt 'Lily saw a cat' --steps 20 --chain 'streaming(sink=4,window=16)' "
                             "--plugin-dir " SIEVE_PLUGIN_DIR);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, ::testing::StartsWith("Lily saw a cat"));
  EXPECT_THAT(r.out, HasSubstr("chain: *=streaming(sink=4,window=16)"));
}

TEST_F(Cli, EvalPrintsJson) {
  const CliRun r = sieve_cli("eval --chain 'streaming(sink=4,window=16)' --steps 40 --json --plugin-dir " SIEVE_PLUGIN_DIR);
  ASSERT_EQ(r.status, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompts"], 4);
  EXPECT_EQ(j["layers"].size(), 5u);
  EXPECT_LT(j["attention"]["decode"]["recall"].get<double>(), 1.0);
  EXPECT_GT(j["teacher_forced"]["kl_mean"].get<double>(), 0.0);
  EXPECT_EQ(j["texts"].size(), 4u);
}

TEST_F(Cli, BadInputIsOneLineAndNonZero) {
  CliRun r = sieve_cli("run --model /nonexistent/model.bin");
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "sieve run: model '/nonexistent/model.bin': cannot open: No such file or directory\n");
  r = sieve_cli("eval --chain 'nosuch' --plugin-dir " SIEVE_PLUGIN_DIR);
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.out, HasSubstr("unknown policy 'nosuch'"));
  r = sieve_cli("eval");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("--chain is required"));
  r = sieve_cli("run --device tpu");
  EXPECT_EQ(r.status, 2);
  EXPECT_THAT(r.out, HasSubstr("--device must be cpu or cuda"));
}

}  // namespace
