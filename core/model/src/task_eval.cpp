#include "sieve/model/task_eval.hpp"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"

namespace sieve::model {

TaskScore grade_task(const std::vector<TaskInstance>& instances, const std::vector<std::vector<int32_t>>& predicted) {
  require(predicted.size() == instances.size(), SIEVE_ERR_INVALID_ARGUMENT,
          "task: " + std::to_string(predicted.size()) + " predictions for " + std::to_string(instances.size()) +
              " instances");
  TaskScore s;
  for (size_t b = 0; b < instances.size(); ++b) {
    const TaskInstance& inst = instances[b];
    require(predicted[b].size() >= inst.continuation.size(), SIEVE_ERR_INVALID_ARGUMENT,
            "task: instance " + std::to_string(b) + " has " + std::to_string(predicted[b].size()) +
                " predictions for a continuation of " + std::to_string(inst.continuation.size()));
    bool all = true;
    for (size_t i = 0; i < inst.continuation.size(); ++i) {
      if (!inst.scored[i]) continue;
      const bool ok = predicted[b][i] == inst.continuation[i];
      ++s.graded;
      s.right += ok;
      all = all && ok;
    }
    ++s.instances;
    s.all_right += all;
  }
  return s;
}

TaskReport evaluate_task(const ModelWeights& weights, const std::string& task, int32_t length, uint64_t seed,
                         int32_t count, const runtime::ChainSpec& chain, const runtime::Registry& registry,
                         const EvalOptions& options) {
  require(count >= 1, SIEVE_ERR_INVALID_ARGUMENT, "task: instances must be >= 1, got " + std::to_string(count));
  const ModelConfig& c = weights.config;
  require(c.vocab_size == task_vocab::kSize, SIEVE_ERR_INVALID_ARGUMENT,
          "task: the model's vocabulary has " + std::to_string(c.vocab_size) + " tokens, the tasks' " +
              std::to_string(task_vocab::kSize) + " (a model trained by bench/train/train.py)");
  require(length <= c.seq_len, SIEVE_ERR_INVALID_ARGUMENT,
          "task: length " + std::to_string(length) + " exceeds the model's " + std::to_string(c.seq_len) +
              " positions");
  TaskReport r;
  r.task = task;
  r.length = length;
  r.seed = seed;
  std::vector<TaskInstance> instances;
  std::vector<std::vector<int32_t>> prompts;
  EvalOptions eo = options;
  eo.continuations.clear();
  for (int32_t i = 0; i < count; ++i) {
    instances.push_back(make_task_instance(task, length, seed, uint64_t(i)));
    prompts.push_back(instances.back().prompt);
    eo.continuations.push_back(instances.back().continuation);
  }
  // Every instance of a (task, length) has the same continuation length.
  eo.steps = int32_t(instances.front().continuation.size());
  r.fidelity = evaluate_fidelity(weights, prompts, chain, registry, eo);
  r.dense = grade_task(instances, r.fidelity.dense_tokens);
  r.chain = grade_task(instances, r.fidelity.chain_forced_tokens);
  return r;
}

std::optional<uint64_t> training_seed(const std::string& model) {
  namespace fs = std::filesystem;
  if (model.empty()) return std::nullopt;
  std::error_code ec;
  const fs::path p(model);
  const fs::path file = (fs::is_directory(p, ec) ? p : p.parent_path()) / "training.json";
  if (!fs::exists(file, ec)) return std::nullopt;
  const InputFile in(file.string(), "training record");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in.read_text(1 << 20));
  } catch (const nlohmann::json::exception& e) {
    in.refuse(std::string("not JSON: ") + e.what());
  }
  if (!j.is_object() || !j.contains("train_seed") || !j["train_seed"].is_number_unsigned())
    in.refuse("has no unsigned integer 'train_seed'");
  return j["train_seed"].get<uint64_t>();
}

}  // namespace sieve::model
