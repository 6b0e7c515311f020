// Self-distillation of the SeerAttention-R AttnGate (paper 002 §2.3) on CPU, the model frozen.
//
// Data: for each sequence the model saw, per layer: its pre-RoPE queries and keys (the gate's
// inputs) and the ground truth per (layer, KV head, position t): the attention probabilities of
// each query head of the group over keys 0..t, max-pooled within each key block, max over the
// group (block_truth.hpp). Only COMPLETE blocks enter the loss (c_t = (t+1) / block of them, as
// the K-compression cache holds at inference), renormalised to sum 1; positions with c_t < 2 have
// nothing to rank and are skipped.
// Loss: mean over positions of KL(truth || softmax(gate scores)); gradients by hand through
// scores -> RoPE -> (RMSNorm) -> the projections; AdamW (beta 0.9/0.999, eps 1e-8, weight decay
// 0.01) with lr cosine-decayed from `lr` to 0 over the steps. One step = a minibatch of
// sequences, every (layer, KV head) gate updated (their parameters are disjoint).
// Deterministic for a seed: fixed iteration order, single thread, portable random numbers.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "gate/gate_file.hpp"

namespace sieve::seer {

// One sequence's gate inputs and targets.
struct DistillSequence {
  int32_t tokens = 0;
  // per layer: pre-RoPE q [T, n_q_heads, d] and k [T, n_kv_heads, d]
  std::vector<std::vector<float>> q_pre, k_pre;
  // per (layer * n_kv_heads + kv head): [T, n_blocks] with n_blocks = ceil(T / block);
  // truth: block max (not normalised); mass: mean over the group of the attention mass.
  std::vector<std::vector<float>> truth, mass;
};

// Build a sequence from the model's per-layer tensors (all [T, heads, d] f32 row-major):
// q_pre/k_pre are stored, q_post/k_post give the ground truth.
DistillSequence make_distill_sequence(const GateShape& shape, int32_t tokens,
                                      std::vector<std::vector<float>> q_pre, std::vector<std::vector<float>> k_pre,
                                      const std::vector<std::vector<float>>& q_post,
                                      const std::vector<std::vector<float>>& k_post);

struct DistillOptions {
  int32_t steps = 300;
  int32_t batch = 4;          // sequences per step
  double lr = 1e-3;
  double weight_decay = 0.01;
  uint64_t seed = 0;          // minibatch order
};

struct GateEval {
  double kl = 0;             // mean KL(truth || softmax(gate)) over positions and groups
  double gate_recall = 0;    // attention mass (complete blocks) on the gate's top 25% of blocks
  double oracle_recall = 0;  // the same for the top 25% by the truth (the upper bound)
  int64_t positions = 0;     // (position, layer, KV head) rows evaluated
};

// Loss and gradient of one step over `seqs` (indices into data). Returns the mean KL.
double gate_loss_and_grad(const GateWeights& w, const std::vector<DistillSequence>& data,
                          const std::vector<int32_t>& seqs, std::vector<float>* grad_wq, std::vector<float>* grad_wk);

// Train in place. `on_step(step, train_kl)` is called after every step (may be empty).
void distill_gate(GateWeights& w, const std::vector<DistillSequence>& train, const DistillOptions& options,
                  const std::function<void(int32_t, double)>& on_step = {});

GateEval evaluate_gate(const GateWeights& w, const std::vector<DistillSequence>& data);

}  // namespace sieve::seer
