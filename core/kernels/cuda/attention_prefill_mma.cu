// The tensor-core prefill kernel: causal flash attention over the paged cache, dense or
// block-sparse (BSR: query block x key block), when q and K/V share a 16-bit dtype; mma.sync
// m16n8k16 with f32 accumulation (FlashAttention-2's structure).
//
// Grid (query tile, head unit, sequence), as the FMA prefill kernel (attention_prefill.cu), with
// the longest tiles (latest query tokens) first. A CTA owns 128 rows = query tokens x the unit's
// heads (GQA packing: a group's heads share every K/V tile), taken from one selection query block
// so the whole tile reads one selection row; each of its 4 warps owns 32 rows (two m16 tiles).
// The CTA walks its key list (mma::KeyList: keys 0 .. the causal limit, or the selected pages
// packed into full tiles, so block-sparse work costs in proportion to the tiles kept) in tiles of
// 64 keys, double-buffered with cp.async, each key's page found in a per-chunk slot table. Per tile,
// in two halves of 32 keys: S = Q·Kᵀ (ldmatrix'd Q and K), masked only in tiles that reach past a
// row's position or hold an invalid key, online softmax in registers, then O += P·V with P straight
// from the score registers and V through ldmatrix.trans. head_dim 128 uses all 255 registers (the
// 128 f32 output accumulators per thread); ptxas reports a small spill (32 B stores).
#include "attention_mma.cuh"

namespace sieve::kernels::cuda {
namespace {

using namespace mma;

constexpr int kRows = kMmaPrefillRows;  // rows (token, head) per CTA
constexpr int kMT = 2;      // m16 tiles per warp
constexpr int kHalfKeys = kTileKeys / 2;  // keys per softmax step
constexpr int kHB = kHalfKeys / 8;         // n-blocks of 8 keys in a step
static_assert(kMT * 16 * (kThreads / 32) == kRows, "the warps' m16 tiles cover the CTA's rows");

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 2) prefill_mma_kernel(const AttnParams p, int32_t tile_tokens);

// The kernel and its shared memory: the tiles (attention_mma.cuh), then per stage the tile's key
// positions, then the slot table.
template <class T, int D>
struct PrefillMmaSmem : PrefillTiles<T, D, kRows> {
  using Tiles = PrefillTiles<T, D, kRows>;
  static constexpr auto kernel = prefill_mma_kernel<T, D>;
  static constexpr size_t kpos_bytes = 2 * kTileKeys * 4;
  static constexpr size_t slot_bytes = 2 * size_t(kSlots) * 4;
  static constexpr size_t bytes = Tiles::bytes + kpos_bytes + slot_bytes;
  int32_t* skpos;  // [2][kTileKeys]
  int32_t* sphys;  // the chunk's slot table: physical page and first position of each slot
  int32_t* spos0;
  __device__ explicit PrefillMmaSmem(unsigned char* smem)
      : Tiles(smem), skpos(reinterpret_cast<int32_t*>(this->rest)), sphys(skpos + 2 * kTileKeys),
        spos0(sphys + kSlots) {}
};

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 2) prefill_mma_kernel(const AttnParams p, int32_t tile_tokens) {
  using L = PrefillMmaSmem<T, D>;
  constexpr int NB = D / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const L sm(smem);

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int32_t b = blockIdx.z;
  const int32_t unit = blockIdx.y;
  const auto [kvh, h0, nh] = head_unit(p, unit);

  // This tile's query tokens [q0, q1) of the sequence, inside one selection query block.
  const auto [qo0, n_q, qb, tiles_per_block] = prefill_blocks(p, b, tile_tokens);
  const int32_t tile = int32_t(gridDim.x) - 1 - int32_t(blockIdx.x);  // longest first
  const int32_t qblock = tile / tiles_per_block;
  const int32_t q0 = qblock * qb + (tile % tiles_per_block) * tile_tokens;
  const int32_t q1 = min(min(q0 + tile_tokens, (qblock + 1) * qb), n_q);
  if (q0 >= q1) return;

  const int32_t page_base = __ldg(p.kv_indptr + b);
  const int32_t n_pages = __ldg(p.kv_indptr + b + 1) - page_base;
  const int32_t kv_len = n_pages > 0 ? (n_pages - 1) * p.page_size + __ldg(p.kv_last + b) : 0;
  const int32_t first_pos = kv_len - n_q;  // position of query token 0 of the sequence
  const int32_t n_rows = (q1 - q0) * nh;
  const int32_t min_pos = first_pos + q0;
  const int32_t limit = min(first_pos + q1, kv_len);

  KeyList keys;
  if (p.sel_heads < 0) {
    keys.init_dense(b, page_base, n_pages, limit);
  } else {
    QueryToken qt;
    qt.tok = qo0 + q0;
    qt.b = b;
    qt.local = q0;
    const int64_t row = query_row(p, qt) * p.sel_h + row_head(p, h0);
    keys.init_sparse(p, b, page_base, n_pages, limit, row);
  }
  const int32_t n_tiles = ceil_div_d(keys.n_keys, kTileKeys);

  // Q tile, asynchronously with the first K/V tile.
  load_q_tile<T, D, kRows>(p, sm.sq, qo0 + q0, h0, nh, n_rows);
  // A thread's rows of the tile in flight need masking: a key past the causal diagonal of the
  // tile's first token, or an invalid key; the CTA-wide OR comes with the next barrier.
  // At head_dim 128 the loader runs rolled: unrolled, its address arithmetic next to the 128
  // output registers spills (ptxas -v).
  constexpr int kLoadUnroll = D >= 128 ? 1 : kTileKeys;
  SlotChunk ch{};
  auto load = [&](int32_t i, int st) -> bool {
    return load_kv_tile<T, D, kThreads, kLoadUnroll>(p, keys, ch, sm.sphys, sm.spos0, kvh, i * kTileKeys,
                                                     sm.sk + st * L::tile, sm.sv + st * L::tile,
                                                     sm.skpos + st * kTileKeys) > min_pos;
  };

  // Positions of this lane's rows: warp rows 32 * warp + 16 * mt + 8 * hf + g.
  int32_t qpos[kMT][2];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) qpos[mt][hf] = min_pos + (warp * 32 + mt * 16 + hf * 8 + g) / nh;

  float o[kMT][NB][4], m[kMT][2], l[kMT][2];
  init_rows<D, kMT>(o, m, l);

  // The key list a slot-table chunk at a time; each chunk runs the double buffer from empty.
  for (int32_t c0 = 0; c0 < n_tiles;) {
    ch = slot_chunk(p, keys, c0, n_tiles);
    c0 = ch.t1;
    __syncthreads();  // the previous chunk's tiles and slot table are no longer read
    fill_slots<kThreads>(p, keys, ch, sm.sphys, sm.spos0);
    __syncthreads();
    bool need_next = load(ch.t0, 0);
    cp_async_commit();  // with the Q tile in the first chunk
    for (int it = 0; it < ch.t1 - ch.t0; ++it) {
      cp_async_wait<0>();
      const bool need_mask = __syncthreads_or(need_next);  // tile `it` landed; tile it - 1 is done
      if (ch.t0 + it + 1 < ch.t1) need_next = load(ch.t0 + it + 1, (it + 1) & 1);
      cp_async_commit();
      const int st = it & 1;
      const T* tk = sm.sk + st * L::tile;
      const T* tv = sm.sv + st * L::tile;
      const int32_t* kp = sm.skpos + st * kTileKeys;

      // Two halves of 32 keys, each a full online-softmax step: the scores of a whole 64-key tile
      // next to the 128 output registers would not fit in 255 registers without spilling.
#pragma unroll 1
      for (int half = 0; half < 2; ++half) {
        const int c0 = half * kHalfKeys;  // first key column of this half
        // S = Q·Kᵀ, then scale to log2 logits and mask (a key past a row's position or invalid;
        // after the scale, which may be negative: -inf times it would be +inf),
        // then the online softmax and O += P·V (attention_mma.cuh).
        softmax_step32<T, D, kMT>(sm.sq, tk, tv, c0, warp, lane, o, m, l, [&](float (&s)[kMT][kHB][4]) {
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
            for (int nb = 0; nb < kHB; ++nb)
#pragma unroll
              for (int e = 0; e < 4; ++e) s[mt][nb][e] *= p.scale_log2;
          if (need_mask) {
#pragma unroll
            for (int nb = 0; nb < kHB; ++nb)
#pragma unroll
              for (int e1 = 0; e1 < 2; ++e1) {
                const int32_t kpos = kp[c0 + nb * 8 + 2 * t + e1];  // INT32_MAX when invalid
#pragma unroll
                for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                  for (int hf = 0; hf < 2; ++hf)
                    if (kpos > qpos[mt][hf]) s[mt][nb][2 * hf + e1] = kNegInf;
              }
          }
        });
      }
    }
  }
  cp_async_wait<0>();  // nothing may be in flight into shared memory when the CTA exits (Q alone
                       // when the key list is empty)

  store_rows<T, D, kMT>(p, o, m, l, qo0 + q0, h0, nh, n_rows);
}

}  // namespace

cudaError_t launch_prefill_attention_mma(const AttnParams& p, Storage kv_dt, int32_t max_tiles,
                                         int32_t tile_tokens, cudaStream_t stream) {
  return launch_prefill_tiles<PrefillMmaSmem>(p, kv_dt, max_tiles, tile_tokens, stream);
}

}  // namespace sieve::kernels::cuda
