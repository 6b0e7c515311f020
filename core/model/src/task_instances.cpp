#include "sieve/model/task_instances.hpp"

#include <algorithm>
#include <numeric>

#include "sieve/util/error.hpp"

namespace sieve::model {

namespace {

using namespace task_vocab;

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

int task_id(const std::string& task) {
  const auto& names = task_names();
  const auto it = std::find(names.begin(), names.end(), task);
  if (it == names.end()) fail(SIEVE_ERR_INVALID_ARGUMENT, "unknown task '" + task + "' (known: passkey, mqar, copy)");
  return int(it - names.begin()) + 1;
}

// One instance's draws (sieve_tasks.py's Draws).
class Draws {
 public:
  Draws(int task, int32_t length, uint64_t seed, uint64_t index) {
    uint64_t h = mix(mix(mix(seed + kGamma) ^ uint64_t(task)) ^ uint64_t(length));
    state_ = mix(h + kGamma * (index + 1));
  }
  uint64_t draw(int64_t j) const { return mix(state_ + kGamma * (uint64_t(j) + 1)); }
  int32_t below(int64_t j, int32_t n) const { return int32_t(draw(j) % uint64_t(n)); }
  std::vector<int32_t> order(int64_t j, int32_t n) const {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::vector<uint64_t> d(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) d[size_t(i)] = draw(j + i);
    std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return d[size_t(a)] < d[size_t(b)]; });
    return idx;
  }

 private:
  uint64_t state_ = 0;
};

}  // namespace

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = {"passkey", "mqar", "copy"};
  return names;
}

int32_t task_min_length(const std::string& task) {
  static const int32_t min_len[] = {16, 64, 3 * kCopySpan};
  return min_len[task_id(task) - 1];
}

int32_t mqar_pairs(int32_t length) { return std::clamp(length / 32, 8, 64); }

TaskInstance make_task_instance(const std::string& task, int32_t length, uint64_t seed, uint64_t index) {
  const int id = task_id(task);
  const int32_t L = length;
  if (L < task_min_length(task))
    fail(SIEVE_ERR_INVALID_ARGUMENT, task + " needs at least " + std::to_string(task_min_length(task)) +
                                         " tokens, got " + std::to_string(L));
  const Draws d(id, L, seed, index);
  std::vector<int32_t> tok(static_cast<size_t>(L));
  std::vector<uint8_t> scored(static_cast<size_t>(L), 0);
  for (int32_t t = 0; t < L; ++t) tok[size_t(t)] = kFiller0 + d.below(t, kFillers);
  tok[0] = kBos;
  int32_t prompt = 0;
  if (task == "passkey") {
    const int32_t n = kPasskeyDigits;
    const int32_t p = 1 + d.below(L + n, L - 12);
    tok[size_t(p)] = kKey;
    for (int32_t k = 0; k < n; ++k) {
      const int32_t digit = kDigit0 + d.below(L + k, kDigits);
      tok[size_t(p + 1 + k)] = digit;
      tok[size_t(L - n + k)] = digit;
      scored[size_t(L - n + k)] = 1;
    }
    tok[size_t(L - n - 1)] = kQuery;
    prompt = L - n;
  } else if (task == "mqar") {
    const int32_t m = mqar_pairs(L), C = L - 2 * m - 2, seg = C / m;
    const std::vector<int32_t> key_order = d.order(L, kKeys);
    std::vector<int32_t> keys(static_cast<size_t>(m)), values(static_cast<size_t>(m));
    for (int32_t i = 0; i < m; ++i) {
      keys[size_t(i)] = kKey0 + key_order[size_t(i)];
      values[size_t(i)] = kValue0 + d.below(L + kKeys + i, kValues);
      const int32_t pos = 1 + i * seg + d.below(L + kKeys + m + i, seg - 1);
      tok[size_t(pos)] = keys[size_t(i)];
      tok[size_t(pos + 1)] = values[size_t(i)];
    }
    tok[size_t(L - 2 * m - 1)] = kSep;
    const std::vector<int32_t> queried = d.order(L + kKeys + 2 * m, m);
    for (int32_t q = 0; q < m; ++q) {
      tok[size_t(L - 2 * m + 2 * q)] = keys[size_t(queried[size_t(q)])];
      tok[size_t(L - 2 * m + 2 * q + 1)] = values[size_t(queried[size_t(q)])];
      scored[size_t(L - 2 * m + 2 * q + 1)] = 1;
    }
    prompt = L - 2 * m + 1;
  } else {  // copy
    const int32_t S = kCopySpan, C = L - S - 2;
    const std::vector<int32_t> key_order = d.order(L, kKeys);
    const int32_t p = 1 + d.below(L + kKeys, C - S + 1);
    for (int32_t i = 0; i < S; ++i) {
      tok[size_t(p + i)] = kKey0 + key_order[size_t(i)];
      tok[size_t(L - S + i)] = kKey0 + key_order[size_t(i)];
      if (i > 0) scored[size_t(L - S + i)] = 1;
    }
    tok[size_t(L - S - 1)] = kCopy;
    prompt = L - S + 1;
  }
  TaskInstance inst;
  inst.prompt.assign(tok.begin(), tok.begin() + prompt);
  inst.continuation.assign(tok.begin() + prompt, tok.end());
  inst.scored.assign(scored.begin() + prompt, scored.end());
  return inst;
}

}  // namespace sieve::model
