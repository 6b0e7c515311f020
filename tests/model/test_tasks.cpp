// The long-context tasks: every instance is what its layout says (the answer is what was planted
// in the context), instances depend on (task, length, seed, index) alone, grading counts what it
// should, and the task evaluation runs a model's prefill and decode through the chains (dense: the
// chain's predictions are the dense ones). That the generator matches bench/train/sieve_tasks.py
// instance for instance is checked from Python (bench/train/test_train.py, ctest train_script).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "model_files.hpp"
#include "sieve/model/model_chain.hpp"
#include "sieve/model/task_eval.hpp"
#include "sieve/model/task_instances.hpp"
#include "sieve/util/error.hpp"
#include "../plugins/support/chain_session.hpp"

using namespace sieve;
namespace tv = model::task_vocab;

namespace {

std::vector<int32_t> whole(const model::TaskInstance& i) {
  std::vector<int32_t> t = i.prompt;
  t.insert(t.end(), i.continuation.begin(), i.continuation.end());
  return t;
}

bool is_filler(int32_t t) { return t >= tv::kFiller0 && t < tv::kFiller0 + tv::kFillers; }

TEST(Tasks, PasskeyAnswerIsThePlantedKey) {
  for (int32_t length : {16, 300, 4096})
    for (uint64_t i = 0; i < 20; ++i) {
      const model::TaskInstance inst = model::make_task_instance("passkey", length, 7, i);
      const std::vector<int32_t> t = whole(inst);
      ASSERT_EQ(int32_t(t.size()), length);
      ASSERT_EQ(inst.continuation.size(), size_t(tv::kPasskeyDigits));
      EXPECT_EQ(inst.prompt.back(), tv::kQuery);
      EXPECT_EQ(std::count(inst.scored.begin(), inst.scored.end(), 1), tv::kPasskeyDigits);
      const auto key = std::find(t.begin(), t.end(), tv::kKey);
      ASSERT_NE(key, t.end());
      EXPECT_TRUE(std::equal(inst.continuation.begin(), inst.continuation.end(), key + 1));
      // Everything else in the context is filler.
      for (auto it = t.begin() + 1; it != t.end() - tv::kPasskeyDigits - 1; ++it) {
        if (it < key || it > key + tv::kPasskeyDigits) {
          EXPECT_TRUE(is_filler(*it)) << *it;
        }
      }
    }
}

TEST(Tasks, MqarValuesAreTheContextsPairs) {
  for (int32_t length : {64, 1000, 8192}) {
    const int32_t m = model::mqar_pairs(length);
    for (uint64_t i = 0; i < 10; ++i) {
      const model::TaskInstance inst = model::make_task_instance("mqar", length, 7, i);
      const std::vector<int32_t> t = whole(inst);
      ASSERT_EQ(inst.continuation.size(), size_t(2 * m - 1));
      std::map<int32_t, int32_t> pairs;
      for (int32_t p = 1; p < length - 2 * m - 1; ++p)
        if (t[size_t(p)] >= tv::kKey0 && t[size_t(p)] < tv::kKey0 + tv::kKeys) {
          EXPECT_TRUE(pairs.emplace(t[size_t(p)], t[size_t(p + 1)]).second) << "a key twice";
        }
      ASSERT_EQ(int32_t(pairs.size()), m);
      std::set<int32_t> queried;
      for (int32_t q = 0; q < m; ++q) {
        const int32_t key = t[size_t(length - 2 * m + 2 * q)], value = t[size_t(length - 2 * m + 2 * q + 1)];
        EXPECT_EQ(pairs.at(key), value);
        queried.insert(key);
        // The values are scored, the keys after the first only fed.
        const size_t at = size_t(2 * q);  // value q's index in the continuation
        EXPECT_EQ(inst.scored[at], 1);
        if (q > 0) {
          EXPECT_EQ(inst.scored[at - 1], 0);
        }
      }
      EXPECT_EQ(int32_t(queried.size()), m);
    }
  }
}

TEST(Tasks, CopyContinuesTheSpan) {
  const model::TaskInstance inst = model::make_task_instance("copy", 500, 3, 4);
  const std::vector<int32_t> t = whole(inst);
  const int32_t S = tv::kCopySpan;
  EXPECT_EQ(inst.prompt.back(), t[size_t(500 - S)]);  // the prompt ends with the span's first token
  EXPECT_EQ(inst.prompt[inst.prompt.size() - 2], tv::kCopy);
  const std::vector<int32_t> span(t.end() - S, t.end());
  EXPECT_EQ(std::set<int32_t>(span.begin(), span.end()).size(), size_t(S));
  EXPECT_NE(std::search(t.begin(), t.end() - S - 1, span.begin(), span.end()), t.end() - S - 1);
  EXPECT_EQ(std::count(inst.scored.begin(), inst.scored.end(), 1), S - 1);
}

TEST(Tasks, InstancesDependOnTaskLengthSeedAndIndex) {
  const auto a = whole(model::make_task_instance("mqar", 256, 3, 5));
  EXPECT_EQ(a, whole(model::make_task_instance("mqar", 256, 3, 5)));
  EXPECT_NE(a, whole(model::make_task_instance("mqar", 256, 4, 5)));
  EXPECT_NE(a, whole(model::make_task_instance("mqar", 256, 3, 6)));
  EXPECT_NE(whole(model::make_task_instance("passkey", 256, 3, 5)), whole(model::make_task_instance("copy", 256, 3, 5)));
}

TEST(Tasks, RefusesUnknownTasksAndShortLengths) {
  EXPECT_THROW(model::make_task_instance("sorting", 256, 1, 0), sieve::Error);
  EXPECT_THROW(model::make_task_instance("mqar", 63, 1, 0), sieve::Error);
  EXPECT_THROW(model::make_task_instance("passkey", 15, 1, 0), sieve::Error);
  EXPECT_NO_THROW(model::make_task_instance("passkey", 16, 1, 0));
}

TEST(Tasks, GradingCountsScoredTokensAndWholeInstances) {
  std::vector<model::TaskInstance> inst = {model::make_task_instance("mqar", 64, 1, 0),
                                           model::make_task_instance("mqar", 64, 1, 1)};
  std::vector<std::vector<int32_t>> pred = {inst[0].continuation, inst[1].continuation};
  model::TaskScore s = model::grade_task(inst, pred);
  EXPECT_EQ(s.graded, 2 * 8);
  EXPECT_EQ(s.accuracy(), 1.0);
  EXPECT_EQ(s.exact(), 1.0);
  pred[1][0] = tv::kPad;  // a scored position wrong
  pred[0][1] = tv::kPad;  // an unscored (fed key) position: not graded
  s = model::grade_task(inst, pred);
  EXPECT_EQ(s.right, 15);
  EXPECT_EQ(s.all_right, 1);
  EXPECT_THROW(model::grade_task(inst, {pred[0]}), sieve::Error);
}

// A random model of the tasks' vocabulary: the path runs; the dense chain predicts what dense
// attention does (the same kernel), every metric in its range.
TEST(Tasks, EvaluateRunsThePrefillAndDecodeChains) {
  model::ModelConfig c = test::tiny_config();
  c.vocab_size = tv::kSize;
  c.seq_len = 256;
  const model::ModelWeights w = test::random_weights(c, 3);
  runtime::Registry reg = sieve::testing::registry_with();
  model::EvalOptions eo;
  const model::TaskReport r =
      model::evaluate_task(w, "passkey", 200, 11, 3, model::parse_chain_argument("dense"), reg, eo);
  EXPECT_EQ(r.dense.instances, 3);
  EXPECT_EQ(r.dense.graded, 3 * tv::kPasskeyDigits);
  EXPECT_EQ(r.chain.right, r.dense.right);
  EXPECT_EQ(r.fidelity.kl_max, 0.0);
  EXPECT_FALSE(r.fidelity.free_running);
  EXPECT_EQ(r.fidelity.prefill.recall, 1.0);
  EXPECT_EQ(r.fidelity.positions, 3 * tv::kPasskeyDigits);
  const model::TaskReport s = model::evaluate_task(
      w, "mqar", 200, 11, 2, model::parse_chain_argument("decode:*=streaming(sink=4,window=16)"), reg, eo);
  EXPECT_GT(s.fidelity.decode.rows, 0);
  EXPECT_LT(s.fidelity.decode.attended, 1.0);  // a 20-key window of ~190 keys
  EXPECT_GE(s.fidelity.decode.recall, 0.0);
  EXPECT_LE(s.fidelity.decode.recall, 1.0);
  EXPECT_EQ(s.fidelity.prefill.recall, 1.0);  // the prefill chain is dense
  EXPECT_GT(s.fidelity.kv_bytes_chain, 0u);  // from the measured run (the free-running one is skipped)
  // Without the attention measurement: the same accuracy, no rows measured.
  eo.measure_attention = false;
  const model::TaskReport u = model::evaluate_task(
      w, "mqar", 200, 11, 2, model::parse_chain_argument("decode:*=streaming(sink=4,window=16)"), reg, eo);
  EXPECT_EQ(u.chain.right, s.chain.right);
  EXPECT_EQ(u.fidelity.kl_mean, s.fidelity.kl_mean);
  EXPECT_FALSE(u.fidelity.attention_measured);
  EXPECT_EQ(u.fidelity.decode.rows, 0);
  EXPECT_THROW(model::evaluate_task(w, "passkey", 300, 11, 1, model::parse_chain_argument("dense"), reg, eo),
               sieve::Error);  // longer than the model's 256 positions
  c.vocab_size = 40;
  EXPECT_THROW(model::evaluate_task(test::random_weights(c, 3), "passkey", 100, 11, 1,
                                    model::parse_chain_argument("dense"), reg, eo),
               sieve::Error);  // not the tasks' vocabulary
}

}  // namespace
