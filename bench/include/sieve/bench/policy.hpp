// The policy-step benchmark (`sieve_bench --policy`, `sieve bench --policy`): a whole layer step
// through the real runtime (plugins loaded by discovery, chains resolved, a KV store — the core's
// paged store, or an engine-pool store over a stand-in engine's own pages —, LayerRunner: append +
// chain hooks + core attention) on a synthetic geometry, for several chains
// side by side with dense, the core kernel alone on the selection each chain produced (so the
// selection overhead shows separately), and optionally PyTorch SDPA on the same dense shape.
// docs/bench/policy.md says what each number means.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sieve::bench {

struct PolicyOptions {
  std::string phase = "decode";         // decode | prefill
  std::vector<std::string> chains;      // chain specs; a bare chain "quest(...)" means "*=quest(...)"
  int32_t layers = 1, hq = 32, hkv = 8, d = 128, page = 16;
  std::string dtype = "bf16";           // bf16 | f16 | f32 (K/V, q and out)
  std::string device;                   // cuda | cpu; empty: cuda when there is one
  std::vector<int32_t> ctx = {32768};   // tokens per sequence in the cache (decode: before the steps)
  std::vector<int32_t> batch = {1};
  int32_t new_tokens = 0;               // prefill: the last N tokens are the timed call (0: all)
  std::string keys = "random";          // random | similar[:cos] (long_context.hpp generator)
  int32_t similar_period = 16384;       // similar: tokens generated per sequence, repeated (0: all)
  std::string fill = "";                // chain whose on_append hooks see the context: decode |
                                        // prefill; empty: the timed phase
  int32_t steps = 20, warmup = 3;       // decode steps timed / untimed before
  int32_t samples = 3;                  // prefill calls timed (each on a freshly filled store)
  int32_t min_q_block = 16;             // prefill: LayerRunner::Options::min_selection_q_block
  uint64_t seed = 1;
  bool check = false;                   // LayerRunner checks on (slower: host copies in the step)
  bool sdpa = false;
  std::string sdpa_script, python = "python3";
  std::string json_out;
  std::vector<std::string> plugin_dirs;
  // NAME(k=v,...) for every chain, dense too; empty: paged. Several: every chain runs on each (the
  // first is the base the others' step times are compared with, side by side).
  std::vector<std::string> kv_stores;
  double memory_fraction = 0.9;         // of the free device (or host) memory a size may use
  std::string command;                  // recorded in the report
};

// Parses the policy benchmark's arguments (argv[first..argc), "--name value" or "--name=value";
// "--policy" itself is ignored) and runs it. `prog` names the program in messages.
// Returns the exit status: 0, 1 when a chain failed, 2 on bad arguments.
int policy_main(int argc, char** argv, int first, const char* prog);

int run_policy_bench(const PolicyOptions& options);

}  // namespace sieve::bench
