// The fidelity of a chain on a real model: the one path every plugin is judged by (`sieve eval`,
// the model tests). No plugin grades itself: every number comes from the host's own copies.
//
// Three runs over the same prompts (all prompts as one batch: prefill in one pass, batched
// decode), each on a fresh engine:
//  1. dense  — no chain (the core's dense kernel in every layer), greedy for `steps` tokens per
//     prompt: the dense tokens d_0..d_{N-1} and the dense next-token logits at each of the N
//     positions (after the prefill, then after feeding d_0 .. d_{N-2}). Timed, after an untimed
//     warm-up run of a few steps.
//  2. chain, teacher-forced — the same prompt, then the DENSE tokens fed one decode step at a
//     time, so the chain sees exactly the dense inputs. At the same N positions:
//       KL(dense ‖ chain) = Σ_v p_dense(v) (log p_dense(v) − log p_chain(v)), softmax in f64,
//       top-1 agreement   = fraction of positions where argmax chain == argmax dense (= d_i).
//     And per layer, at every attention call (prefill and decode), on host copies of what the
//     chain's layer really had — its post-RoPE queries, the store's resident K/V pages (the
//     chain's own cache contents, after whatever it evicted), the selection it used
//     (LayerRunner::selection_used) and the output it produced (after attend/correct hooks):
//       recall        = the f64 dense softmax mass (over the resident keys, causal) that falls
//                       on the keys the selection attends, averaged over (query token, q head)
//                       rows (reference::attention_recall);
//       out rel err   = sqrt(Σ‖o_chain − o_ref‖² / Σ‖o_ref‖²) over those rows, o_ref the f64
//                       dense attention of the same queries over the same resident cache
//                       (reference::attend_reference, selection ignored);
//       attended      = keys attended / causal keys, averaged over rows.
//     So a layer's numbers measure that layer's approximation on its own inputs; the error that
//     earlier layers pass on shows in the logits. For a policy that evicts, recall and out rel
//     err are relative to the resident cache: eviction's own cost shows in KL / agreement and in
//     the resident fraction (resident tokens / tokens fed, per layer).
//  3. chain, free-running — greedy on its own tokens for N steps: token agreement = fraction of
//     the N positions where its token equals the dense token; first divergence per prompt.
//     Timed, and its KV bytes compared with the dense run's (store bytes_in_use after the last
//     step).
// No run stops at EOS/BOS: every prompt gets exactly N positions.
//
// With EvalOptions::continuations (a task's answers, task_eval.hpp), runs 1 and 2 feed those
// tokens instead of the dense run's own, so both see exactly the task's inputs and their
// argmaxes at each position (dense_tokens, chain_forced_tokens) can be graded; run 3 is skipped.
//
// Every attention call's measurement runs in blocks of query rows (at most 2^23 f64
// probabilities at once), so a long prefill is measured in bounded memory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sieve/model/engine.hpp"
#include "sieve/model/model.hpp"
#include "sieve/model/model_chain.hpp"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/registry.hpp"

namespace sieve::model {

struct EvalOptions {
  EngineOptions engine;  // device, page size, KV dtype (max_batch is set to the prompt count)
  int32_t steps = 128;   // positions compared per prompt
  // Empty, or one per prompt (at least steps - 1 tokens each): fed after the prompt instead of the
  // dense run's greedy tokens, in the dense and the measured chain run.
  std::vector<std::vector<int32_t>> continuations;
  // false: no per-call attention measurement (recall, out rel err, attended: the f64 reference
  // over every query row, the costly part at long contexts); the logits metrics stay.
  bool measure_attention = true;
};

// Attention fidelity of one layer in one phase, aggregated over every call of the run.
struct AttentionFidelity {
  int64_t rows = 0;            // (query token, q head) rows measured
  double recall = 1;           // mean over rows
  double min_recall = 1;       // worst row
  double out_rel_err = 0;      // sqrt(Σ‖o − o_ref‖² / Σ‖o_ref‖²)
  double attended = 1;         // mean fraction of causal keys attended
  // accumulators
  double recall_sum = 0, attended_sum = 0, err_sq = 0, ref_sq = 0;
};

struct LayerFidelity {
  int32_t layer = 0;
  AttentionFidelity prefill, decode;
  double resident_fraction = 1;  // resident tokens / tokens fed, after the teacher-forced run
};

struct EvalReport {
  std::string chain;        // normalised chain spec
  std::string device;
  int32_t prompts = 0, steps = 0;
  bool attention_measured = true;     // false: layers, prefill, decode hold no measurement
  std::vector<LayerFidelity> layers;
  AttentionFidelity prefill, decode;  // over every layer

  // Teacher-forced logits at prompts × steps positions.
  int64_t positions = 0;
  double kl_mean = 0, kl_max = 0;
  double top1_agreement = 1;

  // Free-running greedy (free_running false: not run, with continuations).
  bool free_running = true;
  double token_agreement = 1;
  std::vector<int32_t> first_divergence;  // per prompt: first differing position, -1 if none

  uint64_t kv_bytes_dense = 0, kv_bytes_chain = 0;  // chain: run 3's, or run 2's when it is skipped
  double dense_seconds = 0, chain_seconds = 0;  // free-running generations (prefill + decode)
  double measure_seconds = 0;                   // the teacher-forced run with its measurements
  // What the chain's plugins reported through the host's `metric` service in the teacher-forced
  // run (e.g. Delta-KV's kv_reduction, DPXA's density), summarised over every call.
  std::vector<std::pair<std::string, runtime::HostServices::MetricSummary>> metrics;

  // dense_tokens / chain_forced_tokens: the argmax at each position of run 1 / run 2 (the dense
  // run's own tokens unless continuations were fed); chain_tokens: run 3's.
  std::vector<std::vector<int32_t>> prompt_tokens, dense_tokens, chain_forced_tokens, chain_tokens;
};

// Throws sieve::Error on setup problems and plugin failures (one line naming them).
EvalReport evaluate_fidelity(const ModelWeights& weights, const std::vector<std::vector<int32_t>>& prompts,
                             const runtime::ChainSpec& chain, const runtime::Registry& registry,
                             const EvalOptions& options);

// KL(p ‖ q) of softmax(p_logits) and softmax(q_logits), in f64.
double kl_divergence(std::span<const float> p_logits, std::span<const float> q_logits);

}  // namespace sieve::model
