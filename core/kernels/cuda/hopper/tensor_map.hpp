// The TMA tensor maps of the Hopper prefill kernel. One paged K or V pool: a 4-D view (head_dim, token, KV head, physical
// page) over any of the pool layouts (compact HND, NHD, combined: sieve/util/page_layout.hpp),
// whose box is 64 head_dim elements (128 bytes, the 128-byte swizzle's row) x `box_rows` tokens of
// one (page, KV head). The prefill kernel loads a page's half of head_dim per TMA instruction.
// Host-only; the driver's cuTensorMapEncodeTiled is reached through the runtime's entry-point
// query, so nothing links libcuda directly. Internal to core/kernels/cuda.
#pragma once
#include <cuda.h>

#include <cstdint>
#include <string>

#include "sieve/util/dtype_dispatch.hpp"
#include "sieve/util/page_layout.hpp"

namespace sieve::kernels::cuda::sm90 {

struct PagedPoolView {
  const void* base = nullptr;  // element 0 of the pool (K or V)
  Storage dt = Storage::bf16;  // f16 or bf16
  int64_t head_dim = 0, page_size = 0, n_kv_heads = 0, n_pages = 0;
  PageStrides strides;  // in elements
};

// Query rows [n_tokens][n_heads][head_dim], compact: a 3-D view (head_dim, head, token) whose box is
// 64 head_dim elements x box_heads heads x box_tokens tokens, 128-byte swizzled (row = token *
// box_heads + head in shared memory). Coordinates past the tensor read as zeros.
struct QueryRowsView {
  const void* base = nullptr;
  Storage dt = Storage::bf16;  // f16 or bf16
  int64_t n_tokens = 0, n_heads = 0, head_dim = 0;
};
std::string encode_query_tensor_map(const QueryRowsView& q, int32_t box_heads, int32_t box_tokens, CUtensorMap* map);

// "" and *map filled, or why this pool cannot be read through TMA (one line: alignment, a stride
// that is not a multiple of 16 bytes, head_dim not a multiple of 64, a box too tall, f32, or the
// driver's refusal).
std::string encode_paged_tensor_map(const PagedPoolView& pool, int32_t box_rows, CUtensorMap* map);

}  // namespace sieve::kernels::cuda::sm90
