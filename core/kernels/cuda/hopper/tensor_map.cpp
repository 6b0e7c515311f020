// cuTensorMapEncodeTiled over a paged pool or the query rows (tensor_map.hpp says what the maps look like).
#include "tensor_map.hpp"

#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

namespace sieve::kernels::cuda::sm90 {
namespace {

// The driver entry point, looked up once (the runtime loads the driver anyway).
PFN_cuTensorMapEncodeTiled_v12000 encode_fn(std::string& why) {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  if (!fn) why = "the CUDA driver has no cuTensorMapEncodeTiled (driver older than CUDA 12)";
  return fn;
}

CUtensorMapDataType tma_type(Storage dt) {
  return dt == Storage::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

}  // namespace

std::string encode_query_tensor_map(const QueryRowsView& q, int32_t box_heads, int32_t box_tokens, CUtensorMap* map) {
  if (q.dt == Storage::f32) return "TMA prefill reads 16-bit queries only; q is f32";
  if (q.head_dim % 64 != 0) return "TMA prefill needs head_dim a multiple of 64, got " + std::to_string(q.head_dim);
  if (box_heads < 1 || box_heads > 256 || box_tokens < 1 || box_tokens > 256)
    return "TMA query box of " + std::to_string(box_heads) + " heads x " + std::to_string(box_tokens) +
           " tokens is outside 1..256";
  if (reinterpret_cast<uintptr_t>(q.base) % 16 != 0) return "q is not 16-byte aligned";
  if (q.n_tokens < 1 || q.n_heads < 1) return "q has no rows";
  std::string why;
  const auto fn = encode_fn(why);
  if (!fn) return why;
  constexpr int64_t kEs = 2;
  const cuuint64_t dims[3] = {cuuint64_t(q.head_dim), cuuint64_t(q.n_heads), cuuint64_t(q.n_tokens)};
  const cuuint64_t byte_strides[2] = {cuuint64_t(q.head_dim * kEs), cuuint64_t(q.n_heads * q.head_dim * kEs)};
  const cuuint32_t box[3] = {64, cuuint32_t(box_heads), cuuint32_t(box_tokens)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = fn(map, tma_type(q.dt), 3, const_cast<void*>(q.base), dims, byte_strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return "cuTensorMapEncodeTiled refused the query view (CUresult " + std::to_string(int(r)) + ")";
  return {};
}

std::string encode_paged_tensor_map(const PagedPoolView& pool, int32_t box_rows, CUtensorMap* map) {
  if (pool.dt == Storage::f32) return "TMA prefill reads 16-bit K/V only; the pool is f32";
  constexpr int64_t kEs = 2;
  if (pool.head_dim % 64 != 0) return "TMA prefill needs head_dim a multiple of 64, got " + std::to_string(pool.head_dim);
  if (box_rows < 1 || box_rows > 256 || box_rows > pool.page_size)
    return "TMA box of " + std::to_string(box_rows) + " tokens does not fit 1..min(256, page_size " +
           std::to_string(pool.page_size) + ")";
  if (reinterpret_cast<uintptr_t>(pool.base) % 16 != 0) return "the K/V pool is not 16-byte aligned";
  const int64_t strides[3] = {pool.strides.token, pool.strides.head, pool.strides.page};
  for (const int64_t s : strides)
    if (s <= 0 || (s * kEs) % 16 != 0 || s * kEs >= (int64_t(1) << 40))
      return "a K/V pool stride of " + std::to_string(s) + " elements is not a positive multiple of 16 bytes";
  std::string why;
  const auto fn = encode_fn(why);
  if (!fn) return why;
  const cuuint64_t dims[4] = {cuuint64_t(pool.head_dim), cuuint64_t(pool.page_size), cuuint64_t(pool.n_kv_heads),
                              cuuint64_t(pool.n_pages)};
  const cuuint64_t byte_strides[3] = {cuuint64_t(strides[0] * kEs), cuuint64_t(strides[1] * kEs),
                                      cuuint64_t(strides[2] * kEs)};
  const cuuint32_t box[4] = {64, cuuint32_t(box_rows), 1, 1};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = fn(map, tma_type(pool.dt), 4, const_cast<void*>(pool.base), dims, byte_strides, box, elem_strides,
                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) return "cuTensorMapEncodeTiled refused the K/V pool view (CUresult " + std::to_string(int(r)) + ")";
  return {};
}

}  // namespace sieve::kernels::cuda::sm90
