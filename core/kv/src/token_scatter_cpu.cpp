// Appended tokens into a (possibly strided) host page pool.
#include <cstring>

#include "sieve/kv/token_scatter.hpp"
#include "sieve/util/tensor.hpp"

namespace sieve::kv {

void scatter_tokens_cpu(const std::vector<TokenSlot>& slots, const DLTensor& src, const PoolTarget& dst,
                        DLDataType dst_dtype, int32_t n_kv_heads, int32_t head_dim) {
  const char* in = data_ptr<const char>(src);
  char* out = static_cast<char*>(dst.base);
  const int64_t s0 = stride(src, 0), s1 = stride(src, 1);
  const size_t in_bytes = dtype_bytes(src.dtype), out_bytes = dtype_bytes(dst_dtype);
  const bool same = same_dtype(src.dtype, dst_dtype);
  for (const TokenSlot& ts : slots) {
    for (int32_t h = 0; h < n_kv_heads; ++h) {
      const int64_t src_off = ts.src * s0 + h * s1;
      const int64_t dst_off = ts.page * dst.page + h * dst.head + ts.offset * dst.slot;
      if (same) {
        std::memcpy(out + dst_off * out_bytes, in + src_off * in_bytes, size_t(head_dim) * out_bytes);
      } else {
        for (int32_t d = 0; d < head_dim; ++d)
          store_float(out, dst_dtype, dst_off + d, load_float(in, src.dtype, src_off + d));
      }
    }
  }
}

}  // namespace sieve::kv
