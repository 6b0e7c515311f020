// Model loading: the llama2.c checkpoint (the embedded default and written files), every
// refusal with its one line, and the second format (safetensors + config.json) producing the
// same model — same weights after the RoPE un-permutation, same generated tokens.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "error_of.hpp"
#include "model_files.hpp"
#include "sieve/model/engine.hpp"
#include "sieve/model/generate.hpp"
#include "sieve/model/llama2c.hpp"
#include "sieve/model/safetensors.hpp"
#include "sieve/util/error.hpp"

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace sieve;

namespace {

using test::error_of;

// Greedy tokens after a short prompt (random tiny models: an untied classifier, so greedy does not
// just echo the input token).
std::vector<int32_t> greedy(const model::ModelWeights& w, int32_t steps) {
  model::EngineOptions o;
  o.max_batch = 1;
  model::Engine e(w, o, runtime::ResolvedChains{});
  model::GenerateOptions g;
  g.steps = steps;
  g.stop_at_bos_eos = false;
  return model::generate(e, {{1, 7, 23, 5}}, g)[0].tokens;
}

TEST(Llama2c, LoadsTheDefaultModel) {
  const model::ModelWeights w = model::load_llama2c(test::default_model_path());
  const auto& c = w.config;
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.seq_len, 512);
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_TRUE(c.shared_classifier);
  EXPECT_TRUE(w.classifier.empty());
  ASSERT_EQ(w.layers.size(), 5u);
  EXPECT_EQ(w.layers[4].w2.size(), size_t(64 * 172));
  EXPECT_EQ(w.parameter_count(), int64_t(512 * 64 + 5 * (64 + 64 * 64 * 2 + 2 * 32 * 64 + 64 + 3 * 172 * 64) + 64));
}

TEST(Llama2c, RoundTripsWrittenWeightsTiedAndUntied) {
  for (bool tied : {true, false}) {
    const model::ModelWeights w = test::random_weights(test::tiny_config(tied), 7);
    const model::ModelWeights r = model::parse_llama2c(test::llama2c_bytes(w), "mem");
    EXPECT_EQ(r.config.shared_classifier, tied);
    EXPECT_EQ(r.token_embedding, w.token_embedding);
    EXPECT_EQ(r.classifier, w.classifier);
    EXPECT_EQ(r.rms_final, w.rms_final);
    for (size_t l = 0; l < w.layers.size(); ++l) {
      EXPECT_EQ(r.layers[l].wq, w.layers[l].wq);
      EXPECT_EQ(r.layers[l].wk, w.layers[l].wk);
      EXPECT_EQ(r.layers[l].w2, w.layers[l].w2);
      EXPECT_EQ(r.layers[l].w3, w.layers[l].w3);
    }
  }
}

TEST(Llama2c, RefusesTruncatedFiles) {
  test::TempDir dir;
  const std::vector<std::byte> good = test::llama2c_bytes(test::random_weights(test::tiny_config(), 1));
  std::vector<std::byte> cut(good.begin(), good.end() - 5);
  test::write_bytes(dir.file("cut.bin"), cut);
  EXPECT_THAT(error_of([&] { model::load_llama2c(dir.file("cut.bin")); }),
              AllOf(HasSubstr(dir.file("cut.bin")), HasSubstr("truncated llama2.c checkpoint"),
                    HasSubstr("implies " + std::to_string(good.size()) + " bytes"),
                    HasSubstr("has " + std::to_string(cut.size()))));
  std::vector<std::byte> header_only(good.begin(), good.begin() + 13);
  EXPECT_THAT(error_of([&] { model::parse_llama2c(header_only, "short.bin"); }),
              AllOf(HasSubstr("model 'short.bin'"), HasSubstr("13 bytes, the header alone is 28")));
  std::vector<std::byte> longer = good;
  longer.resize(good.size() + 8);
  EXPECT_THAT(error_of([&] { model::parse_llama2c(longer, "long.bin"); }),
              HasSubstr("has " + std::to_string(longer.size()) + " bytes but its llama2.c header implies " +
                        std::to_string(good.size())));
  EXPECT_THAT(error_of([&] { model::load_llama2c(dir.file("missing.bin")); }),
              AllOf(HasSubstr(dir.file("missing.bin")), HasSubstr("cannot open")));
}

TEST(Llama2c, RefusesImpossibleHeaders) {
  auto with_header = [](std::array<int32_t, 7> h) {
    std::vector<std::byte> b(28 + 4096);
    std::memcpy(b.data(), h.data(), 28);
    return b;
  };
  struct Case {
    std::array<int32_t, 7> h;
    const char* why;
  } cases[] = {
      {{64, 172, 5, 7, 7, 512, 512}, "dim = 64 is not a multiple of n_heads = 7"},
      {{64, 172, 5, 8, 3, 512, 512}, "n_heads = 8 is not a multiple of n_kv_heads = 3"},
      {{-64, 172, 5, 8, 4, 512, 512}, "dim = -64 must be positive"},
      {{64, 172, 0, 8, 4, 512, 512}, "n_layers = 0 must be positive"},
      {{64, 172, 5, 8, 4, 512, -1}, "seq_len = -1 must be positive"},
      {{24, 48, 1, 8, 4, 16, 16}, "head_dim = 3 is odd"},
      {{0x616b3432, 2, 0, 0, 0, 0, 0}, "version 1+ (magic \"ak42\") is not supported"},
  };
  for (const auto& c : cases) {
    const std::string e = error_of([&] { model::parse_llama2c(with_header(c.h), "bad.bin"); });
    EXPECT_THAT(e, AllOf(HasSubstr("model 'bad.bin'"), HasSubstr(c.why))) << c.why;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;  // one line
  }
  // A header whose sizes overflow 32 bits must still be measured correctly (refused, not UB).
  EXPECT_THAT(error_of([&] { model::parse_llama2c(with_header({65536, 65536, 65536, 2, 2, 65536, 2}), "huge.bin"); }),
              HasSubstr("truncated llama2.c checkpoint"));
}

TEST(Safetensors, UnpermuteInvertsTransformersPermute) {
  std::vector<float> w(16 * 3);
  for (size_t i = 0; i < w.size(); ++i) w[i] = float(i);
  EXPECT_EQ(model::unpermute_rope_rows(test::hf_permute(w, 2, 16, 3), 2, 8, 3), w);
  EXPECT_NE(test::hf_permute(w, 2, 16, 3), w);
}

TEST(Safetensors, LoadsTheSameWeightsAsLlama2c) {
  test::TempDir dir;
  for (bool tied : {true, false}) {
    const model::ModelWeights w = test::random_weights(test::tiny_config(tied), 3);
    const std::string ckpt = dir.file(tied ? "tied" : "untied");
    test::write_hf_checkpoint(ckpt, w);
    // Directory, config.json and the .safetensors file all name the same checkpoint.
    for (const std::string& path : {ckpt, ckpt + "/config.json", ckpt + "/model.safetensors"}) {
      const model::ModelWeights s = model::load_model(path);
      EXPECT_EQ(s.format, "safetensors");
      EXPECT_EQ(s.config.shared_classifier, tied);
      EXPECT_EQ(s.config.n_kv_heads, 2);
      EXPECT_EQ(s.token_embedding, w.token_embedding);
      EXPECT_EQ(s.classifier, w.classifier);
      for (size_t l = 0; l < w.layers.size(); ++l) {
        EXPECT_EQ(s.layers[l].wq, w.layers[l].wq) << path;
        EXPECT_EQ(s.layers[l].wk, w.layers[l].wk) << path;
        EXPECT_EQ(s.layers[l].w1, w.layers[l].w1);
        EXPECT_EQ(s.layers[l].w2, w.layers[l].w2);
        EXPECT_EQ(s.layers[l].w3, w.layers[l].w3);
      }
    }
  }
}

// The check: the second format generates the same tokens as llama2.c for the same weights.
TEST(Safetensors, GeneratesTheSameTokensAsLlama2c) {
  test::TempDir dir;
  for (const std::string dtype : {"F32", "F16", "BF16"}) {
    const model::ModelWeights w = test::rounded(test::random_weights(test::tiny_config(false), 11), dtype);
    test::write_bytes(dir.file(dtype + ".bin"), test::llama2c_bytes(w));
    test::write_hf_checkpoint(dir.file(dtype), w, dtype);
    const std::vector<int32_t> a = greedy(model::load_model(dir.file(dtype + ".bin")), 40);
    const std::vector<int32_t> b = greedy(model::load_model(dir.file(dtype)), 40);
    EXPECT_EQ(a, b) << dtype;
    // Not a degenerate model: greedy does not just repeat one token.
    EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), 3u) << dtype;
  }
}

TEST(Safetensors, Qwen2BiasesLoadAndRun) {
  test::TempDir dir;
  model::ModelConfig c = test::tiny_config(false);
  c.qkv_bias = true;
  const model::ModelWeights w = test::random_weights(c, 5);
  test::write_hf_checkpoint(dir.file("q"), w, "F32", "qwen2");
  const model::ModelWeights s = model::load_model(dir.file("q"));
  EXPECT_TRUE(s.config.qkv_bias);
  EXPECT_EQ(s.layers[1].bq, w.layers[1].bq);
  EXPECT_EQ(s.layers[1].bk, w.layers[1].bk);
  EXPECT_EQ(s.layers[1].bv, w.layers[1].bv);
  // The biases matter: dropping them changes the generation.
  model::ModelWeights no_bias = w;
  for (auto& l : no_bias.layers) std::fill(l.bq.begin(), l.bq.end(), 0.f), std::fill(l.bk.begin(), l.bk.end(), 0.f);
  EXPECT_EQ(greedy(s, 30), greedy(w, 30));
  EXPECT_NE(greedy(w, 30), greedy(no_bias, 30));
}

TEST(Safetensors, RefusesBadFiles) {
  test::TempDir dir;
  const model::ModelWeights w = test::random_weights(test::tiny_config(), 2);
  auto fresh = [&](const std::string& name) {
    const std::string d = dir.file(name);
    test::write_hf_checkpoint(d, w);
    return d;
  };
  auto edit_config = [](const std::string& d, auto f) {
    nlohmann::json c = nlohmann::json::parse(std::ifstream(d + "/config.json"));
    f(c);
    std::ofstream(d + "/config.json") << c.dump();
  };

  {  // truncated data
    const std::string d = fresh("trunc");
    std::filesystem::resize_file(d + "/model.safetensors", std::filesystem::file_size(d + "/model.safetensors") - 4);
    EXPECT_THAT(error_of([&] { model::load_model(d); }),
                AllOf(HasSubstr(d + "/model.safetensors"), HasSubstr("fall outside"), HasSubstr("truncated file?")));
  }
  {  // header length beyond the file
    const std::string d = fresh("hdr");
    std::filesystem::resize_file(d + "/model.safetensors", 100);
    EXPECT_THAT(error_of([&] { model::load_model(d); }), HasSubstr("truncated safetensors file: the header claims"));
  }
  {  // not JSON
    const std::string d = fresh("json");
    test::write_bytes(d + "/model.safetensors", {std::byte{4}, {}, {}, {}, {}, {}, {}, {}, std::byte{'{'},
                                                 std::byte{'x'}, std::byte{'x'}, std::byte{'x'}});
    EXPECT_THAT(error_of([&] { model::load_model(d); }), HasSubstr("safetensors header is not JSON"));
  }
  {  // shape disagrees with config.json
    const std::string d = fresh("shape");
    edit_config(d, [](nlohmann::json& c) { c["intermediate_size"] = 50; });
    EXPECT_THAT(error_of([&] { model::load_model(d); }),
                AllOf(HasSubstr("tensor 'model.layers.0.mlp.gate_proj.weight' has shape [48, 32], config.json implies "
                                "[50, 32]")));
  }
  {  // a missing tensor
    const std::string d = fresh("missing");
    auto t = test::hf_tensors(w);
    t.erase(std::remove_if(t.begin(), t.end(), [](const auto& x) { return x.name == "model.norm.weight"; }), t.end());
    test::write_safetensors_file(d + "/model.safetensors", t, "F32");
    EXPECT_THAT(error_of([&] { model::load_model(d); }), HasSubstr("tensor 'model.norm.weight' is missing"));
  }
  {  // untied without lm_head
    const std::string d = fresh("lmhead");
    edit_config(d, [](nlohmann::json& c) { c["tie_word_embeddings"] = false; });
    EXPECT_THAT(error_of([&] { model::load_model(d); }), HasSubstr("no tensor 'lm_head.weight'"));
  }
  {  // impossible and unsupported configs
    const std::string d = fresh("cfg");
    edit_config(d, [](nlohmann::json& c) { c["num_key_value_heads"] = 3; });
    EXPECT_THAT(error_of([&] { model::load_model(d); }),
                AllOf(HasSubstr(d + "/config.json"), HasSubstr("n_heads = 4 is not a multiple of n_kv_heads = 3")));
    edit_config(d, [](nlohmann::json& c) {
      c["num_key_value_heads"] = 2;
      c["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
    });
    EXPECT_THAT(error_of([&] { model::load_model(d); }), HasSubstr("rope_scaling"));
    edit_config(d, [](nlohmann::json& c) {
      c.erase("rope_scaling");
      c["model_type"] = "gpt2";
    });
    EXPECT_THAT(error_of([&] { model::load_model(d); }), HasSubstr("model_type 'gpt2' is not supported"));
    edit_config(d, [](nlohmann::json& c) {
      c["model_type"] = "llama";
      c.erase("hidden_size");
    });
    EXPECT_THAT(error_of([&] { model::load_model(d); }), HasSubstr("config.json has no 'hidden_size'"));
  }
  {  // unsupported dtype
    const std::string d = fresh("dtype");
    nlohmann::json h = {{"model.embed_tokens.weight", {{"dtype", "I8"}, {"shape", {40, 32}}, {"data_offsets", {0, 1280}}}}};
    std::string s = h.dump();
    std::vector<std::byte> b(8 + s.size() + 1280);
    b[0] = std::byte(s.size());
    std::memcpy(b.data() + 8, s.data(), s.size());
    test::write_bytes(d + "/model.safetensors", b);
    EXPECT_THAT(error_of([&] { model::load_model(d); }), HasSubstr("has dtype I8; supported: F32, F16, BF16"));
  }
  EXPECT_THAT(error_of([&] { model::load_model(dir.file("nothing")); }), HasSubstr("cannot open"));
  EXPECT_THAT(error_of([&] { model::load_model(dir.file("nothing.safetensors")); }), HasSubstr("no such file or directory"));
}

}  // namespace
