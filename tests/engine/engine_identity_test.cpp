// Issue 18 item 6: the same chain over the core's paged store and over an engine's own pool
// holding the same K/V in shuffled page order makes the same selections, the same evictions and
// bit-identical outputs. Bit-identical is the right bar: the runner, the policies and the core
// kernel visit the pages in logical order either way; only the physical ids (and, for NHD and
// combined pools, the strides) differ, and neither changes any arithmetic. A layout the chain's
// plugins (or the core kernel) do not declare is refused before anything runs, naming them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../plugins/support/chain_session.hpp"
#include "engine/chain_identity.hpp"
#include "sieve/runtime/kv_layouts.hpp"
#include "sieve/runtime/session.hpp"
#include "sieve/util/error.hpp"

using namespace sieve;
using namespace sieve::engine_test;

namespace {

// Every policy of the issue, with the parameters `sieve conform` runs it with (small budgets so
// these contexts reach the sparse path; seer's built-in gate), and a prefill chain with
// delta_correction. RaaS evicts: over the engine pool its pages go back to the engine.
const char* kChains[] = {
    "",
    "decode:*=streaming(sink=4,window=32)",
    "*=quest(token_budget=64)",
    "decode:*=raas(token_budget=128,pin_prefill=false)",
    "decode:*=delta@d(token_budget=128,recent=16,dense_layers=[],select_layers=[0])",
    "decode:*=seer(weights=builtin:mean,block=64,token_budget=128)",
    "prefill:*=streaming(sink=4,window=64)>delta_correction",
};


void expect_same(const Record& core, const Record& pool) {
  ASSERT_EQ(core.outputs.size(), pool.outputs.size());
  for (size_t i = 0; i < core.outputs.size(); ++i) {
    EXPECT_TRUE(core.outputs[i] == pool.outputs[i]) << "call/layer " << i << ": outputs differ";
    const auto& a = core.selections[i];
    const auto& b = pool.selections[i];
    EXPECT_TRUE(a.kind == b.kind && a.heads == b.heads && a.q_block == b.q_block && a.indptr == b.indptr &&
                a.indices == b.indices)
        << "call/layer " << i << ": selections differ";
  }
  EXPECT_EQ(core.seq_lens, pool.seq_lens) << "the same pages were evicted";
  EXPECT_EQ(core.kv_bytes, pool.kv_bytes) << "bytes_in_use counts the same pages the same way";
}

void identity(DLDevice device, DLDataType dtype) {
  const runtime::Registry reg = sieve::testing::registry_with();
  Workload w;
  w.dtype = dtype;
  for (const char* text : kChains) {
    SCOPED_TRACE(std::string("chain '") + text + "'");
    runtime::ResolvedChains chains;
    std::vector<std::string> errors;
    const runtime::ChainSpec spec = *text ? sieve::testing::parse_chain(text) : runtime::ChainSpec{};
    ASSERT_TRUE(runtime::resolve_chains(spec, reg, geometry_of(w, device), &chains, &errors))
        << (errors.empty() ? "" : errors.front());
    Record core;
    std::string err;
    ASSERT_TRUE(run_chain_record(w, device, chains, StoreChoice{}, &core, &err)) << err;
    for (const LayoutCase& lc : kLayouts) {
      const std::string label = std::string("engine_pool(layout=") + lc.name + ")";
      const std::vector<std::string> refused = runtime::kv_layout_refusals(chains, lc.layout, label);
      // Every bundled plugin and the core kernel read every layout: nothing may be skipped here.
      ASSERT_TRUE(refused.empty()) << refused.front();
      for (bool writes : {true, false}) {
        SCOPED_TRACE(label + (writes ? ", engine writes" : ", store writes"));
        StoreChoice sc;
        sc.engine = true;
        sc.shape.layout = lc.layout;
        sc.shape.combined_hnd = lc.combined_hnd;
        sc.shape.seed = 3;
        sc.layout_choice = lc.choice;
        sc.engine_writes = writes;
        Record pool;
        ASSERT_TRUE(run_chain_record(w, device, chains, sc, &pool, &err)) << err;
        expect_same(core, pool);
        EXPECT_EQ(pool.bad_releases, 0) << "the store released only pages the sequence held";
        if (std::string(text).find("raas") != std::string::npos) {
          EXPECT_GT(pool.released, 0) << "RaaS evicted, and the pages went back to the engine";
        }
      }
    }
  }
}

}  // namespace

TEST(EnginePoolIdentity, EveryChainMatchesTheCoreStoreBitForBitOnCpu) { identity(kCpu, kF32); }

// Every in-tree plugin reads every layout (identity() asserts it), so the refusal is shown on
// fixtures: `hnd_only` declares kv_layouts = HND, `minimal` declares nothing (a 1.0 descriptor:
// compact HND). A strided layout is refused naming the policy, its instance, the store and the
// layout, before anything runs; HND is not refused; the session refuses the same way.
TEST(EnginePoolIdentity, LayoutRefusalsNameWhoCannotReadTheLayout) {
  const runtime::Registry reg =
      sieve::testing::registry_with({std::string(SIEVE_FIXTURE_DIR) + "/layouts", SIEVE_FIXTURE_DIR});
  ASSERT_NE(reg.find("hnd_only"), nullptr) << "the hnd_only fixture was not built";
  ASSERT_NE(reg.find("minimal"), nullptr) << "the minimal fixture was not built";
  Workload w;  // head_dim 64, page 16, f32 on the CPU: both fixtures serve it
  for (const auto& [plugin, declared] : {std::pair<std::string, std::string>{"hnd_only", ""},
                                         std::pair<std::string, std::string>{"minimal", " (none: compact hnd)"}}) {
    SCOPED_TRACE(plugin);
    runtime::ResolvedChains chains;
    std::vector<std::string> errors;
    ASSERT_TRUE(runtime::resolve_chains(sieve::testing::parse_chain("decode:*=" + plugin), reg, geometry_of(w, kCpu),
                                        &chains, &errors))
        << (errors.empty() ? "" : errors.front());
    EXPECT_TRUE(runtime::kv_layout_refusals(chains, SIEVE_KV_LAYOUT_HND, "engine_pool").empty());
    for (const auto& [bit, name] : {std::pair<uint32_t, std::string>{SIEVE_KV_LAYOUT_NHD, "nhd"},
                                    std::pair<uint32_t, std::string>{SIEVE_KV_LAYOUT_COMBINED, "combined"}}) {
      const std::vector<std::string> why = runtime::kv_layout_refusals(chains, bit, "engine_pool(layout=" + name + ")");
      // The prefill phase has no chain: the core kernel reads that layer's view, and is named
      // only for a layout it cannot read.
      const bool kernel_reads = (runtime::core_kernel_kv_layouts() & bit) != 0;
      ASSERT_EQ(why.size(), 1u + size_t(!kernel_reads));
      EXPECT_EQ(why.front(), "KV store 'engine_pool(layout=" + name + ")' hands out " + name + " pages, but plugin '" +
                                 plugin + "' (instance " + plugin +
                                 ") reads only the layouts its descriptor declares in kv_layouts" + declared +
                                 "; choose layout=hnd or a plugin that reads " + name);
    }
  }
  // The same refusal when a session is made over the store in that layout.
  runtime::ResolvedChains chains;
  std::vector<std::string> errors;
  ASSERT_TRUE(runtime::resolve_chains(sieve::testing::parse_chain("kv_store=engine_pool(layout=nhd); decode:*=hnd_only"),
                                      reg, geometry_of(w, kCpu), &chains, &errors));
  runtime::HostServices services(kCpu);
  runtime::Session::Options o;
  o.binds_pages = true;
  try {
    runtime::Session s(services, geometry_of(w, kCpu), std::move(chains), o);
    ADD_FAILURE() << "a session over nhd pages took a plugin that reads hnd only";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("KV store 'engine_pool' hands out nhd pages, but plugin 'hnd_only' "
                                               "(instance hnd_only) reads only the layouts its descriptor declares"));
    EXPECT_EQ(e.status(), SIEVE_ERR_UNSUPPORTED);
  }
}

TEST(EnginePoolIdentityCuda, EveryChainMatchesTheCoreStoreBitForBitOnCuda) {
  if (runtime::cuda_devices() == 0) GTEST_SKIP() << "no CUDA device: this test runs on the GPU machine";
  identity(DLDevice{kDLCUDA, 0}, kF32);
  identity(DLDevice{kDLCUDA, 0}, kBF16);
}
