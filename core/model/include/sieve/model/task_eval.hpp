// Task accuracy of a chain on a model trained for the long-context tasks (task_instances.hpp):
// held-out instances from a seed, each prompt prefilled through the prefill chain and its
// continuation fed through the decode chain (teacher forcing), and the prediction before every
// scored continuation token graded — for dense attention and for the chain — beside the fidelity
// metrics of the same runs (fidelity_eval.hpp, with the continuations fed).
//
// With teacher forcing an instance is right exactly when greedy decoding would produce its
// answer: every scored prediction equals its token (for passkey and copy every continuation token
// is scored; MQAR's later query keys are fed, only the values are scored).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "sieve/model/fidelity_eval.hpp"
#include "sieve/model/task_instances.hpp"

namespace sieve::model {

struct TaskScore {
  int64_t graded = 0, right = 0;        // scored tokens, and those predicted right
  int64_t instances = 0, all_right = 0;  // instances, and those with every scored token right
  double accuracy() const { return graded ? double(right) / double(graded) : 0.0; }
  double exact() const { return instances ? double(all_right) / double(instances) : 0.0; }
};

struct TaskReport {
  std::string task;
  int32_t length = 0;
  uint64_t seed = 0;
  TaskScore dense, chain;
  EvalReport fidelity;  // the same runs' metrics (free_running false)
};

// Grade `predicted` (the argmax at each continuation position, one row per instance).
TaskScore grade_task(const std::vector<TaskInstance>& instances, const std::vector<std::vector<int32_t>>& predicted);

// Instances 0..count-1 of `task` at `length` tokens under `seed`, evaluated in one batch with
// `options`' engine and measure_attention (its steps and continuations come from the task).
// Throws sieve::Error (one line) for a bad task or length, a model whose vocabulary is not the
// tasks' or too short for `length`, and what evaluate_fidelity throws.
TaskReport evaluate_task(const ModelWeights& weights, const std::string& task, int32_t length, uint64_t seed,
                         int32_t count, const runtime::ChainSpec& chain, const runtime::Registry& registry,
                         const EvalOptions& options);

// The seed a model was trained with, from training.json beside it (bench/train/train.py writes
// it), or nullopt when there is none (`model` "": the embedded model). Throws sieve::Error when
// the file exists but is not JSON with an unsigned integer train_seed.
std::optional<uint64_t> training_seed(const std::string& model);

}  // namespace sieve::model
