// Every error or refusal message the docs quote, produced by the code that emits it: the quoted
// text must be in the doc AND in the message the code really produces, so the two cannot drift
// apart again (docs/abi.md once showed a loader message the loader no longer wrote). In a quote,
// "..." stands for the rest of the message and a lone N for a number.
//
// A new quote of that kind in docs/*.md (an indented line naming a plugin file, an inline
// `plugin '...` / `chain spec, col ...` / `FILE:LINE, col ...` message) must get a row here:
// DocumentedMessages.EveryQuotedMessageHasARow fails until it does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <set>
#include <sstream>

#include <sieve/runtime/chain_spec.hpp>
#include <sieve/runtime/conformance.hpp>
#include <sieve/runtime/loader.hpp>
#include <sieve/runtime/registry.hpp>
#include <sieve/workload/synthetic.hpp>

#include "../plugins/support/run_command.hpp"
#include "runtime_test_util.hpp"

namespace {

using namespace sieve::runtime;
using sieve::test::fixture;

// The doc's text with every run of white space made one space (quotes wrap across lines).
std::string read_doc(const std::string& rel) {
  std::ifstream in(std::string(SIEVE_SOURCE_DIR) + "/" + rel);
  std::stringstream s;
  s << in.rdbuf();
  return std::regex_replace(s.str(), std::regex(R"(\s+)"), " ");
}

// The quote split at its placeholders ("..." and a lone N): the pieces the message must contain,
// in this order.
std::vector<std::string> fixed_parts(const std::string& quote) {
  static const std::regex placeholder(R"(\.\.\.|\bN\b)");
  std::vector<std::string> parts;
  for (std::sregex_token_iterator it(quote.begin(), quote.end(), placeholder, -1), end; it != end; ++it)
    if (it->length() > 0) parts.push_back(*it);
  return parts;
}

std::string check_error(const ConformReport& r, const std::string& name) {
  const ConformCheck* c = r.find(name);
  return c ? c->detail : "(no check " + name + ")";
}

// ---- the producers -------------------------------------------------------------------------------

std::string loader_wrong_major() {
  LoadedPlugin p;
  std::string error;
  EXPECT_FALSE(load_plugin(fixture("wrong_major"), &p, &error));
  return error;
}

std::string runner_bad_page_id() {
  Registry registry;
  EXPECT_TRUE(registry.add_file(fixture("bad_page_id")));
  ChainSpec chain;
  std::string error;
  EXPECT_TRUE(parse_chain_argument("decode:*=bad_page_id", &chain, &error)) << error;
  SyntheticSpec spec;
  spec.n_q_heads = 4;
  spec.n_kv_heads = 2;
  spec.head_dim = 8;
  spec.context = {64};
  spec.timing_reps = 0;
  SyntheticReport report;
  EXPECT_FALSE(run_synthetic(spec, chain, registry, &report, &error));
  return error;
}

std::string resolve_error(const std::string& text) {
  Registry registry;
  EXPECT_TRUE(registry.add_directory(SIEVE_FIXTURE_DIR));
  ChainSpec chain;
  std::string error;
  if (!parse_chain_spec(text, &chain, &error)) return error;
  ResolvedChains resolved;
  std::vector<std::string> errors;
  EXPECT_FALSE(resolve_chains(chain, registry, sieve::test::model_geometry(), &resolved, &errors));
  std::string all;
  for (const auto& e : errors) all += e + "\n";
  return all;
}

std::string chain_spec_error(const std::string& text) {
  ChainSpec chain;
  std::string error;
  EXPECT_FALSE(parse_chain_spec(text, &chain, &error));
  return error;
}

std::string chain_file_error(const std::string& text, const std::string& source) {
  ChainSpec chain;
  std::string error;
  EXPECT_FALSE(parse_chain_file(text, source, &chain, &error));
  return error;
}

std::string sieve_plugins_listing() {
  if (!std::filesystem::exists(std::string(SIEVE_BIN_DIR) + "/sieve")) return "(the sieve executable was not built)";
  sieve::test::EnvGuard no_env("SIEVE_PLUGIN_PATH", std::nullopt);
  return sieve::testing::run_command("'" SIEVE_BIN_DIR "/sieve' plugins --plugin-dir " SIEVE_FIXTURE_DIR " 2>&1").out;
}

ConformReport conform_isolated(const std::string& path) {
  ConformOptions o;
  o.timeout_s = 2;  // the hanging fixture is killed after this
  return conform_static(path, o);
}

struct Documented {
  const char* doc;
  std::string quote;  // in `doc` (white space runs as one space)
  std::function<std::string()> produce;
};

const std::vector<Documented>& documented() {
  static const std::vector<Documented> rows = {
      {"docs/abi.md",
       "libsieve_wrong_major.so: ABI major 2 (plugin) vs 1 (host): the plugin cannot serve this host "
       "(sieve_plugin_entry returned SIEVE_ERR_VERSION)",
       loader_wrong_major},
      {"docs/abi.md",
       "plugin 'bad_page_id' (instance bad_page_id), layer 0, hook select: selection row 0 (sequence 0, query block 0, head 0): "
       "key block 1048576 at selection.indices[0] is outside [0, 4) ...",
       runner_bad_page_id},
      {"docs/abi.md", "not loaded:", sieve_plugins_listing},
      {"docs/abi.md", "unknown policy", [] { return resolve_error("decode:*=nosuch"); }},
      {"docs/chains.md", "chain spec, col 11: policy names are [a-z0-9_]+, found 'U'",
       [] { return chain_spec_error("decode:*=qUest"); }},
      {"docs/chains.md", "chains.txt:3, col 12: expected '=' after layers, found 'q'",
       [] { return chain_file_error("decode:*=quest\n\n  decode:1 quest\n", "chains.txt"); }},
      {"docs/chains.md", "chain spec, col 10: unknown policy 'minmal' (did you mean 'minimal'?)",
       [] { return resolve_error("decode:*=minmal"); }},
      {"docs/conformance.md", "plugin crashed (Segmentation fault, signal 11)",
       [] { return check_error(conform_isolated(fixture("crash_validate")), "validate_rejects_head_dim_0"); }},
      {"docs/conformance.md", "timed out after N s",
       [] {
         return check_error(conform_isolated(sieve::test::fixture_variant("hang_validate")),
                            "validate_rejects_head_dim_0");
       }},
      {"docs/conformance.md", "ELF shared object for this machine",
       [] { return check_error(conform_isolated(fixture("minimal")), "file"); }},
  };
  return rows;
}

TEST(DocumentedMessages, TheDocsQuoteWhatTheCodeSays) {
  for (const Documented& d : documented()) {
    SCOPED_TRACE(std::string(d.doc) + ": " + d.quote);
    EXPECT_NE(read_doc(d.doc).find(d.quote), std::string::npos) << "the doc no longer quotes this";
    const std::string message = d.produce();
    size_t at = 0;
    for (const std::string& part : fixed_parts(d.quote)) {
      const size_t found = message.find(part, at);
      EXPECT_NE(found, std::string::npos) << "'" << part << "' is not in the message the code produces:\n" << message;
      if (found == std::string::npos) break;
      at = found + part.size();
    }
  }
}

// Quotes of the shapes the runtime's messages have, anywhere in docs/ (not the generated results).
std::set<std::string> message_like_quotes() {
  static const std::regex indented_plugin_line(R"(^    (libsieve_\S+\.so: .*)$)");
  static const std::regex inline_message(R"(`((plugin '|chain spec, col |[\w.-]+\.txt:\d+, col )[^`]*)`)");
  std::set<std::string> out;
  for (const auto& dir : {std::string(SIEVE_SOURCE_DIR) + "/docs", std::string(SIEVE_SOURCE_DIR) + "/docs/methods"})
    for (const auto& e : std::filesystem::directory_iterator(dir)) {
      if (e.path().extension() != ".md") continue;
      std::ifstream in(e.path());
      for (std::string line; std::getline(in, line);) {
        std::smatch m;
        if (std::regex_match(line, m, indented_plugin_line)) out.insert(m[1]);
        for (std::sregex_iterator it(line.begin(), line.end(), inline_message), end; it != end; ++it)
          out.insert((*it)[1]);
      }
    }
  return out;
}

TEST(DocumentedMessages, EveryQuotedMessageHasARow) {
  std::set<std::string> covered;
  for (const Documented& d : documented()) covered.insert(d.quote);
  for (const std::string& q : message_like_quotes())
    EXPECT_TRUE(covered.count(q)) << "docs quote a message this test does not produce: " << q;
}

TEST(DocumentedMessages, PlaceholdersSplitTheQuote) {
  EXPECT_THAT(fixed_parts("timed out after N s"), ::testing::ElementsAre("timed out after ", " s"));
  EXPECT_THAT(fixed_parts("row 0: key block 7 ..."), ::testing::ElementsAre("row 0: key block 7 "));
  EXPECT_THAT(fixed_parts("No placeholder"), ::testing::ElementsAre("No placeholder"));
}

}  // namespace
