// Chain-spec parsing: the compact and file forms, instances shared by @id, and the exact
// error lines (with positions) for malformed specs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <fstream>
#include <sieve/runtime/chain_spec.hpp>

#include "runtime_test_util.hpp"

using namespace sieve::runtime;
using ::testing::ElementsAre;
using ::testing::Pair;

namespace {

constexpr uint32_t kBoth = SIEVE_PHASE_PREFILL | SIEVE_PHASE_DECODE;

ChainSpec parse_ok(const std::string& text) {
  ChainSpec spec;
  std::string err;
  EXPECT_TRUE(parse_chain_spec(text, &spec, &err)) << err;
  return spec;
}

std::string parse_error(const std::string& text) {
  ChainSpec spec;
  std::string err;
  EXPECT_FALSE(parse_chain_spec(text, &spec, &err)) << text;
  EXPECT_EQ(err.find('\n'), std::string::npos);
  return err;
}

TEST(ChainSpec, RulesPhasesLayersAndChains) {
  ChainSpec s = parse_ok("decode:0-1=dense; decode:2-=delta@d(delta_layers=[2,14,22])>raas(budget=1024)");
  ASSERT_EQ(s.rules.size(), 2u);
  ASSERT_EQ(s.instances.size(), 3u);
  EXPECT_EQ(s.rules[0].phases, uint32_t(SIEVE_PHASE_DECODE));
  EXPECT_FALSE(s.rules[0].all_layers);
  ASSERT_EQ(s.rules[0].layers.size(), 1u);
  EXPECT_EQ(s.rules[0].layers[0].first, 0);
  EXPECT_EQ(s.rules[0].layers[0].last, 1);
  EXPECT_EQ(s.rules[1].layers[0].first, 2);
  EXPECT_EQ(s.rules[1].layers[0].last, -1);  // to the last layer
  EXPECT_THAT(s.rules[1].chain, ElementsAre(1u, 2u));
  EXPECT_EQ(s.instances[1].plugin, "delta");
  EXPECT_EQ(s.instances[1].id, "d");
  EXPECT_EQ(s.instances[1].label(), "delta@d");
  EXPECT_THAT(s.instances[1].params, ElementsAre(Pair("delta_layers", "[2,14,22]")));
  EXPECT_THAT(s.instances[2].params, ElementsAre(Pair("budget", "1024")));
  EXPECT_TRUE(s.instances[2].params_given);
  EXPECT_FALSE(s.instances[0].params_given);
}

TEST(ChainSpec, OmittedPhaseIsBothAndStarIsEveryLayer) {
  ChainSpec s = parse_ok(" * = quest ( top_k = 4 , mode = \"a, b\" ) ");
  ASSERT_EQ(s.rules.size(), 1u);
  EXPECT_EQ(s.rules[0].phases, kBoth);
  EXPECT_TRUE(s.rules[0].all_layers);
  EXPECT_THAT(s.instances[0].params, ElementsAre(Pair("top_k", "4"), Pair("mode", "a, b")));
}

TEST(ChainSpec, LayerLists) {
  ChainSpec s = parse_ok("prefill:0,3-4,7-=a;");
  ASSERT_EQ(s.rules.size(), 1u);
  const auto& l = s.rules[0].layers;
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0].first, 0);
  EXPECT_EQ(l[0].last, 0);
  EXPECT_EQ(l[1].first, 3);
  EXPECT_EQ(l[1].last, 4);
  EXPECT_EQ(l[2].first, 7);
  EXPECT_EQ(l[2].last, -1);
}

TEST(ChainSpec, SameIdIsOneInstance) {
  ChainSpec s = parse_ok("decode:0-2=delta@d; decode:3-=quest>delta@d(recent=8); prefill:*=quest");
  ASSERT_EQ(s.instances.size(), 3u);  // delta@d once, two anonymous quests
  EXPECT_THAT(s.rules[0].chain, ElementsAre(0u));
  EXPECT_THAT(s.rules[1].chain, ElementsAre(1u, 0u));
  EXPECT_THAT(s.rules[2].chain, ElementsAre(2u));
  EXPECT_THAT(s.instances[0].params, ElementsAre(Pair("recent", "8")));
  EXPECT_EQ(s.instances[0].where, "chain spec, col 12");
}

TEST(ChainSpec, RoundTripThroughText) {
  const std::string text =
      "decode:0-1=dense; decode:2-=delta@d(delta_layers=[2,14,22],path=\"a b\")>raas(budget=1024); "
      "prefill:*=dpxa(threshold=0.9)>delta@d; 0,4=quest()";
  ChainSpec s = parse_ok(text);
  std::string once = to_string(s);
  EXPECT_EQ(once,
            "decode:0-1=dense; decode:2-=delta@d(delta_layers=[2,14,22],path=\"a b\")>raas("
            "budget=1024); prefill:*=dpxa(threshold=0.9)>delta@d; 0,4=quest");
  EXPECT_EQ(to_string(parse_ok(once)), once);
}

TEST(ChainSpec, RoundTripQuotesWhatABareValueCannotHold) {
  // Quoted values that to_string() once wrote bare: a lone '[' read back as an open list, a tab
  // ended the value. Found by tests/fuzz/fuzz_chain.cpp (its corpus keeps them).
  for (const std::string v : {"[12", "1\t2", "a]b", "", "x;y", "[1]2]"}) {
    ChainSpec s = parse_ok("*=quest(p=\"" + v + "\")");
    const std::string once = to_string(s);
    ChainSpec again = parse_ok(once);
    ASSERT_EQ(again.instances.size(), 1u) << once;
    EXPECT_THAT(again.instances[0].params, ElementsAre(Pair("p", v))) << once;
  }
  EXPECT_EQ(to_string(parse_ok("*=delta(l=[1, 2])")), "*=delta(l=[1, 2])");
}

TEST(ChainSpec, ErrorsEscapeControlCharactersAndKeepUtf8) {
  EXPECT_EQ(parse_error("*=stream\x1b[2Jing"), "chain spec, col 9: expected '>' or ';' after 'stream', found '\\x1B'");
  EXPECT_EQ(parse_error("*=stream\xce\x94"), "chain spec, col 9: expected '>' or ';' after 'stream', found '\xce\x94'");
  EXPECT_EQ(parse_error("*=stream\xff"), "chain spec, col 9: expected '>' or ';' after 'stream', found '\\xFF'");
}

TEST(ChainSpec, ErrorsNameTheColumn) {
  EXPECT_EQ(parse_error(""), "chain spec, col 1: empty chain spec");
  EXPECT_EQ(parse_error("decode:0-1 quest"),
            "chain spec, col 12: expected '=' after layers, found 'q'");
  EXPECT_EQ(parse_error("decod:*=quest"),
            "chain spec, col 1: unknown phase 'decod' (expected prefill or decode)");
  EXPECT_EQ(parse_error("quest"),
            "chain spec, col 1: expected layers ('*', N, N-M or N-) or a phase ('prefill:' or "
            "'decode:'), found 'quest'");
  EXPECT_EQ(parse_error("decode:x=quest"),
            "chain spec, col 8: expected layers ('*', N, N-M or N-), found 'x'");
  EXPECT_EQ(parse_error("decode:*="),
            "chain spec, col 10: expected a policy name ([a-z0-9_]+), found the end");
  EXPECT_EQ(parse_error("decode:*=Quest"),
            "chain spec, col 10: expected a policy name ([a-z0-9_]+), found 'Q'");
  EXPECT_EQ(parse_error("decode:*=qUest"), "chain spec, col 11: policy names are [a-z0-9_]+, found 'U'");
  EXPECT_EQ(parse_error("decode:5-3=quest"), "chain spec, col 8: empty layer range 5-3");
  EXPECT_EQ(parse_error("*=quest(top_k)"),
            "chain spec, col 14: expected '=' after parameter 'top_k', found ')'");
  EXPECT_EQ(parse_error("*=quest(top_k=1"),
            "chain spec, col 16: expected ',' or ')' in the parameters of 'quest', found the end");
  EXPECT_EQ(parse_error("*=quest(top_k=)"),
            "chain spec, col 15: expected a value for 'top_k', found ')'");
  EXPECT_EQ(parse_error("*=quest(l=[1,2)"), "chain spec, col 11: missing ']' in the list for 'l'");
  EXPECT_EQ(parse_error("*=quest(p=\"abc)"), "chain spec, col 11: unterminated string for 'p'");
  EXPECT_EQ(parse_error("*=quest quest"),
            "chain spec, col 9: expected '>' or ';' after 'quest', found 'q'");
  EXPECT_EQ(parse_error("*=quest@"),
            "chain spec, col 9: expected an instance id ([A-Za-z0-9_]+) after '@', found the end");
  EXPECT_EQ(parse_error("0=quest@q(a=1); 1=quest@q(a=2)"),
            "chain spec, col 19: parameters of quest@q are given twice (also at chain spec, col 3)");
  EXPECT_EQ(parse_error("0=quest@q; 1=raas@q"),
            "chain spec, col 14: instance @q is 'quest' at chain spec, col 3, here 'raas'");
  EXPECT_EQ(parse_error("decode:99999999999=quest"),
            "chain spec, col 8: layer number 99999999999 is too large");
}

TEST(ChainSpec, KvStoreElementNamesTheStoreOnceAndRoundTrips) {
  ChainSpec s = parse_ok("kv_store = engine_pool(layout=nhd, pool=\"a b\"); decode:*=quest");
  ASSERT_TRUE(s.kv_store.has_value());
  EXPECT_EQ(s.kv_store->plugin, "engine_pool");
  EXPECT_THAT(s.kv_store->params, ElementsAre(Pair("layout", "nhd"), Pair("pool", "a b")));
  EXPECT_EQ(s.rules.size(), 1u);
  EXPECT_EQ(s.instances.size(), 1u);  // the store is not a policy instance
  const std::string once = to_string(s);
  EXPECT_EQ(once, "kv_store=engine_pool(layout=nhd,pool=\"a b\"); decode:*=quest");
  EXPECT_EQ(to_string(parse_ok(once)), once);
  EXPECT_FALSE(parse_ok("decode:*=quest").kv_store.has_value());

  EXPECT_EQ(parse_error("kv_store=paged; kv_store=paged"),
            "chain spec, col 17: the KV store is named twice (also at chain spec, col 10)");
  EXPECT_EQ(parse_error("kv_store=paged@x"), "chain spec, col 10: a KV store takes no @id ('paged@x')");
  EXPECT_EQ(parse_error("kv_store=Paged"), "chain spec, col 10: expected a KV store name ([a-z0-9_]+), found 'P'");
  EXPECT_EQ(parse_error("kv_store=paged>quest"),
            "chain spec, col 15: expected ';' after KV store 'paged', found '>'");
}

TEST(ChainSpec, StoreArgumentAndSettingItOnce) {
  ChainInstance store;
  std::string err;
  ASSERT_TRUE(parse_store_argument(" paged(a=1) ", &store, &err)) << err;
  EXPECT_EQ(store.plugin, "paged");
  EXPECT_THAT(store.params, ElementsAre(Pair("a", "1")));
  EXPECT_FALSE(parse_store_argument("paged(a=1) x", &store, &err));
  EXPECT_EQ(err, "kv store, col 12: unexpected 'x' after KV store 'paged'");
  EXPECT_FALSE(parse_store_argument("", &store, &err));
  EXPECT_EQ(err, "kv store, col 1: expected a KV store name ([a-z0-9_]+), found the end");

  ChainSpec spec = parse_ok("kv_store=paged; *=dense");
  EXPECT_FALSE(apply_store_argument("engine_pool", &spec, &err));
  EXPECT_EQ(err, "the KV store is named twice: 'engine_pool' (kv store, col 1) and 'paged' (chain spec, col 10)");
  ChainSpec plain = parse_ok("*=dense");
  EXPECT_TRUE(apply_store_argument("", &plain, &err));  // no --kv-store: nothing named
  EXPECT_FALSE(plain.kv_store.has_value());
  ASSERT_TRUE(apply_store_argument("engine_pool(layout=hnd)", &plain, &err)) << err;
  EXPECT_EQ(to_string(plain), "kv_store=engine_pool(layout=hnd); *=dense");
}

TEST(ChainFile, AKvStoreLine) {
  ChainSpec s;
  std::string err;
  ASSERT_TRUE(parse_chain_file("# the engine's pages\nkv_store = engine_pool(layout=nhd)\ndecode:*=quest\n",
                               "chains.txt", &s, &err))
      << err;
  ASSERT_TRUE(s.kv_store.has_value());
  EXPECT_EQ(s.kv_store->where, "chains.txt:2, col 12");
  EXPECT_FALSE(parse_chain_file("kv_store=paged\nkv_store=paged\n", "chains.txt", &s, &err));
  EXPECT_EQ(err, "chains.txt:2, col 1: the KV store is named twice (also at chains.txt:1, col 10)");
}

TEST(ChainFile, DeclarationsCommentsAndRules) {
  const std::string text =
      "# DELTA shared by every decode layer from 2 on\n"
      "\n"
      "delta@d(delta_layers=[2,14,22], note=\"keep # this\")   # trailing comment\n"
      "decode:2-=delta@d>quest(page_budget=32)\n"
      "   prefill:*=dpxa ; decode:0-1=dense\n";
  ChainSpec s;
  std::string err;
  ASSERT_TRUE(parse_chain_file(text, "chains.txt", &s, &err)) << err;
  ASSERT_EQ(s.rules.size(), 3u);
  ASSERT_EQ(s.instances.size(), 4u);
  EXPECT_EQ(s.instances[0].label(), "delta@d");
  EXPECT_THAT(s.instances[0].params,
              ElementsAre(Pair("delta_layers", "[2,14,22]"), Pair("note", "keep # this")));
  EXPECT_EQ(s.instances[0].where, "chains.txt:3, col 1");
  EXPECT_THAT(s.rules[0].chain, ElementsAre(0u, 1u));
  EXPECT_EQ(s.rules[2].phases, uint32_t(SIEVE_PHASE_DECODE));
}

TEST(ChainFile, ErrorsNameLineAndColumn) {
  ChainSpec s;
  std::string err;
  EXPECT_FALSE(parse_chain_file("decode:*=quest\n\n  decode:1 quest\n", "chains.txt", &s, &err));
  EXPECT_EQ(err, "chains.txt:3, col 12: expected '=' after layers, found 'q'");
  EXPECT_FALSE(parse_chain_file("quest(top_k=3)\ndecode:*=quest\n", "c.txt", &s, &err));
  EXPECT_EQ(err, "c.txt:1, col 1: a line without '=' declares an instance and needs an id: name@id(...)");
  EXPECT_FALSE(parse_chain_file("quest@q(top_k=3) extra\n", "c.txt", &s, &err));
  EXPECT_EQ(err, "c.txt:1, col 18: unexpected 'e' after the declaration");
  EXPECT_FALSE(parse_chain_file("# nothing\nquest@q\n", "c.txt", &s, &err));
  EXPECT_EQ(err, "c.txt: no chain rules (a rule looks like 'decode:0-4=quest')");
  EXPECT_FALSE(parse_chain_file("quest@q(a=1)\ndecode:*=quest@q(a=2)\n", "c.txt", &s, &err));
  EXPECT_EQ(err, "c.txt:2, col 10: parameters of quest@q are given twice (also at c.txt:1, col 1)");
  EXPECT_FALSE(load_chain_file("/nonexistent/chains.txt", &s, &err));
  EXPECT_EQ(err, "chain file '/nonexistent/chains.txt': cannot open: No such file or directory");
}

TEST(ChainFile, RefusesWhatIsNotASmallRegularFile) {
  // Each would block (a FIFO), never end (/dev/zero) or read as empty (a directory).
  sieve::test::ScratchDir dir;
  ChainSpec s;
  std::string err;
  EXPECT_FALSE(load_chain_file(dir.str(), &s, &err));
  EXPECT_EQ(err, "chain file '" + dir.str() + "': is a directory, not a file");
  EXPECT_FALSE(load_chain_file("/dev/zero", &s, &err));
  EXPECT_EQ(err, "chain file '/dev/zero': is a device, not a regular file");
  const std::string fifo = dir.str() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_FALSE(load_chain_file(fifo, &s, &err));
  EXPECT_EQ(err, "chain file '" + fifo + "': is a FIFO (named pipe), not a regular file");
  const std::string big = dir.str() + "/big.txt";
  {
    std::ofstream f(big);
    for (int i = 0; i < 80000; ++i) f << "decode:*=quest\n";  // 1.2 MB of valid rules
  }
  EXPECT_FALSE(load_chain_file(big, &s, &err));
  EXPECT_THAT(err, ::testing::StartsWith("chain file '" + big + "': "));
  EXPECT_THAT(err, ::testing::HasSubstr("more than the 1048576"));
  const std::string empty = dir.str() + "/empty.txt";
  std::ofstream(empty).close();
  EXPECT_FALSE(load_chain_file(empty, &s, &err));
  EXPECT_EQ(err, empty + ": no chain rules (a rule looks like 'decode:0-4=quest')");
  const std::string ok = dir.str() + "/ok.txt";
  std::ofstream(ok) << "decode:*=quest\n";
  EXPECT_TRUE(load_chain_file(ok, &s, &err)) << err;
}

}  // namespace
