#include "sieve/model/generate.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "sieve/model/tokenizer.hpp"
#include "sieve/util/error.hpp"

namespace sieve::model {

int32_t sample_token(std::span<const float> logits, float temperature, std::mt19937_64& rng) {
  if (!(temperature > 0.f)) return int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const float mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0;
  for (size_t i = 0; i < p.size(); ++i) sum += p[i] = std::exp(double(logits[i] - mx) / temperature);
  double r = std::uniform_real_distribution<double>(0.0, sum)(rng);
  for (size_t i = 0; i < p.size(); ++i)
    if ((r -= p[i]) <= 0) return int32_t(i);
  return int32_t(p.size() - 1);
}

std::vector<Generation> generate(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                 const GenerateOptions& o, GenerationStats* stats) {
  using clock = std::chrono::steady_clock;
  require(!prompts.empty(), SIEVE_ERR_INVALID_ARGUMENT, "generate: no prompt");
  require(o.steps >= 1, SIEVE_ERR_INVALID_ARGUMENT, "generate: steps must be >= 1, got " + std::to_string(o.steps));
  const int32_t max_len = engine.geometry().max_seq_len;
  for (const auto& p : prompts) {
    require(!p.empty(), SIEVE_ERR_INVALID_ARGUMENT, "generate: an empty prompt (start it with BOS)");
    // The last generated token is not fed back, so a sequence holds prompt + steps - 1 tokens.
    require(int64_t(p.size()) + o.steps - 1 <= max_len, SIEVE_ERR_INVALID_ARGUMENT,
            "generate: a prompt of " + std::to_string(p.size()) + " tokens + " + std::to_string(o.steps) +
                " steps exceeds the model's " + std::to_string(max_len) + " positions");
  }
  const int32_t V = engine.config().vocab_size;
  std::mt19937_64 rng(o.seed);
  std::vector<Generation> out(prompts.size());
  std::vector<int32_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i) {
    out[i].prompt = prompts[i];
    ids.push_back(engine.add_sequence());
  }
  struct Remove {  // the sequences go even when a step throws
    Engine& e;
    std::vector<int32_t>& ids;
    ~Remove() {
      for (int32_t id : ids) try {
          e.remove_sequence(id);
        } catch (...) {
        }
    }
  } remove{engine, ids};

  GenerationStats s;
  for (const auto& p : prompts) s.prompt_tokens += int64_t(p.size());
  std::vector<float> logits;
  auto t0 = clock::now();
  engine.prefill(ids, prompts, &logits);
  s.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  if (o.after_step) o.after_step(0);

  // Running sequences: index into prompts; their next token to feed.
  std::vector<size_t> running;
  std::vector<int32_t> next;
  auto take = [&](size_t i, std::span<const float> row) {
    const int32_t t = sample_token(row, o.temperature, rng);
    if (o.stop_at_bos_eos && (t == Tokenizer::kBos || t == Tokenizer::kEos)) return;
    out[i].tokens.push_back(t);
    ++s.generated_tokens;
    if (int32_t(out[i].tokens.size()) < o.steps) {
      running.push_back(i);
      next.push_back(t);
    }
  };
  for (size_t i = 0; i < prompts.size(); ++i) take(i, std::span<const float>(logits).subspan(i * V, V));
  t0 = clock::now();
  while (!running.empty()) {
    std::vector<int32_t> seqs;
    for (size_t i : running) seqs.push_back(ids[i]);
    std::vector<size_t> was = std::move(running);
    std::vector<int32_t> feed = std::move(next);
    running.clear();
    next.clear();
    engine.decode(seqs, feed, &logits);
    if (o.after_step) o.after_step(int32_t(engine.decode_steps()));
    for (size_t b = 0; b < was.size(); ++b) take(was[b], std::span<const float>(logits).subspan(b * V, V));
  }
  s.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  s.kv_bytes = engine.kv_bytes();
  if (stats) *stats = s;
  return out;
}

}  // namespace sieve::model
