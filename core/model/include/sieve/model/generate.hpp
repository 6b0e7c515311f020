// Text generation over an Engine: prefill every prompt in one pass, then batched decode of the
// sequences still running (they stop at different lengths), sampling each next token greedily
// (temperature 0) or from softmax(logits / temperature).
#pragma once
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "sieve/model/engine.hpp"

namespace sieve::model {

struct GenerateOptions {
  int32_t steps = 256;       // tokens generated per prompt (the first comes from the prefill logits)
  float temperature = 0.f;   // 0: greedy (argmax, lowest id on ties)
  uint64_t seed = 0;         // sampling seed (temperature > 0)
  bool stop_at_bos_eos = true;  // a generated BOS or EOS ends the sequence (not kept in tokens)
  // Called after the prefill (step 0) and after every decode step (1, 2, ...), e.g. to trace the
  // store's resident bytes (sieve run --kv-trace). Optional.
  std::function<void(int32_t step)> after_step;
};

struct Generation {
  std::vector<int32_t> prompt;
  std::vector<int32_t> tokens;  // generated, prompt excluded
};

struct GenerationStats {
  double prefill_seconds = 0;
  double decode_seconds = 0;
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  uint64_t kv_bytes = 0;  // store bytes in use after the last step (before the sequences go)
};

// The next token from one row of logits.
int32_t sample_token(std::span<const float> logits, float temperature, std::mt19937_64& rng);

// Generates for every prompt (each non-empty; at most max_batch prompts) as one batch. The
// sequences are added to the engine and removed at the end. Throws sieve::Error (prompt + steps
// beyond max_seq_len, a plugin failure, ...).
std::vector<Generation> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& options, GenerationStats* stats = nullptr);

}  // namespace sieve::model
