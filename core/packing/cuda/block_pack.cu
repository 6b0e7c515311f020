// launch_block_pack (block_pack_cuda.hpp): a warp per (key block, KV head) walks the block's keys
// in order (each decision depends on the current anchor). Lane l holds dimensions l, l + 32, ...
// of the key in registers (coalesced loads; the next key is loaded while this one is decided),
// accumulates the four sums of key_sums with fmaf in that order, and the xor butterfly gives
// every lane the same sums, so delta_keeps decides identically in all lanes and on the host.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "sieve/packing/block_pack_cuda.hpp"
#include "sieve/packing/keep_rule.hpp"
#include "sieve/util/storage_cuda.cuh"

namespace sieve::packing {
namespace {

constexpr int kWarps = 4;
constexpr int kPer = kBlockPackMaxD / kLanes;  // dimensions per lane

__device__ __forceinline__ void load_key(const BlockPackLaunch& a, int32_t kvh, int64_t pos,
                                         int lane, float (&x)[kPer]) {
  const int64_t off = a.k_strides.row(a.pages[pos / a.page_size], kvh, pos % a.page_size);
#pragma unroll
  for (int m = 0; m < kPer; ++m) {
    const int32_t i = lane + kLanes * m;
    x[m] = i < a.d ? load_storage(a.k_pages, a.kv_dtype, off + i) : 0.f;
  }
}

// The butterfly of keep_rule.hpp's butterfly32: after step o, lane l holds p[l] + p[l ^ o].
__device__ __forceinline__ float butterfly(float v) {
#pragma unroll
  for (int o = kLanes / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__global__ void __launch_bounds__(kWarps * 32) block_keep_kernel(const BlockPackLaunch a) {
  const int lane = threadIdx.x % 32;
  const int64_t blocks = (a.n + a.B - 1) / a.B;
  const int64_t w = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (w >= blocks * a.hkv) return;  // warp-uniform
  const int32_t kvh = int32_t(w / blocks);
  const int64_t j = w % blocks, first = j * a.B;
  const int32_t nk = int32_t(min(int64_t(a.B), a.n - first));
  const KeepRule rule{kDelta, kCos, a.threshold, 1.0, 0, a.B};
  uint8_t* offs = a.anchor_off + (int64_t(kvh) * blocks + j) * a.B;
  uint8_t* keep = a.keep ? a.keep + int64_t(kvh) * a.n + first : nullptr;
  float anchor[kPer], x[kPer], next[kPer];
  load_key(a, kvh, first, lane, anchor);  // the block's first key: always an anchor
  if (lane == 0) {
    offs[0] = 0;
    if (keep) keep[0] = 1;
  }
  int32_t count = 1;
  if (nk > 1) load_key(a, kvh, first + 1, lane, next);
  for (int32_t i = 1; i < nk; ++i) {
#pragma unroll
    for (int m = 0; m < kPer; ++m) x[m] = next[m];
    if (i + 1 < nk) load_key(a, kvh, first + i + 1, lane, next);
    // key_sums with a = the candidate x, b = the anchor, dimensions in the lane's order.
    float dot = 0.f, aa = 0.f, bb = 0.f, df = 0.f;
#pragma unroll
    for (int m = 0; m < kPer; ++m) {
      if (lane + kLanes * m >= a.d) break;
      const float z = x[m] - anchor[m];
      dot = fmaf(x[m], anchor[m], dot);
      aa = fmaf(x[m], x[m], aa);
      bb = fmaf(anchor[m], anchor[m], bb);
      df = fmaf(z, z, df);
    }
    const Sums s{butterfly(dot), butterfly(aa), butterfly(bb), butterfly(df)};
    const bool kept = delta_keeps(rule, s);  // the same in every lane
    if (lane == 0) {
      if (keep) keep[i] = kept ? 1 : 0;
      if (kept) offs[count] = uint8_t(i);
    }
    if (kept) {
      ++count;
#pragma unroll
      for (int m = 0; m < kPer; ++m) anchor[m] = x[m];
    }
  }
  if (lane == 0) a.n_anchors[int64_t(kvh) * blocks + j] = count;
}

}  // namespace

const char* launch_block_pack(const BlockPackLaunch& a) noexcept {
  if (a.n <= 0) return nullptr;
  if (a.d < 1 || a.d > kBlockPackMaxD) return "block pack: head_dim outside 1..256";
  if (a.B < 1 || a.B > 256) return "block pack: block outside 1..256";
  const int64_t warps = (a.n + a.B - 1) / a.B * a.hkv;
  block_keep_kernel<<<unsigned((warps + kWarps - 1) / kWarps), kWarps * 32, 0,
                      static_cast<cudaStream_t>(a.stream)>>>(a);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace sieve::packing
