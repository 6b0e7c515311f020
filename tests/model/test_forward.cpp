// The forward pass: the known greedy story (CPU, and CUDA where a device exists), CPU vs CUDA
// logits, prefill in one pass vs token by token, batched decode of sequences of different lengths
// vs each alone, and the engine's refusals.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/tolerance.hpp"
#include "model_files.hpp"
#include "sieve/model/engine.hpp"
#include "sieve/model/generate.hpp"
#include "sieve/model/llama2c.hpp"
#include "sieve/model/tokenizer.hpp"
#include "sieve/util/error.hpp"

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace sieve;

namespace {

constexpr const char* kStory =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw "
    "a big, red ball.";

using test::stories;

const model::Tokenizer& tok() {
  static const model::Tokenizer t = model::Tokenizer::load(test::default_tokenizer_path(), 512);
  return t;
}

model::EngineOptions options(DLDevice dev, int32_t max_batch = 1) {
  model::EngineOptions o;
  o.device = dev;
  o.max_batch = max_batch;
  return o;
}

// ‖a − b‖ / ‖b‖ in f64.
double rel(const std::vector<float>& a, const std::vector<float>& b, size_t from = 0, size_t n = SIZE_MAX) {
  n = std::min(n, b.size() - from);
  double d = 0, r = 0;
  for (size_t i = from; i < from + n; ++i) {
    d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    r += double(b[i]) * b[i];
  }
  return std::sqrt(d / r);
}

std::string greedy_story(DLDevice dev) {
  model::Engine e(stories(), options(dev), runtime::ResolvedChains{});
  model::GenerateOptions g;
  g.steps = 48;
  const auto out = model::generate(e, {{model::Tokenizer::kBos}}, g);
  return tok().decode(out[0].tokens, model::Tokenizer::kBos);
}

bool have_cuda() { return runtime::cuda_devices() > 0; }

TEST(Forward, GreedyStoryFromBosOnCpu) { EXPECT_THAT(greedy_story(kCpu), StartsWith(kStory)); }

TEST(Forward, GreedyStoryFromBosOnCuda) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device: the CUDA forward pass is checked on the GPU machine";
  EXPECT_THAT(greedy_story(DLDevice{kDLCUDA, 0}), StartsWith(kStory));
}

TEST(Forward, CpuAndCudaLogitsAgree) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device: the CUDA forward pass is checked on the GPU machine";
  const std::vector<int32_t> prompt = tok().encode("Lily and Ben went to the park to play with a ball", true, false);
  model::Engine cpu(stories(), options(kCpu), runtime::ResolvedChains{});
  model::Engine gpu(stories(), options(DLDevice{kDLCUDA, 0}), runtime::ResolvedChains{});
  const int32_t a = cpu.add_sequence(), b = gpu.add_sequence();
  std::vector<float> lc, lg;
  cpu.prefill(std::vector<int32_t>{a}, {prompt}, &lc);
  gpu.prefill(std::vector<int32_t>{b}, {prompt}, &lg);
  EXPECT_LE(rel(lg, lc), 1e-4) << "after the prefill";
  for (int step = 0; step < 24; ++step) {
    const int32_t next = int32_t(std::max_element(lc.begin(), lc.end()) - lc.begin());
    cpu.decode(std::vector<int32_t>{a}, std::vector<int32_t>{next}, &lc);
    gpu.decode(std::vector<int32_t>{b}, std::vector<int32_t>{next}, &lg);
    EXPECT_LE(rel(lg, lc), 1e-4) << "decode step " << step;
  }
}

// Prompt prefill in ONE pass per layer gives the logits token-by-token decode gives.
void prefill_matches_decode(DLDevice dev) {
  const std::vector<int32_t> prompt =
      tok().encode("Once upon a time, there was a big dog named Max. Max liked to run and jump in the sun.", true, false);
  ASSERT_GT(prompt.size(), 20u);  // crosses a 16-token page
  model::Engine one(stories(), options(dev), runtime::ResolvedChains{});
  model::Engine each(stories(), options(dev), runtime::ResolvedChains{});
  const int32_t a = one.add_sequence(), b = each.add_sequence();
  std::vector<float> la, lb;
  one.prefill(std::vector<int32_t>{a}, {prompt}, &la);
  each.prefill(std::vector<int32_t>{b}, {{prompt[0]}}, &lb);
  for (size_t i = 1; i < prompt.size(); ++i) each.decode(std::vector<int32_t>{b}, std::vector<int32_t>{prompt[i]}, &lb);
  EXPECT_LE(rel(la, lb), 1e-5);
  EXPECT_EQ(one.seq_len(a), int32_t(prompt.size()));
  EXPECT_EQ(each.seq_len(b), int32_t(prompt.size()));
  // And the two caches continue identically.
  const int32_t next = int32_t(std::max_element(la.begin(), la.end()) - la.begin());
  one.decode(std::vector<int32_t>{a}, std::vector<int32_t>{next}, &la);
  each.decode(std::vector<int32_t>{b}, std::vector<int32_t>{next}, &lb);
  EXPECT_LE(rel(la, lb), 1e-5);
}

TEST(Forward, PrefillInOnePassEqualsTokenByTokenOnCpu) { prefill_matches_decode(kCpu); }
TEST(Forward, PrefillInOnePassEqualsTokenByTokenOnCuda) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device: the CUDA forward pass is checked on the GPU machine";
  prefill_matches_decode(DLDevice{kDLCUDA, 0});
}

// Three sequences of different lengths prefilled together and decoded as one batch give each
// sequence's logits when it runs alone.
void batched_matches_single(DLDevice dev) {
  const std::vector<std::vector<int32_t>> prompts = {
      tok().encode("The cat", true, false),
      tok().encode("Tom had a red car. He drove it to the shop every day", true, false),
      tok().encode("One day, Sue found a shiny stone near the river. She picked it up and showed it to her mom, "
                   "who smiled and said",
                   true, false)};
  ASSERT_LT(prompts[0].size(), 16u);
  ASSERT_GT(prompts[2].size(), 32u);
  const int32_t steps = 12, V = stories().config.vocab_size;

  // Alone: logits at each position and the greedy tokens.
  std::vector<std::vector<std::vector<float>>> alone(3);
  std::vector<std::vector<int32_t>> tokens(3);
  for (size_t s = 0; s < 3; ++s) {
    model::Engine e(stories(), options(dev), runtime::ResolvedChains{});
    const int32_t id = e.add_sequence();
    std::vector<float> l;
    e.prefill(std::vector<int32_t>{id}, {prompts[s]}, &l);
    for (int32_t i = 0; i < steps; ++i) {
      alone[s].push_back(l);
      tokens[s].push_back(int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
      e.decode(std::vector<int32_t>{id}, std::vector<int32_t>{tokens[s].back()}, &l);
    }
  }
  // Together.
  model::Engine e(stories(), options(dev, 3), runtime::ResolvedChains{});
  std::vector<int32_t> ids = {e.add_sequence(), e.add_sequence(), e.add_sequence()};
  std::vector<float> l;
  e.prefill(ids, prompts, &l);
  for (int32_t i = 0; i < steps; ++i) {
    std::vector<int32_t> feed;
    for (size_t s = 0; s < 3; ++s) {
      std::vector<float> row(l.begin() + s * V, l.begin() + (s + 1) * V);
      EXPECT_LE(rel(row, alone[s][size_t(i)]), 1e-5) << "sequence " << s << ", position " << i;
      feed.push_back(tokens[s][size_t(i)]);
    }
    e.decode(ids, feed, &l);
  }
  for (size_t s = 0; s < 3; ++s) EXPECT_EQ(e.seq_len(ids[s]), int32_t(prompts[s].size()) + steps);
  // A decode step over a subset, in another order, still matches.
  std::vector<float> l2;
  e.decode(std::vector<int32_t>{ids[2], ids[0]}, std::vector<int32_t>{5, 7}, &l2);
  ASSERT_EQ(l2.size(), size_t(2 * V));
}

TEST(Forward, BatchedDecodeEqualsSingleSequenceOnCpu) { batched_matches_single(kCpu); }
TEST(Forward, BatchedDecodeEqualsSingleSequenceOnCuda) {
  if (!have_cuda()) GTEST_SKIP() << "no CUDA device: the CUDA forward pass is checked on the GPU machine";
  batched_matches_single(DLDevice{kDLCUDA, 0});
}

TEST(Forward, GenerateBatchesPromptsThatStopAtDifferentLengths) {
  // generate() drops finished sequences from the decode batch; each prompt's tokens equal its
  // generation alone.
  const std::vector<std::vector<int32_t>> prompts = {tok().encode("The sun", true, false),
                                                     tok().encode("A little bird sang", true, false)};
  model::GenerateOptions g;
  g.steps = 30;
  model::Engine both(stories(), options(kCpu, 2), runtime::ResolvedChains{});
  const auto together = model::generate(both, prompts, g);
  for (size_t s = 0; s < prompts.size(); ++s) {
    model::Engine one(stories(), options(kCpu), runtime::ResolvedChains{});
    EXPECT_EQ(model::generate(one, {prompts[s]}, g)[0].tokens, together[s].tokens) << s;
  }
}

TEST(Forward, SamplingIsSeededAndTemperatureZeroIsGreedy) {
  model::Engine e(stories(), options(kCpu), runtime::ResolvedChains{});
  model::GenerateOptions g;
  g.steps = 30;
  g.temperature = 1.0f;
  g.seed = 9;
  const auto a = model::generate(e, {{1}}, g)[0].tokens;
  const auto b = model::generate(e, {{1}}, g)[0].tokens;
  EXPECT_EQ(a, b);
  g.seed = 10;
  EXPECT_NE(model::generate(e, {{1}}, g)[0].tokens, a);
  std::mt19937_64 rng(1);
  const std::vector<float> logits = {0.f, 3.f, 3.f, -1.f};
  EXPECT_EQ(model::sample_token(logits, 0.f, rng), 1);
}

// A checkpoint directory with reference.json = {"tokens": [...], "logits": [[...] per position]}
// from a PyTorch implementation: the safetensors loader and the forward pass give those logits at
// every position (decoding token by token) and at the last one (the prompt in one prefill), to a
// relative L2 error of at most `bound`, on the CPU and on CUDA where a device exists.
void expect_reference_logits(const std::string& ckpt, double bound) {
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(ckpt + "/reference.json"));
  const model::ModelWeights w = model::load_model(ckpt);
  const std::vector<int32_t> tokens = ref["tokens"].get<std::vector<int32_t>>();
  for (DLDevice dev : {kCpu, DLDevice{kDLCUDA, 0}}) {
    if (dev.device_type == kDLCUDA && !have_cuda()) continue;
    model::Engine e(w, options(dev), runtime::ResolvedChains{});
    const int32_t id = e.add_sequence();
    std::vector<float> l;
    for (size_t t = 0; t < tokens.size(); ++t) {
      if (t == 0) e.prefill(std::vector<int32_t>{id}, {{tokens[0]}}, &l);
      else e.decode(std::vector<int32_t>{id}, std::vector<int32_t>{tokens[t]}, &l);
      const std::vector<float> want = ref["logits"][t].get<std::vector<float>>();
      EXPECT_LE(rel(l, want), bound) << ckpt << " on " << device_name(dev) << ", position " << t;
    }
    // The whole prompt in one prefill pass: the last position.
    model::Engine p(w, options(dev), runtime::ResolvedChains{});
    const int32_t pid = p.add_sequence();
    p.prefill(std::vector<int32_t>{pid}, {tokens}, &l);
    EXPECT_LE(rel(l, ref["logits"].back().get<std::vector<float>>()), bound) << ckpt << " prefill";
  }
}

// transformers' own Llama and Qwen2 on tiny random checkpoints (tests/model/hf_reference.py
// writes them where torch is installed): the safetensors loader and the forward pass give its
// logits at every position.
TEST(Forward, MatchesTransformersLogits) {
  const char* dir = std::getenv("SIEVE_HF_REFERENCE_DIR");
  if (!dir) GTEST_SKIP() << "SIEVE_HF_REFERENCE_DIR not set (tests/model/hf_reference.py DIR writes the checkpoints)";
  for (const std::string arch : {"llama", "qwen2"}) {
    EXPECT_EQ(model::load_model(std::string(dir) + "/" + arch).config.qkv_bias, arch == "qwen2");
    expect_reference_logits(std::string(dir) + "/" + arch, 1e-4);
  }
}

// A model written by the long-context trainer (bench/train/llama.py: its own Llama, saved with
// its own safetensors writer), with its torch f32 logits (bench/train/test_train.py sets
// SIEVE_TRAINED_REFERENCE_DIR). Both sides compute in f32; an error made in a reduction of n
// terms is at most gamma_n relative to the terms' magnitudes, and along the residual stream the
// errors of the reductions a value passes through add: per layer the two RMSNorms, the q/k/v and
// o projections and the FFN's gate/up (dim terms each), the score dot product (head_dim), the
// softmax sum and weighted average (the sequence), the down projection (hidden_dim); then the
// final norm and the classifier (dim each). The bound is kSafety x gamma of that total (the norms
// assumed not to amplify a relative error).
TEST(Forward, MatchesTrainedModelLogits) {
  const char* dir = std::getenv("SIEVE_TRAINED_REFERENCE_DIR");
  if (!dir) GTEST_SKIP() << "SIEVE_TRAINED_REFERENCE_DIR not set (bench/train/test_train.py sets it)";
  const model::ModelConfig c = model::load_model(dir).config;
  const nlohmann::json ref = nlohmann::json::parse(std::ifstream(std::string(dir) + "/reference.json"));
  const int64_t n = int64_t(ref["tokens"].size());
  const int64_t terms = int64_t(c.n_layers) * (5 * c.dim + c.head_dim() + 2 * n + c.hidden_dim) + 2 * c.dim;
  expect_reference_logits(dir, tolerance::kSafety * tolerance::gamma(terms, tolerance::kF32));
}

TEST(Forward, RefusesWeightsThatDoNotMatchTheConfig) {
  model::ModelWeights w = test::random_weights(test::tiny_config(), 1);
  w.layers[1].wk.pop_back();
  try {
    model::Engine e(w, options(kCpu), runtime::ResolvedChains{});
    FAIL() << "accepted a short wk";
  } catch (const sieve::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("layer 1 wk holds 511 values, the config implies 512"));
  }
}

TEST(Forward, RefusesBadCalls) {
  model::Engine e(stories(), options(kCpu, 2), runtime::ResolvedChains{});
  const int32_t a = e.add_sequence();
  std::vector<float> l;
  auto msg = [](auto f) {
    try {
      f();
    } catch (const sieve::Error& err) {
      return std::string(err.what());
    }
    return std::string();
  };
  EXPECT_THAT(msg([&] { e.prefill(std::vector<int32_t>{a}, {{1, 600}}, &l); }),
              HasSubstr("token id 600 is outside the vocabulary [0, 512)"));
  EXPECT_THAT(msg([&] { e.prefill(std::vector<int32_t>{a}, {std::vector<int32_t>(513, 1)}, &l); }),
              HasSubstr("would reach 513 tokens, more than max_seq_len 512"));
  EXPECT_THAT(msg([&] { e.decode(std::vector<int32_t>{a + 100}, std::vector<int32_t>{1}, &l); }),
              HasSubstr("no sequence"));
  e.add_sequence();
  EXPECT_THAT(msg([&] { e.add_sequence(); }), HasSubstr("max_batch is 2"));
  model::GenerateOptions g;
  g.steps = 600;
  EXPECT_THAT(msg([&] { model::Engine f(stories(), options(kCpu), runtime::ResolvedChains{}); model::generate(f, {{1}}, g); }),
              HasSubstr("exceeds the model's 512 positions"));
#if !SIEVE_WITH_CUDA
  EXPECT_THAT(msg([&] { model::Engine f(stories(), options(DLDevice{kDLCUDA, 0}), runtime::ResolvedChains{}); }),
              HasSubstr("no CUDA support"));
#endif
}

}  // namespace
