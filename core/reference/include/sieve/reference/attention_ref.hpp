// The f64 attention reference: the oracle every kernel (CPU, CUDA, plugin `attend` hooks) is
// compared with. Same semantics as api/sieve/attention.h (paged K/V, ragged queries, causal
// prefill, GQA, block selections, q_rows, lse and page statistics), written as the plain
// definition: gather the keys a query attends, softmax in double, weighted sum. No online softmax,
// no tiling.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "sieve/attention.h"

namespace sieve::reference {

struct RefOptions {
  bool ignore_selection = false;  // dense attention on the same inputs (o_dense for fidelity)
  bool keep_probs = false;        // fill RefAttention::probs
};

struct RefAttention {
  int32_t n_q_tokens = 0, hq = 0, d = 0;
  std::vector<uint8_t> computed;  // [n_q_tokens]: 1 for the query rows the call computes (q_rows)
  std::vector<double> out;        // [n_q_tokens, hq, d]; 0 in rows not computed
  std::vector<double> lse;        // [n_q_tokens, hq]; -inf for rows that attend nothing or are not computed
  int32_t stats_h = 0;            // page_mass columns: n_kv_heads, 1, or 0 without stats
  std::vector<double> page_mass;  // [nnz pages of the view, stats_h] (decode with stats)
  // With keep_probs: the softmax probability of every resident key of the query's sequence, per
  // (token, head), 0 for keys not attended. Row (t, h) is
  // probs[probs_indptr[t*hq + h] .. probs_indptr[t*hq + h + 1]), kv_len of t's sequence long
  // (empty for rows not computed).
  std::vector<int64_t> probs_indptr;
  std::vector<double> probs;
  std::vector<uint8_t> attended;  // with keep_probs: 1 where the row attends the key (probs' layout)

  std::span<const double> out_row(int32_t token, int32_t head) const {
    return {out.data() + (int64_t(token) * hq + head) * d, size_t(d)};
  }
  std::span<const double> prob_row(int32_t token, int32_t head) const {
    const int64_t i = int64_t(token) * hq + head;
    return {probs.data() + probs_indptr[i], size_t(probs_indptr[i + 1] - probs_indptr[i])};
  }
  std::span<const uint8_t> attended_row(int32_t token, int32_t head) const {
    const int64_t i = int64_t(token) * hq + head;
    return {attended.data() + probs_indptr[i], size_t(probs_indptr[i + 1] - probs_indptr[i])};
  }
};

// Attention of `args` in f64. Every tensor must be in host memory (any storage dtype); `out`,
// `lse` and `page_mass` of args are not written. Throws std::invalid_argument with one line
// naming the problem when the arguments are malformed (check_attention_args), a page id or a
// selection entry is out of range, or a tensor is not on the CPU.
RefAttention attend_reference(const sieve_attention_args& args, const RefOptions& options = {});

// Which resident keys of its sequence query token `token`, head `head` attends under `args`
// (selection and causality), as a 0/1 mask of kv_len entries. Same preconditions.
std::vector<uint8_t> attended_keys(const sieve_attention_args& args, int32_t token, int32_t head);

}  // namespace sieve::reference
