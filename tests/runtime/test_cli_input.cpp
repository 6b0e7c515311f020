// Hostile command lines (issue 17 item 4): every one must end with exactly one line on stderr that
// names the problem, a non-zero exit status and no signal — never an abort, a SIGFPE, a
// std::bad_alloc or a silently ignored word.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>

#include "../plugins/support/run_command.hpp"
#include "runtime_test_util.hpp"

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

namespace {

const std::string kSieve = std::string(SIEVE_BIN_DIR) + "/sieve";

// The command's stderr alone (stdout discarded) and its status (128 + N when killed by signal N).
sieve::testing::CommandResult sieve_stderr(const std::string& args) {
  return sieve::testing::run_command("'" + kSieve + "' " + args + " 2>&1 >/dev/null");
}

class CliInput : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kSieve)) GTEST_SKIP() << "the sieve executable was not built";
  }
  // Exit status `status`, one stderr line, and that line matches `m`.
  template <class M>
  void expect_refused(const std::string& args, int status, M m) {
    const auto r = sieve_stderr(args);
    EXPECT_EQ(r.status, status) << args << "\n" << r.out;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << args << "\n" << r.out;
    EXPECT_EQ(r.out.back(), '\n') << args;
    EXPECT_THAT(r.out, m) << args;
  }
  sieve::test::EnvGuard no_env_{"SIEVE_PLUGIN_PATH", std::nullopt};
};

TEST_F(CliInput, DeviceIndexPastInt32IsRefusedNotAborted) {
  for (const char* cmd : {"run", "eval --chain dense", "attn"})
    expect_refused(std::string(cmd) + " --device cuda:99999999999", 2,
                   AllOf(HasSubstr("--device must be cpu or cuda[:N] (N a device index in [0, 2147483647])"), HasSubstr("got 'cuda:99999999999'")));
  expect_refused("run --device cuda:-1", 2, HasSubstr("got 'cuda:-1'"));
  expect_refused("run --device cuda:", 2, HasSubstr("got 'cuda:'"));
}

TEST_F(CliInput, PrefillWithoutNewTokensIsRefusedNotSigfpe) {
  expect_refused("attn --phase prefill --new-tokens 0 --chain 'streaming(sink=4,window=64)' --context 64 "
                 "--q-heads 4 --kv-heads 2 --head-dim 16",
                 2, HasSubstr("sieve attn: --new-tokens must be in [1, 16777216], got 0"));
}

TEST_F(CliInput, AttnGeometryOutsideItsLimitsIsNamed) {
  expect_refused("attn --context 1000000000", 2, AllOf(HasSubstr("--context"), HasSubstr("16777216 = 2^24")));
  expect_refused("attn --context 12,x --batch 2", 2, HasSubstr("got '12,x'"));
  expect_refused("attn --context 64,64,64 --batch 2", 2, HasSubstr("got 3 lengths"));
  expect_refused("attn --head-dim 1000000000", 2, HasSubstr("--head-dim must be in [1, 1024], got 1000000000"));
  expect_refused("attn --q-heads 0", 2, HasSubstr("--q-heads must be in [1, 1024], got 0"));
  expect_refused("attn --q-heads 6 --kv-heads 4", 2, HasSubstr("--q-heads 6 must be a multiple of --kv-heads 4"));
  expect_refused("attn --batch 0", 2, HasSubstr("--batch must be in [1, 4096], got 0"));
  expect_refused("attn --page-size 0", 2, HasSubstr("--page-size must be 16, 32 or 64, got 0"));
  expect_refused("attn --reps 0", 2, HasSubstr("--reps must be in [1, 1000], got 0"));
  // Each option within its limit, the total not: named before anything is allocated.
  expect_refused("attn --context 16777216 --kv-heads 8 --q-heads 8 --head-dim 128", 2,
                 AllOf(HasSubstr("the KV cache"), HasSubstr("limit of 2^29")));
  expect_refused("attn --phase prefill --context 65536 --new-tokens 65536 --q-heads 8 --kv-heads 1 --head-dim 8", 2,
                 AllOf(HasSubstr("the f64 reference"), HasSubstr("limit of 2^28"), HasSubstr("--new-tokens")));
}

TEST_F(CliInput, StrayWordsAreRefused) {
  expect_refused("run --prompt Lily saw a cat", 2,
                 AllOf(HasSubstr("sieve run: unexpected argument 'saw'"), HasSubstr("quote")));
  expect_refused("eval --chain dense extra", 2, HasSubstr("unexpected argument 'extra'"));
  expect_refused("attn stray", 2, HasSubstr("unexpected argument 'stray'"));
  expect_refused("plugins quest stray", 2, HasSubstr("unexpected argument 'stray'"));  // NAME, then a stray word
}

TEST_F(CliInput, NonFiniteOrNegativeTemperatureIsRefused) {
  expect_refused("run --temperature nan", 2, HasSubstr("sieve run: --temperature must be a finite number"));
  expect_refused("run --temperature inf", 2, HasSubstr("--temperature must be a finite number"));
  expect_refused("run --temperature=-1", 2, HasSubstr("--temperature must be >= 0, got -1"));
  expect_refused("calibrate dpxa --target nan", 2, HasSubstr("--target must be a finite number"));
}

TEST_F(CliInput, MissingLayerIsTheOnlyLine) {
  // The embedded stories260K has 5 layers; before, an info line about the unused instance came first.
  expect_refused("run --chain '7=dense'", 1,
                 AllOf(HasSubstr("layer 7 does not exist: the model has 5 layers (0-4)"), Not(HasSubstr("info"))));
}

TEST_F(CliInput, ControlCharactersAreEscaped) {
  // printf makes the bytes (popen's shell may be dash, without $'...').
  expect_refused("run --device \"$(printf 'cu\\nda\\033[31m')\"", 2, HasSubstr("got 'cu\\nda\\x1B[31m'"));
  expect_refused("attn --chain \"$(printf 'stream\\033ing')\"", 1, HasSubstr("found '\\x1B'"));
  expect_refused("attn --chain \"$(printf 'streaming(window=\\007)')\"", 1, HasSubstr("window='\\x07'"));
  expect_refused("run --prompt a \"$(printf '\\033]0;title\\007')\"", 2,
                 HasSubstr("unexpected argument '\\x1B]0;title\\x07'"));
  expect_refused("\"nosuch$(printf '\\033')\"", 2, HasSubstr("unknown command 'nosuch\\x1B'"));
}

TEST_F(CliInput, FilesThatAreNoFilesAreRefusedNotRead) {
  // /dev/zero would be read forever; a directory read as an empty file.
  expect_refused("attn --chain-file /dev/zero", 1, HasSubstr("chain file '/dev/zero': is a device, not a regular file"));
  expect_refused("attn --chain-file /", 1, HasSubstr("chain file '/': is a directory, not a file"));
  expect_refused("eval --chain dense --prompts /dev/zero", 1,
                 HasSubstr("prompts file '/dev/zero': is a device, not a regular file"));
}

TEST_F(CliInput, MultiLineResolutionErrorsAreOneLine) {
  // Two problems (an unknown policy, a missing layer): one line, joined with "; ".
  expect_refused("run --chain '*=nosuch; 9=dense'", 1,
                 AllOf(HasSubstr("unknown policy 'nosuch'"), HasSubstr("; "), HasSubstr("layer 9 does not exist")));
}

// Every command that makes a session takes --kv-store (issue 18): the plugin tools included. A
// misspelt store is named by each; a store whose pages the host owns (engine_pool) is refused when
// the session is made, naming it, by every command that binds no pages of its own, instead of
// failing at its first layer call.
TEST_F(CliInput, EveryCommandThatMakesASessionTakesKvStore) {
  for (const std::string cmd : {"run --steps 2", "eval --chain dense", "calibrate dpxa", "calibrate delta --steps 2",
                                "tool delta_correction diag --synthetic 256", "tool seer distill-gate --out /nonexistent/g.safetensors",
                                "attn --context 256"})
    expect_refused(cmd + " --kv-store pagd", 1, HasSubstr("unknown KV store 'pagd' (did you mean 'paged'?)"));
  for (const std::string cmd : {"run --steps 2", "eval --chain dense", "calibrate dpxa", "calibrate delta --steps 2",
                                "tool delta_correction diag --synthetic 256",
                                "tool seer distill-gate --out /nonexistent/g.safetensors", "attn --context 256"})
    expect_refused(cmd + " --kv-store engine_pool", 1,
                   HasSubstr("KV store 'engine_pool' runs over pages the host owns and binds per call "
                             "(ENGINE_PAGES); this host binds none"));
  // Where a mode runs no model there is no store to choose.
  expect_refused("calibrate dpxa --synthetic --kv-store paged", 2,
                 HasSubstr("--kv-store: --synthetic runs no model, so no KV store"));
  expect_refused("tool seer distill-gate --random --out /nonexistent/g.safetensors --kv-store paged", 2,
                 HasSubstr("--kv-store: --random runs no model, so no KV store"));
}

}  // namespace
