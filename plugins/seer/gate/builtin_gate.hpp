// Built-in, training-free gates: `weights=builtin:NAME` instead of a distilled file, so seer runs
// (and is conformed) on any geometry without one. They are baselines, not SeerAttention-R's gate.
//   builtin:mean  score of a block = mean over the GQA group's pre-RoPE queries . mean of the
//                 block's pre-RoPE keys / sqrt(head_dim): W_q averages the group's heads, W_k
//                 picks the mean third of the pooled [max | min | mean] keys, gate_dim = head_dim,
//                 and no RoPE (rope_theta 0 in the shape: relative position is ignored, which is
//                 exact when pre- and post-RoPE vectors coincide, as in synthetic workloads).
#pragma once
#include <sieve/abi.h>

#include <string>

#include "gate/gate_file.hpp"

namespace sieve::seer {

inline constexpr const char* kBuiltinPrefix = "builtin:";

// True when `weights` names a built-in gate (it starts with "builtin:").
bool is_builtin_gate(const std::string& weights);
// Why `weights` is not a known built-in gate ("" when it is).
std::string builtin_gate_problem(const std::string& weights);
// The gate `weights` names for geometry `g` and `block`; throws sieve::Error when unknown.
GateWeights builtin_gate(const std::string& weights, const sieve_geometry& g, int32_t block, bool rmsnorm);

}  // namespace sieve::seer
