// An attention variant (sieve_attention_variant, ABI 1.1) built in host memory: a CPU policy
// appends its packed keys and spans, sets each row's span range, then has the host's core kernel
// attend them (kernels->attend through host_kernel_attend). Rows per query head.
#pragma once
#include <sieve/sieve.h>

#include <cstdint>
#include <string_view>
#include <vector>

#include "sieve/plugin/checks.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::plugin {

struct HostVariant {
  std::vector<int32_t> row_spans;     // [rows][2]
  std::vector<int32_t> spans;         // [n][3]: {sieve_span_kind, begin, end}
  std::vector<int32_t> packed_pos;    // per packed key
  std::vector<int32_t> packed_count;  // per packed key (>= 1)

  void clear() {
    row_spans.clear();
    spans.clear();
    packed_pos.clear();
    packed_count.clear();
  }

  // The core kernel over the call's queries and KV view into `out`, rows of q_block query tokens
  // per query head (the first n_rows entries of row_spans). Throws what host_kernel_attend throws.
  void attend(const sieve_layer_call& call, DLTensor& out, const sieve_geometry& g, int32_t q_block,
              int32_t n_rows, float scale, const sieve_host_services& services, std::string_view what) {
    int64_t rows_shape[2] = {n_rows, 2}, spans_shape[2] = {int64_t(spans.size() / 3), 3},
            packed_shape[1] = {int64_t(packed_pos.size())};
    auto tensor = [](std::vector<int32_t>& v, int64_t* shape, int ndim) {
      DLTensor t{};
      t.data = v.data();
      t.device = kCpu;
      t.ndim = ndim;
      t.dtype = kI32;
      t.shape = shape;
      return t;
    };
    sieve_attention_variant v{};
    v.hdr = SIEVE_HEADER_INIT(sieve_attention_variant);
    v.heads = SIEVE_SEL_PER_Q_HEAD;
    v.q_block = q_block;
    v.n_rows = n_rows;
    v.row_spans = tensor(row_spans, rows_shape, 2);
    v.spans = tensor(spans, spans_shape, 2);
    v.packed_pos = tensor(packed_pos, packed_shape, 1);
    v.packed_count = tensor(packed_count, packed_shape, 1);
    sieve_attention_args a{};
    a.hdr = SIEVE_HEADER_INIT(sieve_attention_args);
    a.phase = SIEVE_PHASE_PREFILL;
    a.n_q_heads = g.n_q_heads;
    a.n_kv_heads = g.n_kv_heads;
    a.head_dim = g.head_dim;
    a.scale = scale;
    a.q = call.q;
    a.out = &out;
    a.qo_indptr = call.qo_indptr;
    a.qo_indptr_host = call.qo_indptr_host;
    a.kv = call.kv_view;
    a.variant = &v;
    host_kernel_attend(services, a, what);
  }
};

}  // namespace sieve::plugin
