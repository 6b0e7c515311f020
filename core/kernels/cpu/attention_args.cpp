// Host-side argument checks of the core attention kernels (see attention_args.hpp).
#include "sieve/kernels/attention_args.hpp"

#include <cmath>
#include <cstddef>
#include <initializer_list>

#include "sieve/util/page_layout.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kernels {
namespace {

// One expected dimension: its size (-1: any) and what it means, for the message.
struct Dim {
  int64_t size;
  const char* meaning;
};

std::string shape_text(std::initializer_list<Dim> dims) {
  std::string s = "[";
  bool first = true;
  for (const Dim& d : dims) {
    if (!first) s += ", ";
    s += d.meaning;
    first = false;
  }
  return s + "]";
}

// Rank, sizes, non-negative dims, data present (an empty tensor may have none) and compact
// row-major layout: the kernels index every tensor but the K/V pages as dense row-major memory
// (`strided`: the pages, whose strides page_strides checks).
std::string check_shape(const DLTensor* t, const char* name, std::initializer_list<Dim> dims,
                        bool strided = false) {
  const std::string n = name;
  if (!t) return n + ": null tensor";
  if (t->ndim != int(dims.size()))
    return n + ": expected " + std::to_string(dims.size()) + " dims " + shape_text(dims) +
           ", got " + std::to_string(t->ndim);
  if (t->ndim > 0 && !t->shape) return n + ": null shape array";
  int i = 0;
  for (const Dim& d : dims) {
    if (t->shape[i] < 0)
      return n + ": dim " + std::to_string(i) + " is negative (" + std::to_string(t->shape[i]) + ")";
    if (d.size >= 0 && t->shape[i] != d.size)
      return n + ": dim " + std::to_string(i) + " is " + std::to_string(t->shape[i]) +
             ", expected " + d.meaning + " = " + std::to_string(d.size);
    ++i;
  }
  if (!t->data && numel(*t) > 0) return n + ": null data pointer";
  if (!strided && !is_contiguous(*t)) return n + ": must be compact row-major (its strides are not)";
  return {};
}

std::string check_float_storage(const DLTensor* t, const char* name) {
  if (!is_float_storage(t->dtype))
    return std::string(name) + ": dtype " + dtype_name(t->dtype) + " is not f32, f16 or bf16";
  return {};
}
std::string check_dtype(const DLTensor* t, const char* name, DLDataType want) {
  if (!same_dtype(t->dtype, want))
    return std::string(name) + ": dtype " + dtype_name(t->dtype) + ", expected " + dtype_name(want);
  return {};
}

// Always with the id: "cpu:1" vs "cpu:0" must read as different devices.
std::string device_text(DLDevice d) {
  const char* type = d.device_type == kDLCPU ? "cpu" : d.device_type == kDLCUDA ? "cuda" : nullptr;
  return (type ? std::string(type) : "device_type " + std::to_string(int(d.device_type))) + ":" +
         std::to_string(d.device_id);
}

bool same_device(DLDevice a, DLDevice b) {
  return a.device_type == b.device_type && a.device_id == b.device_id;
}

#define SIEVE_TRY(expr)                  \
  do {                                   \
    std::string e_ = (expr);             \
    if (!e_.empty()) return e_;          \
  } while (0)

std::string check_kv(const sieve_attention_args& a) {
  const sieve_paged_kv& kv = *a.kv;
  if (kv.hdr.struct_size < sizeof(sieve_paged_kv))
    return "kv: struct_size " + std::to_string(kv.hdr.struct_size) +
           " is smaller than sieve_paged_kv (" + std::to_string(sizeof(sieve_paged_kv)) + ")";
  if (kv.batch < 1) return "kv.batch: " + std::to_string(kv.batch) + ", expected >= 1";
  if (kv.page_size < 1) return "kv.page_size: " + std::to_string(kv.page_size) + ", expected >= 1";
  if (!kv.indptr_host) return "kv.indptr_host: null (the host mirror of kv.indptr is required)";
  if (!kv.last_page_len_host)
    return "kv.last_page_len_host: null (the host mirror of kv.last_page_len is required)";

  SIEVE_TRY(check_shape(&kv.k_pages, "kv.k_pages",
                        {{-1, "page_capacity"}, {a.n_kv_heads, "n_kv_heads"},
                         {kv.page_size, "kv.page_size"}, {a.head_dim, "head_dim"}},
                        true));
  SIEVE_TRY(check_float_storage(&kv.k_pages, "kv.k_pages"));
  SIEVE_TRY(check_shape(&kv.v_pages, "kv.v_pages",
                        {{kv.k_pages.shape[0], "page_capacity of kv.k_pages"},
                         {a.n_kv_heads, "n_kv_heads"}, {kv.page_size, "kv.page_size"},
                         {a.head_dim, "head_dim"}},
                        true));
  if (!same_dtype(kv.v_pages.dtype, kv.k_pages.dtype))
    return "kv.v_pages: dtype " + dtype_name(kv.v_pages.dtype) + " differs from kv.k_pages (" +
           dtype_name(kv.k_pages.dtype) + ")";
  PageStrides strides;
  SIEVE_TRY(view_page_strides(kv, &strides));

  SIEVE_TRY(check_shape(&kv.indptr, "kv.indptr", {{kv.batch + 1, "batch + 1"}}));
  SIEVE_TRY(check_dtype(&kv.indptr, "kv.indptr", kI32));
  SIEVE_TRY(check_shape(&kv.last_page_len, "kv.last_page_len", {{kv.batch, "batch"}}));
  SIEVE_TRY(check_dtype(&kv.last_page_len, "kv.last_page_len", kI32));
  SIEVE_TRY(check_shape(&kv.indices, "kv.indices", {{-1, "nnz"}}));
  SIEVE_TRY(check_dtype(&kv.indices, "kv.indices", kI32));

  if (kv.indptr_host[0] != 0)
    return "kv.indptr_host[0]: " + std::to_string(kv.indptr_host[0]) + ", expected 0";
  for (int32_t b = 0; b < kv.batch; ++b) {
    const int32_t n = kv_pages(kv, b);
    if (n < 0)
      return "kv.indptr_host: decreases at sequence " + std::to_string(b) + " (" +
             std::to_string(kv.indptr_host[b]) + " then " + std::to_string(kv.indptr_host[b + 1]) +
             ")";
    const int32_t last = kv.last_page_len_host[b];
    if (n > 0 && (last < 1 || last > kv.page_size))
      return "kv.last_page_len_host[" + std::to_string(b) + "]: " + std::to_string(last) +
             ", expected 1.." + std::to_string(kv.page_size) + " (sequence " + std::to_string(b) +
             " has " + std::to_string(n) + " pages)";
  }
  if (kv.indptr_host[kv.batch] > kv.indices.shape[0])
    return "kv.indices: holds " + std::to_string(kv.indices.shape[0]) +
           " page ids but kv.indptr_host[batch] = " + std::to_string(kv.indptr_host[kv.batch]);
  return {};
}

std::string check_queries(const sieve_attention_args& a) {
  const int32_t batch = a.kv->batch;
  if (!a.qo_indptr_host) return "qo_indptr_host: null (the host mirror of qo_indptr is required)";
  SIEVE_TRY(check_shape(a.qo_indptr, "qo_indptr", {{batch + 1, "batch + 1"}}));
  SIEVE_TRY(check_dtype(a.qo_indptr, "qo_indptr", kI32));
  if (a.qo_indptr_host[0] != 0)
    return "qo_indptr_host[0]: " + std::to_string(a.qo_indptr_host[0]) + ", expected 0";
  for (int32_t b = 0; b < batch; ++b) {
    const int32_t n = a.qo_indptr_host[b + 1] - a.qo_indptr_host[b];
    auto seq = [b] { return " for sequence " + std::to_string(b); };  // built only for a message
    if (n < 0) return "qo_indptr_host: decreases" + seq();
    if (a.phase == SIEVE_PHASE_DECODE && n != 1)
      return "qo_indptr_host: " + std::to_string(n) + " query tokens" + seq() +
             ", decode takes exactly 1";
    const int32_t len = kv_len(*a.kv, b);
    if (n > len)
      return "qo_indptr_host: " + std::to_string(n) + " query tokens" + seq() + " but only " +
             std::to_string(len) + " resident keys (the new tokens must be in the KV view)";
  }
  const int64_t tokens = a.qo_indptr_host[batch];

  SIEVE_TRY(check_shape(a.q, "q", {{tokens, "n_q_tokens (qo_indptr_host[batch])"},
                                   {a.n_q_heads, "n_q_heads"}, {a.head_dim, "head_dim"}}));
  SIEVE_TRY(check_float_storage(a.q, "q"));
  SIEVE_TRY(check_shape(a.out, "out", {{tokens, "n_q_tokens (qo_indptr_host[batch])"},
                                       {a.n_q_heads, "n_q_heads"}, {a.head_dim, "head_dim"}}));
  SIEVE_TRY(check_float_storage(a.out, "out"));
  if (tokens > 0 && data_ptr<char>(*a.out) == data_ptr<const char>(*a.q))
    return "out: aliases q (the kernels read q while writing out)";

  if (a.q_rows) {
    SIEVE_TRY(check_shape(a.q_rows, "q_rows", {{-1, "m"}}));
    SIEVE_TRY(check_dtype(a.q_rows, "q_rows", kI32));
    if (a.q_rows->device.device_type == kDLCPU)
      SIEVE_TRY(check_q_rows_contents(a, data_ptr<const int32_t>(*a.q_rows)));
  }
  if (a.lse) {
    SIEVE_TRY(check_shape(a.lse, "lse", {{tokens, "n_q_tokens"}, {a.n_q_heads, "n_q_heads"}}));
    SIEVE_TRY(check_dtype(a.lse, "lse", kF32));
  }
  return {};
}

std::string check_selection(const sieve_attention_args& a) {
  const sieve_selection& s = *a.selection;
  if (s.hdr.struct_size < sizeof(sieve_selection))
    return "selection: struct_size " + std::to_string(s.hdr.struct_size) +
           " is smaller than sieve_selection (" + std::to_string(sizeof(sieve_selection)) + ")";
  if (s.kind == SIEVE_SEL_ALL) return {};  // dense: the other fields are not read
  if (s.kind != SIEVE_SEL_BLOCKS)
    return "selection.kind: " + std::to_string(s.kind) + " is not ALL (0) or BLOCKS (1)";
  if (s.heads > SIEVE_SEL_PER_Q_HEAD)
    return "selection.heads: " + std::to_string(s.heads) +
           " is not PER_SEQUENCE (0), PER_KV_HEAD (1) or PER_Q_HEAD (2)";
  if (s.q_block < 1) return "selection.q_block: " + std::to_string(s.q_block) + ", expected >= 1";
  if (s.k_block_pages < 1)
    return "selection.k_block_pages: " + std::to_string(s.k_block_pages) + ", expected >= 1";
  const int32_t batch = a.kv->batch;
  const int64_t blocks = query_block_offsets(a.qo_indptr_host, batch, s.q_block)[size_t(batch)];
  const int64_t rows = blocks * selection_head_count(s.heads, a.n_q_heads, a.n_kv_heads);
  if (s.n_rows != rows)
    return "selection.n_rows: " + std::to_string(s.n_rows) + ", expected " +
           std::to_string(rows) + " (" + std::to_string(blocks) + " query blocks of q_block " +
           std::to_string(s.q_block) + " x " +
           std::to_string(selection_head_count(s.heads, a.n_q_heads, a.n_kv_heads)) +
           " row heads)";
  // The host sizes indptr for any heads / q_block (attention.h), so it may be longer.
  SIEVE_TRY(check_shape(&s.indptr, "selection.indptr", {{-1, "rows"}}));
  SIEVE_TRY(check_dtype(&s.indptr, "selection.indptr", kI32));
  if (s.indptr.shape[0] < int64_t(s.n_rows) + 1)
    return "selection.indptr: holds " + std::to_string(s.indptr.shape[0]) + " entries, n_rows + 1 = " +
           std::to_string(int64_t(s.n_rows) + 1) + " needed";
  SIEVE_TRY(check_shape(&s.indices, "selection.indices", {{-1, "capacity"}}));
  SIEVE_TRY(check_dtype(&s.indices, "selection.indices", kI32));
  if (s.capacity < 0 || s.capacity > s.indices.shape[0])
    return "selection.capacity: " + std::to_string(s.capacity) + " is outside 0.." +
           std::to_string(s.indices.shape[0]) + " (the length of selection.indices)";
  return {};
}

// The variant's structure (attention.h): row geometry, tensor shapes and dtypes, and what it
// cannot be combined with. Contents: check_variant_contents.
std::string check_variant(const sieve_attention_args& a) {
  const sieve_attention_variant& v = *attention_variant(a);
  if (v.hdr.struct_size < sizeof(sieve_attention_variant))
    return "variant: struct_size " + std::to_string(v.hdr.struct_size) +
           " is smaller than sieve_attention_variant (" + std::to_string(sizeof(sieve_attention_variant)) + ")";
  if (a.selection && a.selection->kind != SIEVE_SEL_ALL)
    return "variant: the variant's spans replace the selection, which must be NULL or ALL (kind " +
           std::to_string(a.selection->kind) + ")";
  if (a.q_rows) return "variant: q_rows must be NULL with a variant (every query row is computed)";
  if (a.stats != SIEVE_STATS_NONE) return "variant: stats must be NONE with a variant";
  if (v.heads > SIEVE_SEL_PER_Q_HEAD)
    return "variant.heads: " + std::to_string(v.heads) + " is not PER_SEQUENCE (0), PER_KV_HEAD (1) or PER_Q_HEAD (2)";
  if (v.q_block < 1) return "variant.q_block: " + std::to_string(v.q_block) + ", expected >= 1";
  if (v.flags & ~uint32_t(SIEVE_VARIANT_F32_WEIGHTS))
    return "variant.flags: " + std::to_string(v.flags) + " has bits that are not sieve_variant_flags";
  const int32_t batch = a.kv->batch;
  const int32_t H = selection_head_count(v.heads, a.n_q_heads, a.n_kv_heads);
  const int64_t rows = query_block_offsets(a.qo_indptr_host, batch, v.q_block)[size_t(batch)] * H;
  if (v.n_rows != rows)
    return "variant.n_rows: " + std::to_string(v.n_rows) + ", expected " + std::to_string(rows) +
           " (query blocks of q_block " + std::to_string(v.q_block) + " x " + std::to_string(H) + " row heads)";
  SIEVE_TRY(check_shape(&v.row_spans, "variant.row_spans", {{v.n_rows, "n_rows"}, {2, "begin, end"}}));
  SIEVE_TRY(check_dtype(&v.row_spans, "variant.row_spans", kI32));
  SIEVE_TRY(check_shape(&v.spans, "variant.spans", {{-1, "n_spans"}, {3, "kind, begin, end"}}));
  SIEVE_TRY(check_dtype(&v.spans, "variant.spans", kI32));
  SIEVE_TRY(check_shape(&v.packed_pos, "variant.packed_pos", {{-1, "n_packed"}}));
  SIEVE_TRY(check_dtype(&v.packed_pos, "variant.packed_pos", kI32));
  const int64_t n_packed = v.packed_pos.shape[0];
  if (v.packed_count.data) {
    SIEVE_TRY(check_shape(&v.packed_count, "variant.packed_count", {{n_packed, "n_packed"}}));
    SIEVE_TRY(check_dtype(&v.packed_count, "variant.packed_count", kI32));
  }
  if (v.packed_bias.data) {
    SIEVE_TRY(check_shape(&v.packed_bias, "variant.packed_bias", {{n_packed, "n_packed"}}));
    SIEVE_TRY(check_dtype(&v.packed_bias, "variant.packed_bias", kF32));
  }
  return {};
}

std::string check_stats(const sieve_attention_args& a) {
  if (a.stats == SIEVE_STATS_NONE) return {};
  if (a.stats != SIEVE_STATS_PAGE_MASS_PER_KV_HEAD && a.stats != SIEVE_STATS_PAGE_MASS_ALL_HEADS)
    return "stats: " + std::to_string(a.stats) +
           " is not NONE (0), PAGE_MASS_PER_KV_HEAD (1) or PAGE_MASS_ALL_HEADS (2)";
  const int64_t h = a.stats == SIEVE_STATS_PAGE_MASS_PER_KV_HEAD ? a.n_kv_heads : 1;
  if (!a.page_mass) return "page_mass: null tensor, but stats asks for page statistics";
  SIEVE_TRY(check_shape(a.page_mass, "page_mass",
                        {{a.kv->indptr_host[a.kv->batch], "nnz pages of the view"},
                         {h, a.stats == SIEVE_STATS_PAGE_MASS_PER_KV_HEAD
                                 ? "n_kv_heads (PAGE_MASS_PER_KV_HEAD)"
                                 : "1 column (PAGE_MASS_ALL_HEADS)"}}));
  SIEVE_TRY(check_dtype(a.page_mass, "page_mass", kF32));
  return {};
}

std::string check_devices(const sieve_attention_args& a) {
  const DLDevice dev = a.q->device;
  auto on = [&](const DLTensor* t, const char* name) -> std::string {
    if (t && !same_device(t->device, dev))
      return std::string(name) + ": on " + device_text(t->device) + " but q is on " +
             device_text(dev) + " (every tensor must be on the attention device)";
    return {};
  };
  SIEVE_TRY(on(a.out, "out"));
  SIEVE_TRY(on(a.qo_indptr, "qo_indptr"));
  SIEVE_TRY(on(&a.kv->k_pages, "kv.k_pages"));
  SIEVE_TRY(on(&a.kv->v_pages, "kv.v_pages"));
  SIEVE_TRY(on(&a.kv->indptr, "kv.indptr"));
  SIEVE_TRY(on(&a.kv->indices, "kv.indices"));
  SIEVE_TRY(on(&a.kv->last_page_len, "kv.last_page_len"));
  if (a.selection && a.selection->kind == SIEVE_SEL_BLOCKS) {
    SIEVE_TRY(on(&a.selection->indptr, "selection.indptr"));
    SIEVE_TRY(on(&a.selection->indices, "selection.indices"));
  }
  SIEVE_TRY(on(a.q_rows, "q_rows"));
  SIEVE_TRY(on(a.lse, "lse"));
  if (const sieve_attention_variant* v = attention_variant(a)) {
    SIEVE_TRY(on(&v->row_spans, "variant.row_spans"));
    SIEVE_TRY(on(&v->spans, "variant.spans"));
    SIEVE_TRY(on(&v->packed_pos, "variant.packed_pos"));
    if (v->packed_count.data) SIEVE_TRY(on(&v->packed_count, "variant.packed_count"));
    if (v->packed_bias.data) SIEVE_TRY(on(&v->packed_bias, "variant.packed_bias"));
  }
  if (a.stats != SIEVE_STATS_NONE) SIEVE_TRY(on(a.page_mass, "page_mass"));
  return {};
}

}  // namespace

std::string check_attention_args(const sieve_attention_args& a) {
  // A 1.0 producer's args end before `variant` (ABI 1.1): the same call without a variant.
  constexpr size_t v1_0_size = offsetof(sieve_attention_args, variant);
  if (a.hdr.struct_size < v1_0_size)
    return "args: struct_size " + std::to_string(a.hdr.struct_size) +
           " is smaller than sieve_attention_args of ABI 1.0 (" + std::to_string(v1_0_size) + ")";
  if (a.phase != SIEVE_PHASE_PREFILL && a.phase != SIEVE_PHASE_DECODE)
    return "phase: " + std::to_string(a.phase) + " is not PREFILL (1) or DECODE (2)";
  if (a.n_q_heads < 1) return "n_q_heads: " + std::to_string(a.n_q_heads) + ", expected >= 1";
  if (a.n_kv_heads < 1) return "n_kv_heads: " + std::to_string(a.n_kv_heads) + ", expected >= 1";
  if (a.head_dim < 1) return "head_dim: " + std::to_string(a.head_dim) + ", expected >= 1";
  if (a.n_q_heads % a.n_kv_heads != 0)
    return "n_kv_heads: " + std::to_string(a.n_kv_heads) + " does not divide n_q_heads = " +
           std::to_string(a.n_q_heads);
  if (!std::isfinite(a.scale)) return "scale: not finite";
  if (!a.kv) return "kv: null";
  if (!a.q) return "q: null tensor";
  if (!a.out) return "out: null tensor";
  if (!a.qo_indptr) return "qo_indptr: null tensor";
  SIEVE_TRY(check_kv(a));
  SIEVE_TRY(check_queries(a));
  if (a.selection) SIEVE_TRY(check_selection(a));
  SIEVE_TRY(check_stats(a));
  if (attention_variant(a)) SIEVE_TRY(check_variant(a));
  return check_devices(a);
}

std::string unsupported_attention_request(const sieve_attention_args& a) {
  if (a.stats != SIEVE_STATS_NONE && a.phase == SIEVE_PHASE_PREFILL)
    return "stats: page statistics are computed for decode only in ABI v1 (prefill asked for them)";
  return {};
}

std::string check_page_table_contents(const sieve_attention_args& a, const int32_t* kv_indices) {
  const sieve_paged_kv& kv = *a.kv;
  const int64_t cap = kv.k_pages.shape[0];
  for (int32_t b = 0; b < kv.batch; ++b) {
    for (int32_t i = kv.indptr_host[b]; i < kv.indptr_host[b + 1]; ++i) {
      const int32_t id = kv_indices[i];
      if (id < 0 || id >= cap)
        return "kv.indices[" + std::to_string(i) + "]: physical page " + std::to_string(id) +
               " (sequence " + std::to_string(b) + ", logical page " +
               std::to_string(i - kv.indptr_host[b]) + ") is outside the pool [0, " +
               std::to_string(cap) + ")";
    }
  }
  return {};
}

std::string check_selection_contents(const sieve_attention_args& a, const int32_t* sel_indptr,
                                     const int32_t* sel_indices) {
  const sieve_selection& s = *a.selection;
  if (s.kind != SIEVE_SEL_BLOCKS) return {};
  if (sel_indptr[0] != 0)
    return "selection.indptr[0]: " + std::to_string(sel_indptr[0]) + ", expected 0";
  for (int32_t r = 0; r < s.n_rows; ++r)
    if (sel_indptr[r + 1] < sel_indptr[r])
      return "selection.indptr: decreases at row " + std::to_string(r) + " (" +
             std::to_string(sel_indptr[r]) + " then " + std::to_string(sel_indptr[r + 1]) + ")";
  if (sel_indptr[s.n_rows] > s.capacity)
    return "selection.indptr[n_rows]: " + std::to_string(sel_indptr[s.n_rows]) +
           " entries exceed selection.capacity " + std::to_string(s.capacity);

  const int32_t H = selection_head_count(s.heads, a.n_q_heads, a.n_kv_heads);
  int64_t c_b = 0;
  for (int32_t b = 0; b < a.kv->batch; ++b) {
    const int32_t n_q = a.qo_indptr_host[b + 1] - a.qo_indptr_host[b];
    const int32_t n_blocks = key_blocks(kv_pages(*a.kv, b), s.k_block_pages);
    const int32_t n_qb = query_blocks(n_q, s.q_block);
    for (int32_t t = 0; t < n_qb; ++t) {
      for (int32_t h = 0; h < H; ++h) {
        const int64_t r = selection_row(c_b, t, H, h);
        auto where = [&] {
          return "selection row " + std::to_string(r) + " (sequence " + std::to_string(b) +
                 ", query block " + std::to_string(t) + ", head " + std::to_string(h) + ")";
        };
        int32_t prev = -1;
        for (int32_t e = sel_indptr[r]; e < sel_indptr[r + 1]; ++e) {
          const int32_t j = sel_indices[e];
          if (j < 0 || j >= n_blocks)
            return where() + ": key block " + std::to_string(j) + " at selection.indices[" +
                   std::to_string(e) + "] is outside [0, " + std::to_string(n_blocks) +
                   ") (the sequence has " + std::to_string(kv_pages(*a.kv, b)) + " pages)";
          if (j <= prev)
            return where() + ": key blocks not strictly increasing at selection.indices[" +
                   std::to_string(e) + "] (" + std::to_string(j) + " after " +
                   std::to_string(prev) + ")";
          prev = j;
        }
      }
    }
    c_b += n_qb;
  }
  return {};
}

std::string check_variant_contents(const sieve_attention_args& a, const int32_t* row_spans,
                                   const int32_t* spans, const int32_t* packed_pos,
                                   const int32_t* packed_count) {
  const sieve_attention_variant& v = *attention_variant(a);
  const int64_t n_spans = v.spans.shape[0], n_packed = v.packed_pos.shape[0];
  const int32_t H = selection_head_count(v.heads, a.n_q_heads, a.n_kv_heads);
  int64_t c_b = 0;
  for (int32_t b = 0; b < a.kv->batch; ++b) {
    const int32_t n_qb = query_blocks(a.qo_indptr_host[b + 1] - a.qo_indptr_host[b], v.q_block);
    const int32_t len = kv_len(*a.kv, b);
    for (int64_t r = c_b * H; r < (c_b + n_qb) * H; ++r) {
      const int32_t s0 = row_spans[2 * r], s1 = row_spans[2 * r + 1];
      auto where = [&] { return "variant row " + std::to_string(r) + " (sequence " + std::to_string(b) + ")"; };
      if (s0 < 0 || s1 < s0 || s1 > n_spans)
        return where() + ": spans [" + std::to_string(s0) + ", " + std::to_string(s1) + ") are not inside [0, " +
               std::to_string(n_spans) + ")";
      for (int32_t i = s0; i < s1; ++i) {
        const int32_t kind = spans[3 * i], begin = spans[3 * i + 1], end = spans[3 * i + 2];
        const std::string span = "variant.spans[" + std::to_string(i) + "] = {" + std::to_string(kind) + ", " +
                                 std::to_string(begin) + ", " + std::to_string(end) + "}";
        if (kind != SIEVE_SPAN_KEYS && kind != SIEVE_SPAN_PACKED)
          return where() + ": " + span + " has a kind that is not KEYS (0) or PACKED (1)";
        if (begin < 0 || end < begin || (kind == SIEVE_SPAN_PACKED && end > n_packed))
          return where() + ": " + span + " is not a range inside [0, " +
                 (kind == SIEVE_SPAN_PACKED ? std::to_string(n_packed) + ") (packed keys)" : std::string("inf)"));
        if (kind != SIEVE_SPAN_PACKED) continue;
        for (int32_t e = begin; e < end; ++e) {
          if (packed_pos[e] < 0 || packed_pos[e] >= len)
            return where() + ": variant.packed_pos[" + std::to_string(e) + "] = " + std::to_string(packed_pos[e]) +
                   " is outside the sequence's " + std::to_string(len) + " keys";
          if (packed_count && packed_count[e] < 1)
            return where() + ": variant.packed_count[" + std::to_string(e) + "] = " + std::to_string(packed_count[e]) +
                   ", expected >= 1";
        }
      }
    }
    c_b += n_qb;
  }
  return {};
}

std::string check_q_rows_contents(const sieve_attention_args& a, const int32_t* q_rows) {
  const int64_t m = a.q_rows->shape[0];
  const int32_t tokens = a.qo_indptr_host[a.kv->batch];
  for (int64_t i = 0; i < m; ++i)
    if (q_rows[i] < 0 || q_rows[i] >= tokens)
      return "q_rows[" + std::to_string(i) + "]: query token " + std::to_string(q_rows[i]) +
             " is outside [0, " + std::to_string(tokens) + ")";
  return {};
}

AttentionShape attention_shape(const sieve_attention_args& a) {
  AttentionShape s;
  s.batch = a.kv->batch;
  s.n_q_tokens = a.qo_indptr_host[s.batch];
  s.hq = a.n_q_heads;
  s.hkv = a.n_kv_heads;
  s.d = a.head_dim;
  s.page_size = a.kv->page_size;
  s.group = s.hq / s.hkv;
  s.page_capacity = a.kv->k_pages.shape[0];
  view_page_strides(*a.kv, &s.pages);  // checked by check_attention_args
  s.nnz_pages = a.kv->indptr_host[s.batch];
  s.scale = a.scale != 0.f ? a.scale : 1.f / std::sqrt(float(s.d));
  s.prefill = a.phase == SIEVE_PHASE_PREFILL;
  s.dense = !a.selection || a.selection->kind == SIEVE_SEL_ALL;
  if (!s.dense) {
    s.sel_heads = a.selection->heads;
    s.sel_h = selection_head_count(s.sel_heads, s.hq, s.hkv);
    s.q_block = a.selection->q_block;
    s.k_block_pages = a.selection->k_block_pages;
    s.n_rows = a.selection->n_rows;
  }
  if (const sieve_attention_variant* v = attention_variant(a)) {
    s.variant = true;
    s.var_heads = v->heads;
    s.var_h = selection_head_count(v->heads, s.hq, s.hkv);
    s.var_q_block = v->q_block;
    s.var_rows = v->n_rows;
    s.var_flags = v->flags;
  }
  s.q_rows = a.q_rows ? a.q_rows->shape[0] : -1;
  s.stats = a.stats;
  s.stats_h = a.stats == SIEVE_STATS_PAGE_MASS_PER_KV_HEAD ? s.hkv
              : a.stats == SIEVE_STATS_PAGE_MASS_ALL_HEADS ? 1
                                                           : 0;
  return s;
}

void query_block_offsets(const int32_t* qo_indptr_host, int32_t batch, int32_t q_block,
                         int64_t* out) {
  out[0] = 0;
  for (int32_t b = 0; b < batch; ++b)
    out[b + 1] = out[b] + query_blocks(qo_indptr_host[b + 1] - qo_indptr_host[b], q_block);
}

std::vector<int64_t> query_block_offsets(const int32_t* qo_indptr_host, int32_t batch,
                                         int32_t q_block) {
  std::vector<int64_t> c(size_t(batch) + 1);
  query_block_offsets(qo_indptr_host, batch, q_block, c.data());
  return c;
}

}  // namespace sieve::kernels
