// The synthetic long-context tasks with a right answer (passkey retrieval, multi-query associative
// recall, copying a span): their vocabulary and their instances. The same instances as the
// training script's generator, bench/train/sieve_tasks.py, for the same (task, length, seed,
// index): one counter-based PRNG (splitmix64) and one layout, documented there and here, and a
// test that the two agree (tests/model/test_tasks.cpp, bench/train/test_train.py).
//
//   h       = mix(mix(mix(seed + GAMMA) ^ task_id) ^ length)   task_id: passkey 1, mqar 2, copy 3
//   state   = mix(h + GAMMA * (index + 1))
//   draw(j) = mix(state + GAMMA * (j + 1))                    (mod 2^64; mix = splitmix64's finaliser)
//   below(j, n) = draw(j) mod n;  order(j, n) = 0..n-1 sorted by (draw(j + i), i)
//
// An instance is `length` tokens: BOS, filler (224 + below(t, 32) at position t) with the task's
// items in it, then the query section. Its prompt is prefilled; its continuation is fed one token
// at a time, and the prediction before each scored continuation token is graded.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace sieve::model {

namespace task_vocab {
inline constexpr int32_t kSize = 256;
inline constexpr int32_t kPad = 0, kBos = 1, kKey = 2, kQuery = 3, kSep = 4, kCopy = 5;
inline constexpr int32_t kDigit0 = 16, kDigits = 10;
inline constexpr int32_t kKey0 = 32, kKeys = 128;
inline constexpr int32_t kValue0 = 160, kValues = 64;
inline constexpr int32_t kFiller0 = 224, kFillers = 32;
inline constexpr int32_t kPasskeyDigits = 5, kCopySpan = 16;
}  // namespace task_vocab

struct TaskInstance {
  std::vector<int32_t> prompt;        // prefilled
  std::vector<int32_t> continuation;  // fed one decode step at a time
  std::vector<uint8_t> scored;        // [continuation]: 1 where the prediction of that token is graded
};

// "passkey", "mqar", "copy".
const std::vector<std::string>& task_names();
// The shortest instance of `task` (its layout must fit); throws sieve::Error for an unknown task.
int32_t task_min_length(const std::string& task);
// Key-value pairs of an MQAR instance: length / 32 within [8, 64].
int32_t mqar_pairs(int32_t length);

// Instance `index` of `task` at `length` tokens under `seed`. Throws sieve::Error (one line) for
// an unknown task or a length below task_min_length.
TaskInstance make_task_instance(const std::string& task, int32_t length, uint64_t seed, uint64_t index);

}  // namespace sieve::model
