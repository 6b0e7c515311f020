// The Hopper prefill kernel: causal flash attention over the paged cache, dense or block-sparse,
// on wgmma + TMA with warp specialisation (FlashAttention-3's structure), head_dim 128, q and K/V of
// one 16-bit dtype. Same grid, rows and key lists as the mma.sync kernel (attention_prefill_mma.cu):
// a CTA owns 128 rows (query tokens x the head unit's heads, one selection query block) and walks
// its key list (mma::KeyList: dense keys up to the causal limit, or the selected blocks' pages) in
// tiles of 128 keys.
//
// Roles (384 threads, three warpgroups):
//  - warpgroup 0, the producer: its first warp fills a 2-stage ring of K/V tiles. Per tile, lane j
//    resolves page j of the tile (128 / page_size pages); a page wholly inside the sequence is
//    loaded by TMA (4 boxes: K and V, two 64-column halves, into 128-byte-swizzled rows), any
//    other page is copied (or zero-filled past the sequence / for an invalid slot) by the warp with
//    plain stores, so no NaN from a ragged last page or a spare page reaches P·V (0 x NaN = NaN).
//    It writes each key's position (INT32_MAX: invalid) and whether the tile needs masking, then
//    arms the stage's `full` barrier with the TMA bytes. It waits on the stage's `empty` barrier
//    before refilling it. The other three warps leave after giving up their registers.
//  - warpgroups 1 and 2, the consumers, 64 rows each: per tile, S = Q·Kᵀ (wgmma, Q and K from
//    swizzled shared memory, 8 k16 steps), mask and scale to log2 logits, online softmax in
//    registers, O += P·V (wgmma with P from registers, V transposed), then release the stage.
//    The two consumers run out of phase on their own, so one's softmax overlaps the other's MMAs.
// Register budget: setmaxnreg gives the producer 40 and each consumer thread 232 (S 64 + O 64 + P
// 32 f32/b32 registers plus addresses).
// Not yet run on a GPU: docs/bench/README.md ("Hopper prefill: design") says what is tested where.
#include "../attention_mma.cuh"
#include "async_copy.cuh"
#include "device.hpp"
#include "prefill_wgmma.hpp"
#include "tensor_map.hpp"
#include "wgmma.cuh"

namespace sieve::kernels::cuda::sm90 {
namespace {

using mma::KeyList;

constexpr int kD = 128;
constexpr int kRows = kMmaPrefillRows;       // 128 rows per CTA, 64 per consumer
constexpr int kKeys = 128;                   // keys per K/V tile
constexpr int kStages = 2;
constexpr int kThreads = 384;
constexpr int kHalf = kKeys * 128;           // bytes of one 64-column half of a K or V tile
constexpr int kTileBytes = 2 * kHalf;        // one K (or V) tile
constexpr int kQHalf = 64 * 128;             // one consumer's 64 rows, one 64-column half

struct Smem {
  static constexpr size_t q = 0;                                  // [2 consumers][2 halves][64][128 B]
  static constexpr size_t k = q + 4 * kQHalf;                     // [stage][2 halves][128 keys][128 B]
  static constexpr size_t v = k + size_t(kStages) * kTileBytes;
  static constexpr size_t kpos = v + size_t(kStages) * kTileBytes;  // int32 [stage][128]
  static constexpr size_t mask = kpos + size_t(kStages) * kKeys * 4;  // int32 [stage]
  static constexpr size_t bars = mask + 16;                         // u64 full[stage], empty[stage]
  static constexpr size_t bytes = bars + 2 * kStages * 8;
  static constexpr size_t launch_bytes = bytes + kSwAtomBytes;     // + the alignment slack
};

__device__ inline unsigned char* align_atom(unsigned char* p) {
  const uint32_t a = smem_u32(p);
  return p + ((kSwAtomBytes - (a % kSwAtomBytes)) % kSwAtomBytes);
}

__device__ inline void setmaxnreg_dec40() { asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::); }
__device__ inline void setmaxnreg_inc232() { asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::); }
// Barrier among one consumer warpgroup's 128 threads (ids 1, 2; 0 is __syncthreads).
__device__ inline void consumer_sync(int cw) { asm volatile("bar.sync %0, 128;\n" ::"r"(cw + 1) : "memory"); }

// One 16-byte chunk c (0..15) of key row r in a swizzled K/V tile.
__device__ inline uint32_t tile_chunk(int r, int c) {
  return (c / 8) * kHalf + sw128_offset(r, (c % 8) * 8);
}

// The producer warp: fills stage `st` with key tile `t` of `keys`.
template <class T>
__device__ void produce_tile(const AttnParams& p, const CUtensorMap* kmap, const CUtensorMap* vmap, const KeyList& keys,
                             int32_t kvh, int32_t kv_len, int32_t min_pos, int32_t t, unsigned char* sk,
                             unsigned char* sv, int32_t* kpos, int32_t* need_mask, uint64_t* full) {
  const int lane = threadIdx.x % 32;
  const int32_t P = p.page_size;
  const int ppt = kKeys / P;  // pages per tile (<= 16: page_size >= 8)
  // Lane j < ppt: page j of the tile. clean: loaded by TMA (every token inside the sequence).
  int32_t phys = -1, pos0 = 0;
  if (lane < ppt) {
    const int32_t slot = keys.slot_of(p, t * kKeys) + lane;
    if (int64_t(slot) * P < keys.n_keys) phys = keys.resolve_slot(p, slot, pos0);
  }
  const bool clean = lane < ppt && phys >= 0 && pos0 + P <= kv_len;
  const unsigned clean_mask = __ballot_sync(0xffffffffu, clean);

  // Key positions and the mask flag: a key past the tile's first query or invalid masks.
  int32_t max_pos = -1;
  for (int r = lane; r < kKeys; r += 32) {
    const int32_t ph = __shfl_sync(0xffffffffu, phys, r / P);
    const int32_t p0 = __shfl_sync(0xffffffffu, pos0, r / P);
    const int32_t pos = p0 + r % P;
    const int32_t kp = ph >= 0 && pos < kv_len ? pos : INT32_MAX;
    kpos[r] = kp;
    max_pos = max(max_pos, kp);
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) max_pos = max(max_pos, __shfl_xor_sync(0xffffffffu, max_pos, o));
  if (lane == 0) *need_mask = max_pos > min_pos;

  // Pages TMA does not load: the warp copies their valid rows and zeroes the rest, 16 bytes a lane.
  const T* kg = static_cast<const T*>(p.k);
  const T* vg = static_cast<const T*>(p.v);
  if (clean_mask != (1u << ppt) - 1) {
    // kKeys * 16 chunks: the same trip count on every lane, so the shuffles see the whole warp.
    for (int i = lane; i < kKeys * 16; i += 32) {
      const int r = i / 16, c = i % 16;
      const int32_t ph = __shfl_sync(0xffffffffu, phys, r / P);
      const int32_t p0 = __shfl_sync(0xffffffffu, pos0, r / P);
      if (clean_mask >> (r / P) & 1) continue;
      uint4 kx = make_uint4(0, 0, 0, 0), vx = kx;
      if (ph >= 0 && p0 + r % P < kv_len) {
        const int64_t row = p.pages.row(ph, kvh, r % P) + c * 8;
        kx = *reinterpret_cast<const uint4*>(kg + row);
        vx = *reinterpret_cast<const uint4*>(vg + row);
      }
      *reinterpret_cast<uint4*>(sk + tile_chunk(r, c)) = kx;
      *reinterpret_cast<uint4*>(sv + tile_chunk(r, c)) = vx;
    }
    fence_async_shared();  // these rows are read next by wgmma (the async proxy)
  }
  __syncwarp();
  // Arm the barrier with the TMA bytes (the arrival completes the phase once they land), then load.
  if (lane == 0) mbar_arrive_expect_tx(full, uint32_t(__popc(clean_mask)) * 4u * uint32_t(P) * 128u);
  __syncwarp();
  if (clean) {
    for (int h = 0; h < 2; ++h) {
      tma_load_4d(sk + h * kHalf + lane * P * 128, kmap, full, h * 64, 0, kvh, phys);
      tma_load_4d(sv + h * kHalf + lane * P * 128, vmap, full, h * 64, 0, kvh, phys);
    }
  }
}


// One consumer warpgroup (cw = 0, 1): rows 64 cw .. 64 cw + 63 of the CTA's tile.
template <class T>
__device__ void consume(const AttnParams& p, int cw, const KeyList& keys, int32_t n_tiles, int32_t qo0, int32_t q0,
                        int32_t n_rows, int32_t h0, int32_t nh, int32_t min_pos, unsigned char* base) {
  const int wt = threadIdx.x % 128, warp = wt / 32, lane = wt % 32, g = lane / 4, t = lane % 4;
  unsigned char* sq = base + Smem::q + cw * 2 * kQHalf;
  const int32_t* skpos = reinterpret_cast<const int32_t*>(base + Smem::kpos);
  const int32_t* smask = reinterpret_cast<const int32_t*>(base + Smem::mask);
  uint64_t* full = reinterpret_cast<uint64_t*>(base + Smem::bars);
  uint64_t* empty = full + kStages;

  // Q rows (row = token * nh + head) into the swizzled halves, zeros past the tile's rows.
  {
    const uint4* qg = static_cast<const uint4*>(p.q);
    for (int i = wt; i < 64 * 16; i += 128) {
      const int r = i / 16, c = i % 16, row = cw * 64 + r;
      uint4 x = make_uint4(0, 0, 0, 0);
      if (row < n_rows) x = qg[((int64_t(qo0 + q0 + row / nh) * p.hq + h0 + row % nh) * kD) / 8 + c];
      *reinterpret_cast<uint4*>(sq + (c / 8) * kQHalf + sw128_offset(r, (c % 8) * 8)) = x;
    }
    fence_async_shared();
    consumer_sync(cw);
  }
  // This thread's two rows: 16 warp + g and + 8 (wgmma.cuh's accumulator layout).
  int32_t qpos[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) qpos[hf] = min_pos + (cw * 64 + warp * 16 + hf * 8 + g) / nh;

  float o[kD / 2];
#pragma unroll
  for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};
  const uint32_t q_addr = smem_u32(sq);

  for (int32_t it = 0; it < n_tiles; ++it) {
    const int st = it % kStages;
    mbar_wait(&full[st], uint32_t(it / kStages) & 1u);
    const uint32_t k_addr = smem_u32(base + Smem::k + st * kTileBytes);
    const uint32_t v_addr = smem_u32(base + Smem::v + st * kTileBytes);

    // S = Q·Kᵀ: 64 rows x 128 keys.
    float s[kKeys / 2];
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kD / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32;  // k16 step inside a 128-byte row
      wgmma_ss<T, kKeys>(s, desc_k_major(q_addr + (kk / 4) * kQHalf + off), desc_k_major(k_addr + (kk / 4) * kHalf + off),
                         kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(s);

    // Mask (a key past the row's position, or invalid) and scale to log2 logits.
    if (smask[st]) {
      const int32_t* kp = skpos + st * kKeys;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int32_t pos = kp[8 * j + 2 * t + e];
#pragma unroll
          for (int hf = 0; hf < 2; ++hf)
            if (pos > qpos[hf]) s[4 * j + 2 * hf + e] = kNegInf;
        }
    }
#pragma unroll
    for (int i = 0; i < kKeys / 2; ++i) s[i] *= p.scale_log2;

    // Online softmax per row (the quad of lanes 4g .. 4g + 3 shares a row).
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = kNegInf;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[hf], mx);
      const float m_use = m_new == kNegInf ? 0.f : m_new;  // nothing visible yet: p = 0
      const float alpha = exp2f(m[hf] - m_use);
      m[hf] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[4 * j + 2 * hf + e];
          x = exp2f(x - m_use);
          sum += x;
        }
      l[hf] = l[hf] * alpha + sum;
#pragma unroll
      for (int j = 0; j < kD / 8; ++j) {
        o[4 * j + 2 * hf] *= alpha;
        o[4 * j + 2 * hf + 1] *= alpha;
      }
    }

    // P as wgmma's A fragments (mma.sync's A layout per warp), 16 keys each; O += P·V.
    uint32_t pa[kKeys / 16][4];
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks) {
      pa[ks][0] = mma::pack2<T>(s[8 * ks + 0], s[8 * ks + 1]);
      pa[ks][1] = mma::pack2<T>(s[8 * ks + 2], s[8 * ks + 3]);
      pa[ks][2] = mma::pack2<T>(s[8 * ks + 4], s[8 * ks + 5]);
      pa[ks][3] = mma::pack2<T>(s[8 * ks + 6], s[8 * ks + 7]);
    }
    wgmma_fence();
#pragma unroll
    for (int ks = 0; ks < kKeys / 16; ++ks)
      wgmma_rs_tb<T, kD>(o, pa[ks], desc_mn_major(v_addr + ks * 16 * 128, kHalf), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(o);
    // The stage is free once every consumer warp's MMAs on it are done.
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[st]);
  }

  // Finalise: the quad's row sums, normalise, store (attention_prefill_mma.cu's epilogue).
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float lt = l[hf];
    lt += __shfl_xor_sync(0xffffffffu, lt, 1);
    lt += __shfl_xor_sync(0xffffffffu, lt, 2);
    const int row = cw * 64 + warp * 16 + hf * 8 + g;
    if (row >= n_rows) continue;
    const int32_t tok = qo0 + q0 + row / nh;
    const int32_t h = h0 + row % nh;
    const float inv = lt > 0.f ? 1.f / lt : 0.f;  // a row that attended nothing outputs 0
    const int64_t out = (int64_t(tok) * p.hq + h) * kD + 2 * t;
#pragma unroll
    for (int j = 0; j < kD / 8; ++j)
      mma::store_pair<T>(p, out + 8 * j, o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
    if (t == 0 && p.lse) p.lse[int64_t(tok) * p.hq + h] = lt > 0.f ? (m[hf] + log2f(lt)) * kLn2 : kNegInf;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_wgmma_kernel(const AttnParams p, const __grid_constant__ CUtensorMap kmap,
                         const __grid_constant__ CUtensorMap vmap, int32_t tile_tokens) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = align_atom(smem_raw);
  const int32_t b = blockIdx.z;
  const auto [kvh, h0, nh] = head_unit(p, int32_t(blockIdx.y));
  const auto [qo0, n_q, qb, tiles_per_block] = prefill_blocks(p, b, tile_tokens);
  const int32_t tile = int32_t(gridDim.x) - 1 - int32_t(blockIdx.x);  // longest first
  const int32_t qblock = tile / tiles_per_block;
  const int32_t q0 = qblock * qb + (tile % tiles_per_block) * tile_tokens;
  const int32_t q1 = min(min(q0 + tile_tokens, (qblock + 1) * qb), n_q);
  if (q0 >= q1) return;  // uniform: before any barrier

  const int32_t page_base = __ldg(p.kv_indptr + b);
  const int32_t n_pages = __ldg(p.kv_indptr + b + 1) - page_base;
  const int32_t kv_len = n_pages > 0 ? (n_pages - 1) * p.page_size + __ldg(p.kv_last + b) : 0;
  const int32_t first_pos = kv_len - n_q;
  const int32_t min_pos = first_pos + q0;
  const int32_t limit = min(first_pos + q1, kv_len);

  uint64_t* full = reinterpret_cast<uint64_t*>(base + Smem::bars);
  uint64_t* empty = full + kStages;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);         // the producer's arrival (+ the TMA bytes)
      mbar_init(&empty[s], 2 * 4);    // every consumer warp
    }
    fence_mbar_init();
  }
  __syncthreads();

  // Every warp that takes part builds the same key list (init_sparse is warp-collective).
  auto key_list = [&] {
    KeyList keys;
    if (p.sel_heads < 0) {
      keys.init_dense(b, page_base, n_pages, limit);
    } else {
      QueryToken qt;
      qt.tok = qo0 + q0;
      qt.b = b;
      qt.local = q0;
      keys.init_sparse(p, b, page_base, n_pages, limit, query_row(p, qt) * p.sel_h + row_head(p, h0));
    }
    return keys;
  };

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec40();
    if (threadIdx.x >= 32) return;
    const KeyList keys = key_list();
    const int32_t n_tiles = ceil_div_d(keys.n_keys, kKeys);
    for (int32_t it = 0; it < n_tiles; ++it) {
      const int st = it % kStages;
      if (it >= kStages) mbar_wait(&empty[st], uint32_t(it / kStages - 1) & 1u);
      produce_tile<T>(p, &kmap, &vmap, keys, kvh, kv_len, min_pos, it, base + Smem::k + st * kTileBytes,
                      base + Smem::v + st * kTileBytes, reinterpret_cast<int32_t*>(base + Smem::kpos) + st * kKeys,
                      reinterpret_cast<int32_t*>(base + Smem::mask) + st, &full[st]);
    }
  } else {
    setmaxnreg_inc232();
    const KeyList keys = key_list();
    consume<T>(p, wg - 1, keys, ceil_div_d(keys.n_keys, kKeys), qo0, q0, (q1 - q0) * nh, h0, nh, min_pos, base);
  }
}

}  // namespace

std::string prefill_wgmma_unsupported(int device, int32_t head_dim, int32_t page_size) {
  if (!device_has_wgmma(device)) return "device " + std::to_string(device) + " is not compute capability 9.0";
  if (head_dim != kD) return "head_dim " + std::to_string(head_dim) + " (the Hopper kernel has 128)";
  if (page_size < 8 || page_size > kKeys || kKeys % page_size != 0)
    return "page size " + std::to_string(page_size) + " (the Hopper kernel needs 8..128 dividing 128)";
  return {};
}

cudaError_t launch_prefill_attention_wgmma(const AttnParams& p, Storage kv_dt, int32_t max_tiles, int32_t tile_tokens,
                                           cudaStream_t stream, std::string* why) {
  if (tile_tokens < 1 || tile_tokens * p.hg > kRows) return cudaErrorInvalidConfiguration;
  CUtensorMap maps[2];
  const void* pools[2] = {p.k, p.v};
  for (int i = 0; i < 2; ++i) {
    const PagedPoolView view{pools[i], kv_dt, p.d, p.page_size, p.hkv, p.page_capacity, p.pages};
    if (std::string e = encode_paged_tensor_map(view, p.page_size, &maps[i]); !e.empty()) {
      if (why) *why = e;
      return cudaErrorInvalidValue;
    }
  }
  return dispatch_storage16(kv_dt, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    auto kernel = prefill_wgmma_kernel<T>;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Smem::launch_bytes));
        e != cudaSuccess)
      return e;
    const dim3 grid(unsigned(max_tiles), unsigned(p.hkv * p.chunks), unsigned(p.batch));
    kernel<<<grid, kThreads, Smem::launch_bytes, stream>>>(p, maps[0], maps[1], tile_tokens);
    return cudaGetLastError();
  });
}

}  // namespace sieve::kernels::cuda::sm90
