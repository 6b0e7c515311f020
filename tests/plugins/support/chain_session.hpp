// Chains through the runtime, for tests that run the layer runner (run_synthetic) or a model on
// the build's plugins: a registry that sees only the named plugin directories, chain parsing that
// reports its error as a test failure, and a small synthetic layer session. Needs sieve_runtime
// (and SIEVE_PLUGIN_DIR, as sieve_add_test defines it).
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/registry.hpp"
#include "sieve/workload/synthetic.hpp"

namespace sieve::testing {

// The plugins of `dirs` only (by default the build's plugin directory): no SIEVE_PLUGIN_PATH, no
// directory beside the executable, no install directory, so an installed or stale plugin never
// answers instead of the one under test.
inline runtime::Registry registry_with(const std::vector<std::string>& dirs = {SIEVE_PLUGIN_DIR}) {
  runtime::DiscoveryOptions o;
  o.plugin_dirs = dirs;
  o.use_env = false;
  o.use_exe_dir = false;
  o.use_install_dir = false;
  return runtime::Registry::discover(o);
}

// `text` as a chain spec; a parse error is a test failure naming it.
inline runtime::ChainSpec parse_chain(const std::string& text) {
  runtime::ChainSpec c;
  std::string error;
  EXPECT_TRUE(runtime::parse_chain_spec(text, &c, &error)) << error;
  return c;
}

// One synthetic layer session of chain `text` on `spec`; a failure to run is a test failure
// naming the chain.
inline runtime::SyntheticReport run_chain(const runtime::SyntheticSpec& spec, const std::string& text,
                                          const runtime::Registry& registry) {
  const runtime::ChainSpec c = parse_chain(text);
  runtime::SyntheticReport r;
  std::string error;
  EXPECT_TRUE(runtime::run_synthetic(spec, c, registry, &r, &error)) << text << ": " << error;
  return r;
}

// A small synthetic session for chain tests: 8 query heads over 2 KV heads, pages of 16 tokens,
// the dense kernel timed once; f32 on the CPU (the rest as SyntheticSpec's defaults).
inline runtime::SyntheticSpec small_session(uint32_t phase, int32_t head_dim, std::vector<int32_t> context,
                                            int32_t new_tokens) {
  runtime::SyntheticSpec s;
  s.phase = phase;
  s.n_q_heads = 8;
  s.n_kv_heads = 2;
  s.head_dim = head_dim;
  s.page_size = 16;
  s.context = std::move(context);
  s.new_tokens = new_tokens;
  s.timing_reps = 1;
  return s;
}

}  // namespace sieve::testing
