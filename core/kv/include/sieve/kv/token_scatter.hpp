// Writing appended tokens into a page pool: what every store's append does once it knows where
// each token goes. The pool may be strided (an engine's NHD or combined pages), so the
// destination is described by its strides, not assumed compact.
#pragma once
#include <cstdint>
#include <vector>

#include <dlpack/dlpack.h>

namespace sieve::kv {

// Where one appended token goes: row `src` of the append's k/v lands in `page`, slot `offset`.
struct TokenSlot {
  int32_t src;
  int32_t page;
  int32_t offset;
};

// One page pool seen as [pages, n_kv_heads, page_size, head_dim] with these strides in elements
// (head_dim is unit-stride). `base` already includes the tensor's byte_offset.
struct PoolTarget {
  void* base = nullptr;
  int64_t page = 0, head = 0, slot = 0;
};

// The strides of a compact HND pool (the core stores).
inline PoolTarget compact_hnd(void* base, int32_t n_kv_heads, int32_t page_size, int32_t head_dim) {
  const int64_t slot = head_dim, head = int64_t(page_size) * head_dim;
  return {base, head * n_kv_heads, head, slot};
}

// Host memory: row ts.src of `src` ([n, n_kv_heads, head_dim], unit-stride along head_dim, any
// float dtype) goes to (ts.page, h, ts.offset) of `dst`, converted to `dst_dtype` (same dtype:
// the bits are copied).
void scatter_tokens_cpu(const std::vector<TokenSlot>& slots, const DLTensor& src, const PoolTarget& dst,
                        DLDataType dst_dtype, int32_t n_kv_heads, int32_t head_dim);

}  // namespace sieve::kv
