// Fidelity metrics: how far an attention output is from the f64 reference, and how much of the
// dense attention a selection keeps. Every kernel test and every plugin report goes through these
// (no plugin grades itself).
#pragma once
#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <span>

#include "sieve/attention.h"
#include "sieve/reference/attention_ref.hpp"

namespace sieve::reference {

// ‖got − ref‖₂ / ‖ref‖₂ over n values (‖got − ref‖₂ itself when ‖ref‖₂ == 0). NaN in got → NaN.
double relative_error(const double* ref, const double* got, size_t n);
double relative_error(const double* ref, const float* got, size_t n);

// An output tensor compared with the reference, over (query token, query head) rows.
struct OutputError {
  double rel_l2 = 0;         // ‖o − ref‖ / ‖ref‖ over every compared row together
  double max_row_rel = 0;    // the worst row's relative error (absolute for all-zero ref rows)
  int32_t worst_token = -1;  // where max_row_rel is
  int32_t worst_head = -1;
  int64_t non_finite = 0;    // NaN / inf values among the compared outputs
  int64_t rows = 0;          // (token, head) rows compared
};
// `out`: host tensor [n_q_tokens, n_q_heads, head_dim], any float dtype. Compares the query
// tokens listed in `tokens`, or every token the reference computed when `tokens` is empty.
OutputError compare_output(const RefAttention& ref, const DLTensor& out,
                           std::span<const int32_t> tokens = {});

// max_i |got_i − ref_i| / max(|ref_i|, floor) over n values; equal infinities count as 0,
// anything else non-finite as +inf.
double max_relative_error(const double* ref, const DLTensor& got, int64_t n, double floor);
// lse: host f32 [n_q_tokens, n_q_heads] against ref.lse, max absolute error over the rows of
// `tokens` (every computed token when empty); -inf == -inf counts as 0.
double max_lse_error(const RefAttention& ref, const DLTensor& lse,
                     std::span<const int32_t> tokens = {});

// Attention recall of `args.selection`: the fraction of the dense softmax mass (f64, causal, same
// inputs) that falls on the keys the selection attends, averaged over the computed (query token,
// query head) rows. 1 for a dense (NULL or ALL) selection. Preconditions of attend_reference.
double attention_recall(const sieve_attention_args& args);

}  // namespace sieve::reference
