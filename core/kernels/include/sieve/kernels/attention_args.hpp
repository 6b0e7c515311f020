// Host-side checks and geometry of a sieve_attention_args call, shared by the CPU and the CUDA
// kernels (and by whoever validates a plugin's output before it reaches a kernel).
//
// Host-only and nearly dependency-free on purpose: it includes the ABI, the standard library and
// sieve/util/page_layout.hpp only, so a .cu file can include it; the small constexpr helpers (selection_row, ...) can be called from
// device code with nvcc's --expt-relaxed-constexpr.
//
// Semantics are those of api/sieve/attention.h; the checks below are what every kernel relies on.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "sieve/attention.h"
#include "sieve/util/page_layout.hpp"

namespace sieve::kernels {

// ---- Building a call -------------------------------------------------------------------------

// Dense attention of q over kv into out: the fields every call sets (selection, q_rows and
// statistics left empty for the caller to add).
inline sieve_attention_args make_attention_args(uint32_t phase, int32_t n_q_heads, int32_t n_kv_heads,
                                                int32_t head_dim, const DLTensor* q, DLTensor* out,
                                                const DLTensor* qo_indptr, const int32_t* qo_indptr_host,
                                                const sieve_paged_kv* kv) {
  sieve_attention_args a{};
  a.hdr = {uint32_t(sizeof(sieve_attention_args)), SIEVE_ABI_MINOR};
  a.phase = phase;
  a.n_q_heads = n_q_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim;
  a.q = q;
  a.out = out;
  a.qo_indptr = qo_indptr;
  a.qo_indptr_host = qo_indptr_host;
  a.kv = kv;
  return a;
}

// The call's variant (ABI 1.1), or nullptr: absent, or a 1.0 producer's args that end before it.
inline const sieve_attention_variant* attention_variant(const sieve_attention_args& a) {
  return SIEVE_HAS_FIELD(&a, sieve_attention_args, variant) ? a.variant : nullptr;
}

// ---- Argument checks -------------------------------------------------------------------------

// Every check that needs no device memory: null tensors, ranks, shapes against n_q_heads /
// n_kv_heads / head_dim / page_size, dtypes (q, out, pages: f32/f16/bf16; index tensors int32;
// lse, page_mass f32), compact row-major layout but for the K/V pages, whose strides and
// byte_offset (one layout for both) pass page_strides (sieve/util/page_layout.hpp), Hq % Hkv ==
// 0, the host mirrors (qo_indptr_host, kv->indptr_host, kv->last_page_len_host), the selection's structure (kind, heads, q_block,
// k_block_pages, n_rows against the query blocks, indptr/indices shapes, capacity), stats / lse /
// page_mass shapes, q_rows (dtype, and range when it lives on the host), and that every tensor
// lives on q's device. Returns "" when the arguments are well formed, else ONE line that starts
// with the argument's name ("kv.k_pages: dim 1 is 4, expected n_kv_heads = 2").
std::string check_attention_args(const sieve_attention_args& a);

// For well-formed arguments: why this valid request is outside what the v1 kernels do (caller
// returns SIEVE_ERR_UNSUPPORTED), or "". v1: page statistics are decode-only.
std::string unsupported_attention_request(const sieve_attention_args& a);

// Contents checks over host copies of device arrays (the CPU kernel passes the tensors' own
// memory; a CUDA caller that wants them copies first). Each returns "" or one line naming the
// offending entry. `a` must pass check_attention_args.
//   page table: every physical page id of kv->indices in [0, page_capacity).
std::string check_page_table_contents(const sieve_attention_args& a, const int32_t* kv_indices);
//   selection (kind BLOCKS): indptr[0] == 0, non-decreasing, indptr[n_rows] <= capacity; each
//   row's key blocks strictly increasing and < the key-block count of the row's sequence.
std::string check_selection_contents(const sieve_attention_args& a, const int32_t* sel_indptr,
                                     const int32_t* sel_indices);
//   variant (attention.h): each row's span range inside the spans, each span's kind and range,
//   each packed key's position inside its row's sequence and count >= 1 (packed_count may be null).
std::string check_variant_contents(const sieve_attention_args& a, const int32_t* row_spans,
                                   const int32_t* spans, const int32_t* packed_pos,
                                   const int32_t* packed_count);
//   q_rows: every entry in [0, n_q_tokens).
std::string check_q_rows_contents(const sieve_attention_args& a, const int32_t* q_rows);

// ---- Geometry ---------------------------------------------------------------------------------

// The numbers a kernel sizes its work with, derived from arguments that passed
// check_attention_args.
struct AttentionShape {
  int32_t batch = 0;          // sequences (kv->batch)
  int32_t n_q_tokens = 0;     // qo_indptr_host[batch]
  int32_t hq = 0;             // query heads
  int32_t hkv = 0;            // KV heads
  int32_t d = 0;              // head dim
  int32_t page_size = 0;      // tokens per page
  int32_t group = 0;          // hq / hkv: query heads per KV head
  int64_t page_capacity = 0;  // pages in the pool (k_pages dim 0)
  PageStrides pages;          // element strides of K and V (their layout: HND, NHD, combined)
  int64_t nnz_pages = 0;      // pages of the view (kv->indptr_host[batch])
  float scale = 0.f;          // resolved logit scale (args.scale, or 1/sqrt(d) when 0)
  bool prefill = false;       // causal prefill (else decode)
  bool dense = true;          // selection NULL or kind ALL
  uint32_t sel_heads = 0;     // sieve_selection_heads (meaningful when !dense)
  int32_t sel_h = 0;          // H of the selection rows: 1, hkv or hq (0 when dense)
  int32_t q_block = 1;        // query tokens per selection row block (1 when dense)
  int32_t k_block_pages = 1;  // pages per key block (1 when dense)
  int32_t n_rows = 0;         // selection rows (0 when dense)
  int64_t q_rows = -1;        // entries of q_rows, -1 when every row is computed
  bool variant = false;       // a sieve_attention_variant replaces the key list
  uint32_t var_heads = 0;     // its rows' sieve_selection_heads
  int32_t var_h = 0;          // H of its rows: 1, hkv or hq
  int32_t var_q_block = 1;    // query tokens per row block
  int32_t var_rows = 0;
  uint32_t var_flags = 0;     // sieve_variant_flags
  uint32_t stats = SIEVE_STATS_NONE;
  int32_t stats_h = 0;        // page_mass columns: hkv (PER_KV_HEAD), 1 (ALL_HEADS), 0 (NONE)
};
AttentionShape attention_shape(const sieve_attention_args& a);

// ---- Per-sequence and selection-row helpers ---------------------------------------------------

// Pages / resident tokens of sequence b of a view (host mirrors). A sequence with no page has
// kv_len 0 and its last_page_len is ignored.
inline int32_t kv_pages(const sieve_paged_kv& kv, int32_t b) {
  return kv.indptr_host[b + 1] - kv.indptr_host[b];
}
inline int32_t kv_len(const sieve_paged_kv& kv, int32_t b) {
  int32_t n = kv_pages(kv, b);
  return n == 0 ? 0 : (n - 1) * kv.page_size + kv.last_page_len_host[b];
}

constexpr int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }
// Key block j of a sequence covers logical pages [j*k_block_pages, (j+1)*k_block_pages), clipped.
constexpr int32_t key_blocks(int32_t n_pages, int32_t k_block_pages) {
  return ceil_div(n_pages, k_block_pages);
}
constexpr int32_t query_blocks(int32_t n_q, int32_t q_block) { return ceil_div(n_q, q_block); }

// H of the selection rows for `heads` (sieve_selection_heads): 1, n_kv_heads or n_q_heads.
constexpr int32_t selection_head_count(uint32_t heads, int32_t hq, int32_t hkv) {
  return heads == SIEVE_SEL_PER_SEQUENCE ? 1 : heads == SIEVE_SEL_PER_KV_HEAD ? hkv : hq;
}
// Which row head query head `q_head` reads: 0, its KV head q_head / group, or q_head itself.
constexpr int32_t selection_head(uint32_t heads, int32_t q_head, int32_t group) {
  return heads == SIEVE_SEL_PER_SEQUENCE ? 0 : heads == SIEVE_SEL_PER_KV_HEAD ? q_head / group
                                                                              : q_head;
}
// Row of (sequence b, query block t, row head h): (C_b + t) * H + h, with C_b the query blocks of
// the sequences before b (query_block_offsets).
constexpr int64_t selection_row(int64_t c_b, int32_t t, int32_t H, int32_t h) {
  return (c_b + t) * H + h;
}
// C_b for b = 0..batch (C_batch = total query blocks, so n_rows = C_batch * H), written to
// out[0..batch]; the vector form allocates.
void query_block_offsets(const int32_t* qo_indptr_host, int32_t batch, int32_t q_block,
                         int64_t* out);
std::vector<int64_t> query_block_offsets(const int32_t* qo_indptr_host, int32_t batch,
                                         int32_t q_block);

}  // namespace sieve::kernels
