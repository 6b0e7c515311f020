// Issue 17 item 4: hostile model, tokenizer, config and prompt files. Each case must end in ONE
// line naming the problem and a non-zero exit, in bounded memory and time: in process (the
// sieve::Error text) and through the real `sieve` executable, whose peak RSS and exit are measured.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>

#include "error_of.hpp"
#include "model_files.hpp"
#include "sieve/model/engine.hpp"
#include "sieve/model/llama2c.hpp"
#include "sieve/model/tokenizer.hpp"
#include "sieve/util/checked.hpp"
#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"
#include "sieve/util/printable.hpp"

using ::testing::AllOf;
using ::testing::HasSubstr;
using namespace sieve;

namespace {

using test::error_of;

// ---- the executable, measured ---------------------------------------------------------------

struct Measured {
  int status = -1;       // exit code, 128 + signal
  std::string out;       // stdout + stderr
  long peak_rss_kb = 0;  // of the command and everything it ran
  double seconds = 0;
};

// Runs `sieve <args>` under `timeout` (a hang shows as status 124) and measures it with wait4,
// which reports this child's own peak RSS (not the test process's other children).
Measured sieve_measured(const std::string& args, int timeout_s = 30) {
  test::TempDir dir;
  const std::string out = dir.file("out");
  const std::string cmd = "timeout " + std::to_string(timeout_s) + " '" + std::string(SIEVE_BIN_DIR) + "/sieve' " +
                          args + " >'" + out + "' 2>&1";
  Measured m;
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int st = 0;
  struct rusage ru {};
  if (pid < 0 || ::wait4(pid, &st, 0, &ru) != pid) return m;
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  m.peak_rss_kb = ru.ru_maxrss;
  std::ifstream f(out);
  m.out.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return m;
}

// A plain run of the embedded model peaks near 230 MB (CUDA and BLAS libraries); the refusals
// below must stay well under the allocations they used to make (0.5 - 2.3 GB).
constexpr long kRssBoundKb = 600 * 1024;

class BadInputCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(std::string(SIEVE_BIN_DIR) + "/sieve"))
      GTEST_SKIP() << "the sieve executable was not built (no Boost.program_options)";
  }
  // Refused: exit 1, one line containing `what`, bounded memory and time.
  void expect_refused(const std::string& args, const std::string& what) {
    const Measured m = sieve_measured(args);
    EXPECT_EQ(m.status, 1) << args << "\n" << m.out;
    EXPECT_THAT(m.out, HasSubstr(what)) << args;
    EXPECT_EQ(std::count(m.out.begin(), m.out.end(), '\n'), 1) << args << "\n" << m.out;
    EXPECT_LT(m.peak_rss_kb, kRssBoundKb) << args;
    EXPECT_LT(m.seconds, 20.0) << args;
  }
  std::string tok_ = test::default_tokenizer_path();
  test::TempDir dir_;
};

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

// A tiny HF checkpoint with `edit` applied to its config.json.
template <class F>
std::string hf_checkpoint(const test::TempDir& dir, const std::string& name, F edit,
                          const model::ModelConfig& config = test::tiny_config()) {
  const std::string d = dir.file(name);
  test::write_hf_checkpoint(d, test::random_weights(config, 2));
  nlohmann::json c = nlohmann::json::parse(std::ifstream(d + "/config.json"));
  edit(c);
  std::ofstream(d + "/config.json") << c.dump();
  return d;
}

// ---- 1. sizes computed from a file ----------------------------------------------------------

std::vector<std::byte> wrapping_llama2c_header() {
  // Its length sum wraps int64 to exactly 1052 bytes (the file's size).
  const int32_t h[7] = {256, (1 << 30) - 342, ((1 << 24) - 1) / 3, 1, 1, 65536, (1 << 30) - 65536};
  std::vector<std::byte> b(28 + 1024);
  std::memcpy(b.data(), h, sizeof h);
  return b;
}

TEST(BadInput, Llama2cHeaderWhoseLengthWrapsIsRefused) {
  EXPECT_THAT(error_of([] { model::parse_llama2c(wrapping_llama2c_header(), "w.bin"); }),
              AllOf(HasSubstr("model 'w.bin'"), HasSubstr("overflows 64 bits")));
}

TEST_F(BadInputCli, Llama2cHeaderWhoseLengthWraps) {
  test::write_bytes(dir_.file("w.bin"), wrapping_llama2c_header());
  expect_refused("run --model " + dir_.file("w.bin") + " --tokenizer " + tok_, "overflows 64 bits");
}

// ---- 4. over-long prompts: refused before encoding; encoding is fast anyway -----------------

TEST_F(BadInputCli, LongPromptIsRefusedQuickly) {
  std::string prompt(120000, 'a');
  for (size_t i = 7; i < prompt.size(); i += 8) prompt[i] = ' ';
  expect_refused("run --prompt '" + prompt + "'", "more than the 512 the model's positions allow");
  write_text(dir_.file("prompts.txt"), "Once upon a time\n" + std::string(1 << 20, 'x') + "\n");
  expect_refused("eval --chain 'streaming(sink=4,window=16)' --plugin-dir " SIEVE_PLUGIN_DIR " --prompts " +
                     dir_.file("prompts.txt"),
                 "more than the 512 the model's positions allow");
}

// ---- 5. validate, then allocate -------------------------------------------------------------

// tok512.bin with max_token_length and the first token's length set to 2^31 - 1.
std::vector<std::byte> huge_token_tokenizer() {
  std::vector<std::byte> b = read_file(test::default_tokenizer_path(), "tokenizer", 1 << 20);
  const int32_t huge = INT32_MAX;
  std::memcpy(b.data(), &huge, 4);
  std::memcpy(b.data() + 8, &huge, 4);
  return b;
}

TEST(BadInput, TokenizerLengthsAreCheckedAgainstTheFile) {
  EXPECT_THAT(error_of([] { model::Tokenizer::parse(huge_token_tokenizer(), 512, "t.bin"); }),
              AllOf(HasSubstr("tokenizer 't.bin': truncated at token 0 (bytes")));
  std::vector<std::byte> small(6000);
  EXPECT_THAT(error_of([&] { model::Tokenizer::parse(small, 32000, "s.bin"); }),
              HasSubstr("6000 bytes cannot hold 32000 tokens"));
}

TEST_F(BadInputCli, HugeTokenLengthTakesNoMemory) {
  test::write_bytes(dir_.file("tok.bin"), huge_token_tokenizer());
  expect_refused("run --tokenizer " + dir_.file("tok.bin"), "truncated at token 0");
}

TEST_F(BadInputCli, MillionsOfLayersAreRefusedBeforeAllocation) {
  const std::string d = hf_checkpoint(dir_, "layers", [](nlohmann::json& c) { c["num_hidden_layers"] = 1 << 22; });
  expect_refused("run --model " + d + " --tokenizer " + tok_, "tensor 'model.layers.2.input_layernorm.weight' is missing");
}

TEST_F(BadInputCli, HugeMaxPositionsRunsInTheMemoryTheRunNeeds) {
  model::ModelConfig config = test::tiny_config();
  config.vocab_size = 512;  // tok512.bin's
  for (int64_t positions : {(int64_t(1) << 31) - 64, int64_t(INT32_MAX)}) {
    const std::string d = hf_checkpoint(
        dir_, "pos" + std::to_string(positions), [&](nlohmann::json& c) { c["max_position_embeddings"] = positions; },
        config);
    const Measured m = sieve_measured("run --steps 8 --ignore-eos --model " + d + " --tokenizer " + tok_);
    EXPECT_EQ(m.status, 0) << m.out;
    EXPECT_THAT(m.out, HasSubstr("generated 8 tokens"));
    EXPECT_LT(m.peak_rss_kb, kRssBoundKb) << positions;
    const Measured e = sieve_measured("eval --steps 8 --json --chain 'streaming(sink=4,window=16)' --plugin-dir "
                                      SIEVE_PLUGIN_DIR " --model " + d + " --tokenizer " + tok_);
    EXPECT_EQ(e.status, 0) << e.out;  // its random text need not be UTF-8: --json still prints
    EXPECT_LT(e.peak_rss_kb, kRssBoundKb) << positions;
  }
}

TEST(BadInput, PagePoolBeyondInt32IsRefusedByName) {
  model::ModelWeights w = test::random_weights(test::tiny_config(), 1);
  w.config.seq_len = INT32_MAX;
  model::EngineOptions o;
  o.max_batch = 16;
  EXPECT_THAT(error_of([&] { model::Engine(w, o, runtime::ResolvedChains{}); }),
              HasSubstr("KV pages per layer, more than int32 page ids can name"));
}

// ---- 6, 9. a directory or a FIFO where a file is expected -----------------------------------

TEST(BadInput, DirectoriesAndFifosAreNotFiles) {
  test::TempDir dir;
  const std::string d = dir.file("ckpt");
  test::write_hf_checkpoint(d, test::random_weights(test::tiny_config(), 3));
  std::filesystem::remove(d + "/model.safetensors");
  std::filesystem::create_directory(d + "/model.safetensors");
  EXPECT_THAT(error_of([&] { model::load_model(d); }),
              AllOf(HasSubstr(d + "/model.safetensors'"), HasSubstr("is a directory")));
  EXPECT_THAT(error_of([&] { model::Tokenizer::load(dir.path(), 512); }),
              AllOf(HasSubstr("tokenizer '" + dir.path() + "'"), HasSubstr("is a directory")));

  // A shard named by the index that is a FIFO: refused at once, not a read that blocks forever.
  std::filesystem::remove(d + "/model.safetensors");
  std::ofstream(d + "/model.safetensors.index.json") << R"({"weight_map": {"x": "shard.safetensors"}})";
  ASSERT_EQ(::mkfifo((d + "/shard.safetensors").c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { model::load_model(d); }), HasSubstr("is a FIFO (named pipe), not a regular file"));
  ASSERT_EQ(::mkfifo(dir.file("fifo.bin").c_str(), 0600), 0);
  EXPECT_THAT(error_of([&] { model::load_model(dir.file("fifo.bin")); }), HasSubstr("is a FIFO"));
}

TEST_F(BadInputCli, DirectoriesAndFifos) {
  expect_refused("run --tokenizer " + dir_.path(), "is a directory");
  ASSERT_EQ(::mkfifo(dir_.file("fifo").c_str(), 0600), 0);
  expect_refused("run --model " + dir_.file("fifo"), "is a FIFO");
  expect_refused("run --chain 'seer(weights=" + dir_.path() + ")' --plugin-dir " SIEVE_PLUGIN_DIR, "is a directory");
  expect_refused("run --chain 'prefill:*=dpxa(thresholds=" + dir_.path() + ")' --plugin-dir " SIEVE_PLUGIN_DIR,
                 "is a directory");
  expect_refused("eval --chain 'streaming(sink=4,window=16)' --plugin-dir " SIEVE_PLUGIN_DIR " --prompts " +
                     dir_.path(),
                 "is a directory");
}

// ---- 7, 8. config.json values: integral, in range, finite ------------------------------------

TEST(BadInput, ConfigValuesAreCheckedNotTruncated) {
  test::TempDir dir;
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* why;
  } cases[] = {
      {"hidden_size", 4294967360ull, "'hidden_size' = 4294967360 is outside [1, 2147483647]"},
      {"num_hidden_layers", 4294967298ull, "'num_hidden_layers' = 4294967298 is outside"},
      {"hidden_size", 64.7, "'hidden_size' must be an integer, got 64.7"},
      {"vocab_size", -40, "'vocab_size' = -40 is outside"},
      {"num_attention_heads", "4", "'num_attention_heads' must be an integer"},
      {"rms_norm_eps", 1e39, "'rms_norm_eps' = 1e+39 does not fit a 32-bit float"},
      {"rope_theta", -1e300, "'rope_theta' = -1e+300 does not fit a 32-bit float"},
  };
  int i = 0;
  for (const auto& c : cases) {
    const std::string d = hf_checkpoint(dir, "c" + std::to_string(i++), [&](nlohmann::json& j) { j[c.key] = c.value; });
    const std::string e = error_of([&] { model::load_model(d); });
    EXPECT_THAT(e, AllOf(HasSubstr(d + "/config.json"), HasSubstr(c.why))) << c.key;
    EXPECT_EQ(e.find('\n'), std::string::npos);
  }
}

// ---- 8. weights that are not numbers --------------------------------------------------------

TEST(BadInput, NonFiniteWeightsAreRefusedByTensor) {
  model::ModelWeights w = test::random_weights(test::tiny_config(), 6);
  w.layers[1].w2[17] = std::nanf("");
  EXPECT_THAT(error_of([&] { model::parse_llama2c(test::llama2c_bytes(w), "nan.bin"); }),
              HasSubstr("model 'nan.bin': tensor 'w2' of layer 1 holds a non-finite value"));
  w.layers[1].w2[17] = 0.f;
  w.rms_final[0] = INFINITY;
  test::TempDir dir;
  test::write_hf_checkpoint(dir.file("inf"), w);
  EXPECT_THAT(error_of([&] { model::load_model(dir.file("inf")); }),
              HasSubstr("tensor 'model.norm.weight' holds a non-finite value"));
}

// ---- 11. symlink loops and control characters -----------------------------------------------

TEST(BadInput, SymlinkLoopsAndControlCharactersAreNamed) {
  test::TempDir dir;
  std::filesystem::create_symlink(dir.file("b.bin"), dir.file("a.bin"));
  std::filesystem::create_symlink(dir.file("a.bin"), dir.file("b.bin"));
  EXPECT_THAT(error_of([&] { model::load_model(dir.file("a.bin")); }), HasSubstr("symlink loop"));
  std::filesystem::create_symlink(dir.file("d.safetensors"), dir.file("c.safetensors"));
  std::filesystem::create_symlink(dir.file("c.safetensors"), dir.file("d.safetensors"));
  EXPECT_THAT(error_of([&] { model::load_model(dir.file("c.safetensors")); }), HasSubstr("symlink loop"));

  const std::string e = error_of([&] { model::load_model(dir.file("x\x1b[31m\ny.bin")); });
  EXPECT_THAT(e, HasSubstr("x\\x1B[31m\\ny.bin"));
  EXPECT_EQ(e.find_first_of("\x1b\n"), std::string::npos) << e;

  const std::string d = hf_checkpoint(dir, "ctl", [](nlohmann::json& c) { c["model_type"] = "ll\x1b]0;owned\x07"; });
  const std::string t = error_of([&] { model::load_model(d); });
  EXPECT_THAT(t, HasSubstr("model_type 'll\\x1B]0;owned\\x07' is not supported"));
}

// The helper every reader above goes through (sieve/util/file_input.hpp, checked.hpp).
TEST(BadInput, FileInputReadsOnlyBoundedRegularFiles) {
  test::TempDir dir;
  write_text(dir.file("ten"), "0123456789");
  EXPECT_EQ(read_text_file(dir.file("ten"), "notes", 10), "0123456789");
  EXPECT_THAT(error_of([&] { read_text_file(dir.file("ten"), "notes", 9); }),
              HasSubstr("notes '" + dir.file("ten") + "': 10 bytes, more than the 9 bytes such a file may have"));
  const InputFile f(dir.file("ten"), "notes");
  char buf[4];
  f.read_at(6, buf, 4);
  EXPECT_EQ(std::string(buf, 4), "6789");
  EXPECT_THAT(error_of([&] { f.read_at(7, buf, 4); }), HasSubstr("4 bytes at offset 7 run past its end (10 bytes)"));
  EXPECT_THAT(error_of([&] { f.read_at(UINT64_MAX, buf, 4); }), HasSubstr("run past its end"));
  EXPECT_THAT(error_of([] { InputFile("/dev/null", "model"); }), HasSubstr("is a device, not a regular file"));
  EXPECT_THAT(error_of([] { InputFile("", "model"); }), HasSubstr("model '': cannot open"));
  try {
    InputFile(dir.file("absent"), "model");
    ADD_FAILURE() << "a missing file was opened";
  } catch (const sieve::Error& e) {
    EXPECT_EQ(e.status(), SIEVE_ERR_NOT_FOUND);
  }
  EXPECT_EQ(checked_mul(int64_t(1) << 31, int64_t(1) << 31, "x"), int64_t(1) << 62);
  EXPECT_THAT(error_of([] { checked_mul(int64_t(1) << 32, int64_t(1) << 31, "the pool"); }),
              HasSubstr("the pool overflows 64 bits"));
  EXPECT_THAT(error_of([] { checked_add(INT64_MAX, 1, "the sum"); }), HasSubstr("the sum overflows"));
}

TEST(BadInput, PrintableKeepsUtf8AndEscapesTheRest) {
  EXPECT_EQ(printable("café ☃.bin"), "café ☃.bin");
  EXPECT_EQ(printable("a\\b\t\x7f\x01"), "a\\b\\t\\x7F\\x01");  // a backslash stays: idempotent
  EXPECT_EQ(printable("\xc2\x9b" "31m"), "\\xC2\\x9B31m");  // C1 CSI
  EXPECT_EQ(printable("\xff\xc3"), "\\xFF\\xC3");            // not UTF-8
  EXPECT_EQ(printable(std::string(300, 'a'), 10), "aaaaaaaaaa... (290 more bytes)");
  EXPECT_EQ(printable(printable("x\x1b\n\\y")), printable("x\x1b\n\\y"));
}

}  // namespace
