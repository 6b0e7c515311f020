// The arguments of one core-kernel call with an attention variant (sieve_attention_variant, ABI
// 1.1) over int32 arrays a policy filled on the attention device: the variant's tensors (their
// shapes live here, so keep the object alive for the call) and the sieve_attention_args pointing
// at them. Header-only: a tool that calls sieve::kernels directly uses it too. HostVariant below
// is the host-memory form a CPU path fills as it goes.
#pragma once
#include <sieve/sieve.h>

#include <cstdint>
#include <vector>

namespace sieve::plugin {

class AttentionVariant {
 public:
  // Rows of q_block query tokens per `heads` (sieve_selection_heads); row_spans [n_rows][2], spans
  // [n_spans][3], packed_pos / packed_count [n_packed] on `device` (packed_count may be NULL: every
  // count 1). `flags`: sieve_variant_flags.
  AttentionVariant(DLDevice device, uint32_t heads, int32_t q_block, int32_t n_rows, int32_t* row_spans,
                   int64_t n_spans, int32_t* spans, int64_t n_packed, int32_t* packed_pos, int32_t* packed_count,
                   uint32_t flags = 0)
      : rows_{n_rows, 2}, spans_{n_spans, 3}, packed_{n_packed} {
    v_.hdr = SIEVE_HEADER_INIT(sieve_attention_variant);
    v_.heads = heads;
    v_.q_block = q_block;
    v_.n_rows = n_rows;
    v_.row_spans = i32(device, row_spans, rows_, 2);
    v_.spans = i32(device, spans, spans_, 2);
    v_.packed_pos = i32(device, packed_pos, packed_, 1);
    if (packed_count) v_.packed_count = i32(device, packed_count, packed_, 1);
    v_.flags = flags;
  }
  AttentionVariant(const AttentionVariant&) = delete;
  AttentionVariant& operator=(const AttentionVariant&) = delete;

  // Prefill attention of q (its tokens by qo_indptr and the host mirror) over kv into out, with
  // this variant; scale 0: 1/sqrt(head_dim).
  sieve_attention_args args(int32_t n_q_heads, int32_t n_kv_heads, int32_t head_dim, float scale, const DLTensor* q,
                            DLTensor* out, const DLTensor* qo_indptr, const int32_t* qo_indptr_host,
                            const sieve_paged_kv* kv) const {
    sieve_attention_args a{};
    a.hdr = SIEVE_HEADER_INIT(sieve_attention_args);
    a.phase = SIEVE_PHASE_PREFILL;
    a.n_q_heads = n_q_heads;
    a.n_kv_heads = n_kv_heads;
    a.head_dim = head_dim;
    a.scale = scale;
    a.q = q;
    a.out = out;
    a.qo_indptr = qo_indptr;
    a.qo_indptr_host = qo_indptr_host;
    a.kv = kv;
    a.variant = &v_;
    return a;
  }
  // The same for a policy's layer call.
  sieve_attention_args args(const sieve_layer_call& call, DLTensor& out, const sieve_geometry& g, float scale) const {
    return args(g.n_q_heads, g.n_kv_heads, g.head_dim, scale, call.q, &out, call.qo_indptr, call.qo_indptr_host,
                call.kv_view);
  }

 private:
  static DLTensor i32(DLDevice device, int32_t* data, int64_t* shape, int ndim) {
    DLTensor t{};
    t.data = data;
    t.device = device;
    t.ndim = ndim;
    t.dtype = DLDataType{kDLInt, 32, 1};
    t.shape = shape;
    return t;
  }
  int64_t rows_[2], spans_[2], packed_[1];
  sieve_attention_variant v_{};
};

// A variant built in host memory (rows per query head): a CPU path appends its packed keys and
// spans and sets each row's span range, then hands variant(...) to the host's kernel.
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
  AttentionVariant variant(int32_t q_block, int32_t n_rows, uint32_t flags = 0) {
    return AttentionVariant(DLDevice{kDLCPU, 0}, SIEVE_SEL_PER_Q_HEAD, q_block, n_rows, row_spans.data(),
                            int64_t(spans.size() / 3), spans.data(), int64_t(packed_pos.size()), packed_pos.data(),
                            packed_count.data(), flags);
  }
};

}  // namespace sieve::plugin
