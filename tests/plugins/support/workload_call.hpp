// A reference::Workload (core/reference/workload.hpp) as a policy plugin sees it, for the
// scenarios of plugin tests: the prefill spec, the geometry, the layer call over the workload's
// host tensors, and its output compared element by element. Needs sieve_reference.
#pragma once
#include <sieve/sieve.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "sieve/reference/workload.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::testing {

// A prefill of ragged sequences (kv_lens tokens each, the last n_new of them queries) with K/V,
// queries and output all in `dtype`.
inline reference::WorkloadSpec prefill_spec(DLDataType dtype, int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim,
                                            int32_t page_size, std::vector<int32_t> kv_lens,
                                            std::vector<int32_t> n_new, uint64_t seed) {
  reference::WorkloadSpec s;
  s.n_q_heads = n_q_heads;
  s.n_kv_heads = n_kv_heads;
  s.head_dim = head_dim;
  s.page_size = page_size;
  s.kv_dtype = dtype;
  s.q_dtype = dtype;
  s.out_dtype = dtype;
  s.phase = SIEVE_PHASE_PREFILL;
  s.kv_lens = std::move(kv_lens);
  s.n_new = std::move(n_new);
  s.seed = seed;
  return s;
}

// The geometry of `w` on the CPU: one layer, room for exactly its batch and its longest sequence.
inline sieve_geometry workload_geometry(const reference::Workload& w) {
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 1;
  g.n_q_heads = w.spec.n_q_heads;
  g.n_kv_heads = w.spec.n_kv_heads;
  g.head_dim = w.spec.head_dim;
  g.page_size = w.spec.page_size;
  g.max_batch = w.batch;
  g.max_seq_len = *std::max_element(w.kv_len.begin(), w.kv_len.end());
  g.kv_dtype = w.spec.kv_dtype;
  g.device = kCpu;
  g.rope_theta = 10000.f;
  g.rope_dim = w.spec.head_dim;
  return g;
}

// The call of `layer` over w's host tensors for sequences 0..batch-1, whose ids go to *seq_ids
// (it and `g` must outlive the call).
inline sieve_layer_call workload_call(reference::Workload& w, const sieve_geometry& g, uint32_t phase, int32_t layer,
                                      std::vector<int32_t>* seq_ids) {
  sieve_layer_call c{};
  c.hdr = SIEVE_HEADER_INIT(sieve_layer_call);
  c.layer = layer;
  c.phase = phase;
  c.batch = w.batch;
  seq_ids->resize(size_t(w.batch));
  for (int32_t b = 0; b < w.batch; ++b) (*seq_ids)[size_t(b)] = b;
  c.seq_ids = seq_ids->data();
  c.qo_indptr = &w.qo_indptr.dl();
  c.qo_indptr_host = w.qo_indptr.data<int32_t>();
  c.kv_len_host = w.kv_len.data();
  c.q = &w.q.dl();
  c.geometry = &g;
  c.kv_view = &w.kv;
  return c;
}

// The workload's output, element by element, in f64.
inline std::vector<double> workload_output(const reference::Workload& w) {
  std::vector<double> o(size_t(w.out.numel()));
  for (int64_t i = 0; i < w.out.numel(); ++i) o[size_t(i)] = w.out.get(i);
  return o;
}

// The largest |got − want| / (1 + |want|) into *err (a non-finite `got` counts as infinite), and
// where it is, in words.
inline std::string worst_element(const std::vector<double>& got, const std::vector<double>& want, double* err) {
  *err = 0;
  size_t at = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::isfinite(got[i]) ? std::abs(got[i] - want[i]) / (1 + std::abs(want[i])) : INFINITY;
    if (!(e <= *err)) {
      *err = e;
      at = i;
    }
  }
  return "element " + std::to_string(at) + ": got " + std::to_string(got[at]) + ", want " + std::to_string(want[at]);
}

}  // namespace sieve::testing
