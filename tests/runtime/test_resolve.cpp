// Resolving chain specs against loaded fixture plugins and a 5-layer model geometry.
// Fixture capabilities used here: minimal (prefill+decode, cpu, f32/f16, head dims 64/128,
// page 16, CUDA graph full, select), returns_error (decode, graph static_shapes, select),
// writes_nan (prefill+decode, f32, graph none, attend).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sieve/kv/paged_store.hpp>
#include <sieve/runtime/chain_spec.hpp>

#include "runtime_test_util.hpp"

using namespace sieve::runtime;
using sieve::test::fixture;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

namespace {

sieve_geometry model() { return sieve::test::model_geometry(); }

class Resolve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    registry_ = new Registry;
    for (const char* f : {"minimal", "returns_error", "writes_nan"})
      ASSERT_TRUE(registry_->add_file(fixture(f)));
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }

  ResolvedChains ok(const std::string& text, const sieve_geometry& g = model()) {
    ChainSpec spec;
    std::string err;
    EXPECT_TRUE(parse_chain_spec(text, &spec, &err)) << err;
    ResolvedChains rc;
    std::vector<std::string> errors;
    EXPECT_TRUE(resolve_chains(spec, *registry_, g, &rc, &errors))
        << ::testing::PrintToString(errors);
    return rc;
  }
  std::vector<std::string> errors(const std::string& text, const sieve_geometry& g = model()) {
    ChainSpec spec;
    std::string err;
    EXPECT_TRUE(parse_chain_spec(text, &spec, &err)) << err;
    ResolvedChains rc;
    std::vector<std::string> errors;
    EXPECT_FALSE(resolve_chains(spec, *registry_, g, &rc, &errors)) << text;
    return errors;
  }
  std::vector<std::string> labels(const ResolvedChains& rc, int32_t layer, uint32_t phase) {
    std::vector<std::string> out;
    for (size_t i : rc.chain(layer, phase)) out.push_back(rc.instances[i].label);
    return out;
  }
  static Registry* registry_;
};
Registry* Resolve::registry_ = nullptr;

constexpr uint32_t P = SIEVE_PHASE_PREFILL, D = SIEVE_PHASE_DECODE;

TEST_F(Resolve, ChainsPerLayerAndPhase) {
  ResolvedChains rc = ok("decode:*=minimal(budget=8)>returns_error; prefill:0-1=minimal");
  ASSERT_EQ(rc.n_layers, 5);
  ASSERT_EQ(rc.instances.size(), 3u);  // no ids: one instance per rule item
  for (int l = 0; l < 5; ++l) EXPECT_THAT(labels(rc, l, D), ElementsAre("minimal", "returns_error"));
  EXPECT_THAT(labels(rc, 0, P), ElementsAre("minimal"));
  EXPECT_THAT(labels(rc, 1, P), ElementsAre("minimal"));
  EXPECT_THAT(labels(rc, 2, P), IsEmpty());  // no rule: dense core attention
  const auto& decode_minimal = rc.instances[rc.chain(0, D)[0]];
  EXPECT_EQ(decode_minimal.values[0].i, 8);  // budget
  EXPECT_EQ(decode_minimal.phases, D);
  EXPECT_THAT(decode_minimal.layers, ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(rc.instances[rc.chain(0, P)[0]].values[0].i, 64);  // default
  EXPECT_NE(rc.chain(0, D)[0], rc.chain(0, P)[0]);
}

TEST_F(Resolve, SharedIdServesEveryLayerItIsNamedFor) {
  ResolvedChains rc = ok("decode:0-2=minimal@m; decode:3-=returns_error>minimal@m(budget=4); prefill:1=minimal@m");
  ASSERT_EQ(rc.instances.size(), 2u);
  const size_t m = rc.chain(0, D)[0];
  EXPECT_EQ(rc.chain(4, D)[1], m);
  EXPECT_EQ(rc.chain(1, P)[0], m);
  EXPECT_EQ(rc.instances[m].label, "minimal@m");
  EXPECT_EQ(rc.instances[m].values[0].i, 4);
  EXPECT_EQ(rc.instances[m].phases, P | D);
  EXPECT_THAT(rc.instances[m].layers, ElementsAre(0, 1, 2, 3, 4));
}

TEST_F(Resolve, LaterRulesOverrideAndUnusedInstancesAreDropped) {
  ResolvedChains rc = ok("decode:*=minimal; decode:2=returns_error; decode:0=minimal@gone; decode:0=minimal");
  EXPECT_THAT(labels(rc, 2, D), ElementsAre("returns_error"));
  EXPECT_THAT(labels(rc, 1, D), ElementsAre("minimal"));
  EXPECT_THAT(labels(rc, 0, D), ElementsAre("minimal"));
  EXPECT_NE(rc.chain(0, D)[0], rc.chain(1, D)[0]);  // rule 4's own instance
  for (const auto& inst : rc.instances) EXPECT_NE(inst.label, "minimal@gone");
  EXPECT_EQ(rc.instances.size(), 3u);
}

TEST_F(Resolve, GraphLevelIsTheMinimumOverTheChain) {
  ResolvedChains rc = ok("decode:0=minimal; decode:1=minimal>returns_error; decode:2=returns_error>writes_nan");
  EXPECT_EQ(rc.cuda_graph_level(0, D), uint32_t(SIEVE_CUDA_GRAPH_FULL));
  EXPECT_EQ(rc.cuda_graph_level(1, D), uint32_t(SIEVE_CUDA_GRAPH_STATIC_SHAPES));
  EXPECT_EQ(rc.cuda_graph_level(2, D), uint32_t(SIEVE_CUDA_GRAPH_NONE));
  EXPECT_EQ(rc.cuda_graph_level(3, D), uint32_t(SIEVE_CUDA_GRAPH_FULL));  // empty chain
  EXPECT_EQ(rc.cuda_graph_level(2, P), uint32_t(SIEVE_CUDA_GRAPH_FULL));
}

TEST_F(Resolve, UnknownPolicyListsTheAvailableOnes) {
  EXPECT_THAT(errors("decode:*=minmal"),
              ElementsAre("chain spec, col 10: unknown policy 'minmal' (did you mean 'minimal'?); "
                          "available: minimal, returns_error, writes_nan"));
  EXPECT_THAT(errors("decode:*=quest"),
              ElementsAre("chain spec, col 10: unknown policy 'quest'; available: minimal, "
                          "returns_error, writes_nan"));
}

TEST_F(Resolve, LayerTheModelDoesNotHave) {
  EXPECT_THAT(errors("decode:7=minimal"),
              ElementsAre("chain spec, col 8: layer 7 does not exist: the model has 5 layers (0-4)"));
  EXPECT_THAT(errors("decode:0,3-9=minimal"),
              ElementsAre("chain spec, col 10: layer 9 does not exist: the model has 5 layers (0-4)"));
  EXPECT_THAT(errors("decode:5-=minimal"),
              ElementsAre("chain spec, col 8: layer 5 does not exist: the model has 5 layers (0-4)"));
}

TEST_F(Resolve, PhaseThePolicyDoesNotRun) {
  EXPECT_THAT(errors("prefill:*=returns_error"),
              ElementsAre("chain spec, col 11: policy 'returns_error' runs in decode only, the "
                          "rule asks for prefill (write 'decode:' before the layers)"));
  EXPECT_THAT(errors("*=minimal>returns_error"),
              ElementsAre("chain spec, col 11: policy 'returns_error' runs in decode only, the "
                          "rule asks for prefill,decode (write 'decode:' before the layers)"));
}

TEST_F(Resolve, AtMostOneAttendPerChain) {
  EXPECT_THAT(errors("*=writes_nan>writes_nan"),
              ElementsAre("layers 0-4 (prefill): more than one policy implements attend "
                          "(writes_nan, writes_nan); a chain may replace the core kernel only once",
                          "layers 0-4 (decode): more than one policy implements attend "
                          "(writes_nan, writes_nan); a chain may replace the core kernel only once"));
  // Different layers, one attend each: fine.
  ok("decode:0-1=writes_nan; decode:2-=minimal>writes_nan");
  EXPECT_THAT(errors("decode:0-1,3=writes_nan@a>minimal>writes_nan@b"),
              ElementsAre(HasSubstr("layers 0-1,3 (decode): more than one policy implements attend "
                                    "(writes_nan@a, writes_nan@b)")));
}

TEST_F(Resolve, InstanceTwiceInOneChain) {
  EXPECT_THAT(errors("decode:*=minimal@a>minimal@a"),
              ElementsAre("chain spec, col 1: instance minimal@a appears twice in one chain"));
}

TEST_F(Resolve, ParametersAreValidatedAgainstTheSchema) {
  EXPECT_THAT(errors("decode:*=minimal(budget=0, mode=middle, bugdet=3)"),
              ElementsAre("minimal: unknown parameter 'bugdet' (did you mean 'budget'?)",
                          "minimal: budget=0 is out of range [1, 4096]",
                          "minimal: mode='middle' is not one of first|last|both"));
}

TEST_F(Resolve, DeclaredCapabilitiesAgainstTheGeometry) {
  sieve_geometry g = model();
  g.head_dim = g.rope_dim = 96;
  EXPECT_THAT(errors("decode:*=minimal", g),
              ElementsAre("minimal: supports head dims 64,128, the model's is 96"));
  g = model();
  g.device = {kDLCUDA, 0};
  g.kv_dtype = {kDLBfloat, 16, 1};
  g.page_size = 32;
  std::vector<std::string> want = {"minimal: runs on cpu, the model runs on cuda",
                                   "minimal: supports KV dtypes f32,f16, the model's is bf16",
                                   "minimal: supports page sizes 16, the model's is 32"};
  // A build without CUDA (the sanitizer build) has a CPU-only "paged" store: it says so too.
  if (!sieve::kv::paged_cuda_store_api()) want.push_back("KV store 'paged' runs on cpu, not cuda");
  EXPECT_EQ(errors("decode:*=minimal", g), want);
}

TEST_F(Resolve, ValidateReasonsArePrefixedWithTheInstance) {
  sieve_geometry g = model();
  g.n_kv_heads = 3;
  EXPECT_THAT(errors("decode:*=minimal@m", g),
              ElementsAre("minimal@m: minimal: 8 query heads cannot be grouped over 3 KV heads"));
}

TEST_F(Resolve, BadGeometry) {
  sieve_geometry g = model();
  g.n_layers = 0;
  EXPECT_THAT(errors("decode:*=minimal", g), ElementsAre("model geometry: n_layers is 0"));
}

TEST(ResolveLifetime, ChainsKeepTheirPluginsLoaded) {
  ResolvedChains rc;
  {
    Registry r;
    ASSERT_TRUE(r.add_file(fixture("minimal")));
    ChainSpec spec;
    std::string err;
    ASSERT_TRUE(parse_chain_spec("decode:*=minimal", &spec, &err));
    std::vector<std::string> errors;
    ASSERT_TRUE(resolve_chains(spec, r, model(), &rc, &errors));
  }
  const auto& inst = rc.instances.at(0);
  sieve_geometry g = model();
  sieve_reason_sink none{nullptr, nullptr};
  EXPECT_EQ(inst.api().validate(&g, inst.values.data(), inst.values.size(), none), SIEVE_OK);
  EXPECT_STREQ(inst.descriptor().name, "minimal");
}

}  // namespace
