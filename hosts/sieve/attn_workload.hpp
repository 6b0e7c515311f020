// The limits `sieve attn` puts on its synthetic workload, checked before anything is allocated:
// every refusal names the option and the limit, instead of a std::bad_alloc (or an hour of f64
// reference work) later. The two totals bound what the run holds in memory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sieve/workload/synthetic.hpp"

namespace sieve::cli {

namespace attn_limits {
inline constexpr int32_t kMaxBatch = 4096;
inline constexpr int32_t kMaxContext = 1 << 24;  // tokens per sequence (2^24)
inline constexpr int32_t kMaxHeads = 1024;
inline constexpr int32_t kMaxHeadDim = 1024;
inline constexpr int32_t kMaxReps = 1000;
// Σ context × kv-heads × head-dim: the K and V pages are 4 GiB in f32, and the run keeps a few copies.
inline constexpr int64_t kMaxKvElements = int64_t(1) << 29;
// Σ query rows × q-heads × context: the f64 reference keeps a probability per (row, head, key).
inline constexpr int64_t kMaxReferenceEntries = int64_t(1) << 28;
}  // namespace attn_limits

// --context: "N" or "N1,N2,..." (one per sequence of --batch; with --batch 1, as many sequences as
// lengths), the batch size checked too. "" on success, else the message.
std::string parse_contexts(const std::string& text, int32_t batch, std::vector<int32_t>* out);

// The first option of `s` (as `sieve attn` spells it) outside its limit, as one message; "" if none.
std::string attn_workload_problem(const runtime::SyntheticSpec& s);

}  // namespace sieve::cli
