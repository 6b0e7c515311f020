// The Hopper prefill kernel: causal flash attention over the paged cache, dense or block-sparse,
// on wgmma + TMA with warp specialisation (FlashAttention-3's structure), head_dim 128, q and K/V of
// one 16-bit dtype. Same tiles, rows and key lists as the mma.sync kernel (attention_prefill_mma.cu):
// a work item is 128 rows (query tokens x the head unit's heads, one selection query block; row r is
// token r / hg, head r % hg, as Q's TMA box lands) and walks its key list (mma::KeyList: dense keys
// up to the causal limit, or the selected blocks' pages) in tiles of 128 keys.
//
// Roles (384 threads, three warpgroups; FlashAttention-3's forward structure, written here from
// scratch):
//  - warpgroup 0, the producers: its first warp fills a 2-stage ring of K tiles (and loads Q), its
//    second a 2-stage ring of V tiles, each stage with its own `full` and `empty` mbarrier (K is
//    released as soon as S is computed, V only after P·V: separate rings let K of tile j + 2 load
//    while V of tile j is still read). Per tile, lane j resolves page j of the tile (128 / page_size
//    pages); a page wholly inside the sequence is loaded by TMA (a box per 64-column half, into
//    128-byte-swizzled rows), any other page is copied (or zero-filled past the sequence / for an
//    invalid slot) by the warp with plain stores, so no NaN from a ragged last page or a spare page
//    reaches P·V (0 x NaN = NaN). With K it writes each key's position (INT32_MAX: invalid) and
//    whether the tile needs masking. The other two warps leave after giving up their registers.
//  - warpgroups 1 and 2, the consumers, 64 rows each. Intra-warpgroup overlap: iteration j issues
//    S_j = Q·K_jᵀ (wgmma SS) and O += P_{j-1}·V_{j-1} (wgmma RS) back to back, then masks and
//    exponentiates S_j while P·V still runs on the tensor cores, and rescales O once P·V is done.
//    Ping-pong: a pair of named barriers makes the two consumers issue their MMAs in turn, so one's
//    softmax runs under the other's MMAs.
// Persistent: one CTA per SM walks work items (a 128-row query tile of one head unit and sequence;
// per sequence, longest tile first across the head units: work_item) in rounds (round_item). The
// producers run ahead across items: they load the next item's Q (TMA, a double buffer, with the
// item's tile count) and first K/V tiles while the consumers finish the current one, so a CTA's
// setup and epilogue no longer leave the tensor cores idle (what made short block-sparse key lists
// slower than on the mma.sync kernel, which runs several CTAs per SM).
// Register budget: setmaxnreg gives the producer 72 (at 56 it spilled 8 bytes) and each consumer
// thread 216 (S 64 + O 64 + P 32 registers live across the overlapped MMAs, plus addresses).
#include <algorithm>

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
constexpr int kStages = 2;                   // per ring (K and V)
constexpr int kThreads = 384;
constexpr int kHalf = kKeys * 128;           // bytes of one 64-column half of a K or V tile
constexpr int kTileBytes = 2 * kHalf;        // one K (or V) tile
constexpr int kQHalf = 64 * 128;             // one consumer's 64 rows, one 64-column half
constexpr int kQBufHalf = 2 * kQHalf;        // a Q buffer's 64-column half: 128 rows

struct Smem {
  static constexpr size_t q = 0;                                  // [buffer][2 halves][128 rows][128 B]
  static constexpr size_t k = q + 2 * 2 * kQBufHalf;              // [stage][2 halves][128 keys][128 B]
  static constexpr size_t v = k + size_t(kStages) * kTileBytes;
  static constexpr size_t kpos = v + size_t(kStages) * kTileBytes;  // int32 [stage][128]
  static constexpr size_t mask = kpos + size_t(kStages) * kKeys * 4;  // int32 [stage]
  static constexpr size_t item_tiles = mask + 16;                   // int32 [Q buffer]: the item's key tiles
  static constexpr size_t bars = item_tiles + 16;  // u64 k_full, v_full, k_empty, v_empty [stage]; q_full, q_empty [buffer]
  static constexpr size_t bytes = bars + 6 * kStages * 8;
  static constexpr size_t launch_bytes = bytes + kSwAtomBytes;     // + the alignment slack
};

// The ring barriers, by role.
struct Rings {
  uint64_t* k_full;
  uint64_t* v_full;
  uint64_t* k_empty;
  uint64_t* v_empty;
  uint64_t* q_full;  // Q buffers (2, like the stages)
  uint64_t* q_empty;
  __device__ explicit Rings(unsigned char* base) {
    k_full = reinterpret_cast<uint64_t*>(base + Smem::bars);
    v_full = k_full + kStages;
    k_empty = v_full + kStages;
    v_empty = k_empty + kStages;
    q_full = v_empty + kStages;
    q_empty = q_full + kStages;
  }
};

// One work item: query tile `tile` of head unit `unit` and sequence `b` (the old grid's
// blockIdx.x, y, z). Every role derives the same items, so they agree without talking. Within a
// sequence the items go tile-major, longest first across every head unit (w = rank * units + unit),
// so a round of gridDim.x items holds tiles of nearly one length whatever max_tiles is (unit-major,
// a head unit's tiles from longest to shortest before the next unit's, left rounds mixing long and
// short tiles when max_tiles is not much larger than the grid; see round_item).
struct Item {
  int32_t b, kvh, h0, nh;
  int32_t qo0, q0, q1;           // the sequence's first token; the tile's query tokens [q0, q1)
  int32_t page_base, n_pages, kv_len, min_pos, limit;
  bool live;                      // false: past the sequence's tiles (nothing to do)
};

__device__ inline Item work_item(const AttnParams& p, int32_t w, int32_t max_tiles, int32_t tile_tokens) {
  Item it;
  const int32_t units = p.hkv * p.chunks;
  const int32_t in_seq = w % (max_tiles * units);
  const int32_t tile = max_tiles - 1 - in_seq / units;  // longest first
  it.b = w / (max_tiles * units);
  const auto [kvh, h0, nh] = head_unit(p, in_seq % units);
  it.kvh = kvh, it.h0 = h0, it.nh = nh;
  const auto [qo0, n_q, qb, tiles_per_block] = prefill_blocks(p, it.b, tile_tokens);
  const int32_t qblock = tile / tiles_per_block;
  it.qo0 = qo0;
  it.q0 = qblock * qb + (tile % tiles_per_block) * tile_tokens;
  it.q1 = min(min(it.q0 + tile_tokens, (qblock + 1) * qb), n_q);
  it.live = it.q0 < it.q1;
  it.page_base = __ldg(p.kv_indptr + it.b);
  it.n_pages = __ldg(p.kv_indptr + it.b + 1) - it.page_base;
  it.kv_len = it.n_pages > 0 ? (it.n_pages - 1) * p.page_size + __ldg(p.kv_last + it.b) : 0;
  const int32_t first_pos = it.kv_len - n_q;
  it.min_pos = first_pos + it.q0;
  it.limit = min(first_pos + it.q1, it.kv_len);
  return it;
}

__device__ inline unsigned char* align_atom(unsigned char* p) {
  const uint32_t a = smem_u32(p);
  return p + ((kSwAtomBytes - (a % kSwAtomBytes)) % kSwAtomBytes);
}

__device__ inline void setmaxnreg_dec72() { asm volatile("setmaxnreg.dec.sync.aligned.u32 72;\n" ::); }
__device__ inline void setmaxnreg_inc216() { asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n" ::); }
// The MMA turn of consumer cw (named barriers 3, 4): it waits for its turn before issuing its MMAs and gives
// the turn to the other consumer after issuing them (256 = its 128 waiters + the giver's arrivals).
__device__ inline void turn_wait(int cw) { asm volatile("bar.sync %0, 256;\n" ::"r"(cw + 3) : "memory"); }
__device__ inline void turn_give(int to) { asm volatile("bar.arrive %0, 256;\n" ::"r"(to + 3) : "memory"); }
// 2^x on the SFU (flushes subnormal results to 0, which a probability below 2^-126 is anyway).
__device__ inline float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// One 16-byte chunk c (0..15) of key row r in a swizzled K/V tile.
__device__ inline uint32_t tile_chunk(int r, int c) {
  return (c / 8) * kHalf + sw128_offset(r, (c % 8) * 8);
}

// The pages of one key tile as the producer warp sees them: lane j < 128 / page_size holds page j.
struct TilePages {
  int32_t phys = -1, pos0 = 0;  // physical page (-1: invalid slot or past the list) and its first position
  bool clean = false;           // loaded by TMA: every token inside the sequence
  unsigned clean_mask = 0;      // the warp's clean lanes
};

__device__ TilePages tile_pages(const AttnParams& p, const KeyList& keys, int32_t kv_len, int32_t t) {
  const int lane = threadIdx.x % 32;
  const int32_t P = p.page_size;
  TilePages tp;
  if (lane < kKeys / P) {
    const int32_t slot = keys.slot_of(p, t * kKeys) + lane;
    if (int64_t(slot) * P < keys.n_keys) tp.phys = keys.resolve_slot(p, slot, tp.pos0);
  }
  tp.clean = lane < kKeys / P && tp.phys >= 0 && tp.pos0 + P <= kv_len;
  tp.clean_mask = __ballot_sync(0xffffffffu, tp.clean);
  return tp;
}

// The warp's copy of the rows TMA does not load (pages that are not clean) into a swizzled tile:
// valid rows from the pool, zeros elsewhere, 16 bytes a lane.
template <class T>
__device__ void copy_unclean(const AttnParams& p, const T* pool, const TilePages& tp, int32_t kvh, int32_t kv_len,
                             unsigned char* dst) {
  const int lane = threadIdx.x % 32;
  const int32_t P = p.page_size;
  if (tp.clean_mask == (1u << (kKeys / P)) - 1) return;
  // kKeys * 16 chunks: the same trip count on every lane, so the shuffles see the whole warp.
  for (int i = lane; i < kKeys * 16; i += 32) {
    const int r = i / 16, c = i % 16;
    const int32_t ph = __shfl_sync(0xffffffffu, tp.phys, r / P);
    const int32_t p0 = __shfl_sync(0xffffffffu, tp.pos0, r / P);
    if (tp.clean_mask >> (r / P) & 1) continue;
    uint4 x = make_uint4(0, 0, 0, 0);
    if (ph >= 0 && p0 + r % P < kv_len) x = *reinterpret_cast<const uint4*>(pool + p.pages.row(ph, kvh, r % P) + c * 8);
    *reinterpret_cast<uint4*>(dst + tile_chunk(r, c)) = x;
  }
  fence_async_shared();  // these rows are read next by wgmma (the async proxy)
}

// Arms `full` with the bytes of the clean pages' boxes, then loads them (both 64-column halves).
__device__ void load_clean(const AttnParams& p, const CUtensorMap* map, const TilePages& tp, int32_t kvh,
                           unsigned char* dst, uint64_t* full) {
  const int lane = threadIdx.x % 32;
  __syncwarp();  // the copies above are done (and fenced) before the arrival publishes them
  if (lane == 0) mbar_arrive_expect_tx(full, uint32_t(__popc(tp.clean_mask)) * 2u * uint32_t(p.page_size) * 128u);
  __syncwarp();
  if (tp.clean)
    for (int h = 0; h < 2; ++h) tma_load_4d(dst + h * kHalf + lane * p.page_size * 128, map, full, h * 64, 0, kvh, tp.phys);
}

// This CTA's item in round r (rounds of gridDim.x consecutive items): the CTAs take a round's
// items in order on even rounds and in reverse on odd ones. Consecutive items shrink (longest
// first), so a fixed stride gives CTA 0 the longest item of every round. Counted on the host (key
// tiles + 2 tiles of per-item cost, 132 CTAs), the busiest CTA's excess over the mean: dense 64q/8kv
// causal 16K-64K 0.4-1.6% fixed stride, < 0.1% alternating; 32q/8kv 16K 3.1% / 0.1%;
// delta_correction's far-key call at 128K (64 anchor tiles of 0-126K keys x 8 heads) 1.4%, where
// the unit-major order left it at 81% (alternating) and dense 32q/8kv 16K at 23%. Past n_items: none.
__device__ inline int64_t round_item(int32_t r) {
  const int64_t c = blockIdx.x, g = gridDim.x;
  return r * g + (r % 2 == 0 ? c : g - 1 - c);
}

// The key list of an item (every warp that uses it builds the same; init_sparse is warp-collective).
__device__ inline KeyList item_keys(const AttnParams& p, const Item& it) {
  KeyList keys;
  if (p.sel_heads < 0) {
    keys.init_dense(it.b, it.page_base, it.n_pages, it.limit);
  } else {
    QueryToken qt;
    qt.tok = it.qo0 + it.q0;
    qt.b = it.b;
    qt.local = it.q0;
    keys.init_sparse(p, it.b, it.page_base, it.n_pages, it.limit, query_row(p, qt) * p.sel_h + row_head(p, it.h0));
  }
  return keys;
}

// The producer warps, over the CTA's items: one per ring, walking the same items and key tiles. The
// K warp also loads each item's Q (with its tile count) into a free Q buffer and writes each K tile's
// key positions and mask flag. One warp issuing K_t then V_t had to wait for V's stage (freed only
// after P·V, an iteration after K's) before it could look up the next tile's pages, so every K tile
// started late; apart, each warp looks up its next tile's pages while it waits for that tile's stage
// (H200, same call: dense 64q/8kv 16K 10.41 -> 9.13 ms, 90% sparse 16K 1.85 -> 1.43 ms). Pages below
// a tile cost one TMA box per page and 64-column half (32 boxes of 2 KB a tile at page 16): dense 32K
// runs 16% slower at page 16 than at page 128. Copying such pages with cp.async instead (two warps
// per ring, zero-filled rows, cp.async.mbarrier.arrive) measured 1.8x slower than these boxes, so
// TMA stays (gpu/lead-2026-11-29-{A,B,C}.sh, docs/bench/README.md). `tc` counts tiles across items
// (stage tc % 2, the (tc / 2)-th use of it), `k` items.
template <class T, bool kLoadsK>
__device__ void produce(const AttnParams& p, const CUtensorMap* qmap, const CUtensorMap* kvmap, int32_t max_tiles,
                        int32_t tile_tokens, int32_t n_items, unsigned char* base) {
  const int lane = threadIdx.x % 32;
  const Rings bars(base);
  uint64_t* const empty = kLoadsK ? bars.k_empty : bars.v_empty;
  uint64_t* const full = kLoadsK ? bars.k_full : bars.v_full;
  const T* const pool = static_cast<const T*>(kLoadsK ? p.k : p.v);
  const size_t ring = kLoadsK ? Smem::k : Smem::v;
  int32_t tc = 0, k = 0;
  for (int32_t r = 0; int64_t(r) * gridDim.x < n_items; ++r) {
    const int64_t w = round_item(r);
    if (w >= n_items) continue;
    const Item it = work_item(p, int32_t(w), max_tiles, tile_tokens);
    if (!it.live) continue;
    const KeyList keys = item_keys(p, it);
    const int32_t n_tiles = ceil_div_d(keys.n_keys, kKeys);

    if constexpr (kLoadsK) {
      const int qb = k % 2;
      if (k >= 2) mbar_wait(&bars.q_empty[qb], uint32_t(k / 2 - 1) & 1u);
      if (lane == 0) {
        reinterpret_cast<int32_t*>(base + Smem::item_tiles)[qb] = n_tiles;
        // Rows r = token * hg + head: one box per 64-column half, hg heads x tile_tokens tokens
        // (heads past the unit or tokens past the tile land in rows the consumers do not store).
        mbar_arrive_expect_tx(&bars.q_full[qb], 2u * 128u * uint32_t(p.hg * tile_tokens));
        unsigned char* sq = base + Smem::q + qb * 2 * kQBufHalf;
        for (int h = 0; h < 2; ++h) tma_load_3d(sq + h * kQBufHalf, qmap, &bars.q_full[qb], h * 64, it.h0, it.qo0 + it.q0);
      }
    }
    ++k;

    for (int32_t t = 0; t < n_tiles; ++t, ++tc) {
      const int st = tc % kStages;
      const TilePages tp = tile_pages(p, keys, it.kv_len, t);  // before the wait: its loads overlap it
      if (tc >= kStages) mbar_wait(&empty[st], uint32_t(tc / kStages - 1) & 1u);
      if constexpr (kLoadsK) {
        // Key positions and the mask flag: a key past the item's first query or invalid masks.
        int32_t* kpos = reinterpret_cast<int32_t*>(base + Smem::kpos) + st * kKeys;
        int32_t max_pos = -1;
        for (int r = lane; r < kKeys; r += 32) {
          const int32_t ph = __shfl_sync(0xffffffffu, tp.phys, r / p.page_size);
          const int32_t p0 = __shfl_sync(0xffffffffu, tp.pos0, r / p.page_size);
          const int32_t pos = p0 + r % p.page_size;
          const int32_t kp = ph >= 0 && pos < it.kv_len ? pos : INT32_MAX;
          kpos[r] = kp;
          max_pos = max(max_pos, kp);
        }
#pragma unroll
        for (int o = 16; o > 0; o /= 2) max_pos = max(max_pos, __shfl_xor_sync(0xffffffffu, max_pos, o));
        if (lane == 0) reinterpret_cast<int32_t*>(base + Smem::mask)[st] = max_pos > it.min_pos;
      }
      unsigned char* dst = base + ring + st * kTileBytes;
      copy_unclean(p, pool, tp, it.kvh, it.kv_len, dst);
      load_clean(p, kvmap, tp, it.kvh, dst, &full[st]);
    }
  }
}

// The consumer's running softmax state: its two rows' maximum (log2 domain) and sum.
struct RowState {
  float m[2] = {kNegInf, kNegInf};
  float l[2] = {0.f, 0.f};
};

// S (raw Q·Kᵀ, masked keys -inf) -> P = 2^(S·scale - m) in place; updates m and l, returns in
// alpha the factor that rescales O (and l) from the old maximum to the new. scale_log2 > 0 (the
// planner sends other scales to the mma.sync kernel), so the maximum of S·scale is max(S)·scale:
// one FFMA and one SFU op per element.
__device__ inline void online_softmax(float (&s)[kKeys / 2], RowState& rs, float scale_log2, float (&alpha)[2]) {
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    float mx = kNegInf;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * hf], s[4 * j + 2 * hf + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(rs.m[hf], mx * scale_log2);
    const float m_use = m_new == kNegInf ? 0.f : m_new;  // nothing visible yet: p = 0
    alpha[hf] = ex2(rs.m[hf] - m_use);
    rs.m[hf] = m_new;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[4 * j + 2 * hf + e];
        x = ex2(fmaf(x, scale_log2, -m_use));
        sum += x;
      }
    rs.l[hf] = rs.l[hf] * alpha[hf] + sum;
  }
}

// Keys past the row's position (or invalid) to -inf, when the producer flagged the tile.
__device__ inline void mask_tile(float (&s)[kKeys / 2], const int32_t* kpos, int32_t need, const int32_t (&qpos)[2]) {
  if (!need) return;
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int j = 0; j < kKeys / 8; ++j)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int32_t pos = kpos[8 * j + 2 * t + e];
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        if (pos > qpos[hf]) s[4 * j + 2 * hf + e] = kNegInf;
    }
}

// P as wgmma's A fragments (mma.sync's A layout per warp), 16 keys each.
template <class T>
__device__ inline void pack_p(const float (&s)[kKeys / 2], uint32_t (&pa)[kKeys / 16][4]) {
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) pa[ks][i] = mma::pack2<T>(s[8 * ks + 2 * i], s[8 * ks + 2 * i + 1]);
}

template <class T>
__device__ inline void issue_qk(float (&s)[kKeys / 2], uint32_t q_addr, uint32_t k_addr) {
#pragma unroll
  for (int kk = 0; kk < kD / 16; ++kk) {
    const uint32_t off = (kk % 4) * 32;  // k16 step inside a 128-byte row
    wgmma_ss<T, kKeys>(s, desc_k_major(q_addr + (kk / 4) * kQBufHalf + off), desc_k_major(k_addr + (kk / 4) * kHalf + off),
                       kk > 0);
  }
}

template <class T>
__device__ inline void issue_pv(float (&o)[kD / 2], const uint32_t (&pa)[kKeys / 16][4], uint32_t v_addr) {
#pragma unroll
  for (int ks = 0; ks < kKeys / 16; ++ks) wgmma_rs_tb<T, kD>(o, pa[ks], desc_mn_major(v_addr + ks * 16 * 128, kHalf), 1);
}

// One consumer warpgroup (cw = 0, 1) over the CTA's items: rows 64 cw .. 64 cw + 63 of each.
template <class T>
__device__ void consume(const AttnParams& p, int cw, int32_t max_tiles, int32_t tile_tokens, int32_t n_items,
                        unsigned char* base) {
  const int wt = threadIdx.x % 128, warp = wt / 32, lane = wt % 32, g = lane / 4, t = lane % 4;
  const int32_t* skpos = reinterpret_cast<const int32_t*>(base + Smem::kpos);
  const int32_t* smask = reinterpret_cast<const int32_t*>(base + Smem::mask);
  const Rings bars(base);
  auto k_addr = [&](int st) { return smem_u32(base + Smem::k + st * kTileBytes); };
  auto v_addr = [&](int st) { return smem_u32(base + Smem::v + st * kTileBytes); };
  auto release = [&](uint64_t* bar) {  // every consumer warp's reads of the buffer are done
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  // This thread's two rows in the item: 64 cw + 16 warp + g and + 8 (wgmma.cuh's accumulator layout).
  int32_t row[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) row[hf] = cw * 64 + warp * 16 + hf * 8 + g;

  if (cw == 0) turn_give(0);  // consumer 0 takes the first MMA turn
  int32_t tc = 0, k = 0;      // key tiles and items consumed, as the producer counts them
  for (int32_t r = 0; int64_t(r) * gridDim.x < n_items; ++r) {
    const int64_t w = round_item(r);
    if (w >= n_items) continue;
    const Item it = work_item(p, int32_t(w), max_tiles, tile_tokens);
    if (!it.live) continue;
    const int qb = k % 2;
    mbar_wait(&bars.q_full[qb], uint32_t(k / 2) & 1u);
    ++k;
    const int32_t n_tiles = reinterpret_cast<const int32_t*>(base + Smem::item_tiles)[qb];
    const uint32_t q_addr = smem_u32(base + Smem::q + qb * 2 * kQBufHalf + cw * kQHalf);
    int32_t qpos[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) qpos[hf] = it.min_pos + row[hf] / p.hg;

    float o[kD / 2];
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) o[i] = 0.f;
    RowState rs;
    if (n_tiles > 0) {
      float s[kKeys / 2];
      uint32_t pa[kKeys / 16][4];
      float alpha[2];
      // Tile 0: S, softmax, P (O is still 0: nothing to rescale).
      int st = tc % kStages;
      mbar_wait(&bars.k_full[st], uint32_t(tc / kStages) & 1u);
      wgmma_fence();
      issue_qk<T>(s, q_addr, k_addr(st));
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(s);
      mask_tile(s, skpos + st * kKeys, smask[st], qpos);
      release(&bars.k_empty[st]);
      online_softmax(s, rs, p.scale_log2, alpha);
      pack_p<T>(s, pa);

      for (int32_t j = 1; j < n_tiles; ++j) {
        const int32_t c = tc + j;
        st = c % kStages;
        const int pst = (c - 1) % kStages;
        mbar_wait(&bars.k_full[st], uint32_t(c / kStages) & 1u);
        turn_wait(cw);
        wgmma_fence();
        issue_qk<T>(s, q_addr, k_addr(st));
        wgmma_commit();
        mbar_wait(&bars.v_full[pst], uint32_t((c - 1) / kStages) & 1u);
        wgmma_fence();  // P and O were last written by ordinary instructions
        issue_pv<T>(o, pa, v_addr(pst));
        wgmma_commit();
        turn_give(1 - cw);
        wgmma_wait<1>();  // S_j is done; P_{j-1}·V_{j-1} may still run
        fence_regs(s);
        mask_tile(s, skpos + st * kKeys, smask[st], qpos);
        release(&bars.k_empty[st]);
        online_softmax(s, rs, p.scale_log2, alpha);
        wgmma_wait<0>();
        fence_regs(o);
        release(&bars.v_empty[pst]);
#pragma unroll
        for (int i = 0; i < kD / 8; ++i)
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            o[4 * i + 2 * hf] *= alpha[hf];
            o[4 * i + 2 * hf + 1] *= alpha[hf];
          }
        pack_p<T>(s, pa);
      }
      // The last tile's P·V.
      const int32_t last = tc + n_tiles - 1;
      mbar_wait(&bars.v_full[last % kStages], uint32_t(last / kStages) & 1u);
      wgmma_fence();
      issue_pv<T>(o, pa, v_addr(last % kStages));
      wgmma_commit();
      wgmma_wait<0>();
      fence_regs(o);
      release(&bars.v_empty[last % kStages]);
      tc += n_tiles;
    }
    release(&bars.q_empty[qb]);

    // Finalise: the quad's row sums, normalise, store (attention_prefill_mma.cu's epilogue). Rows
    // of heads past the unit or tokens past the tile hold junk Q and are not stored.
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float lt = rs.l[hf];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const int32_t tok = it.q0 + row[hf] / p.hg, h = row[hf] % p.hg;
      if (tok >= it.q1 || h >= it.nh) continue;
      const int64_t q_row = int64_t(it.qo0 + tok) * p.hq + it.h0 + h;
      const float inv = lt > 0.f ? 1.f / lt : 0.f;  // a row that attended nothing outputs 0
#pragma unroll
      for (int j = 0; j < kD / 8; ++j)
        mma::store_pair<T>(p, q_row * kD + 2 * t + 8 * j, o[4 * j + 2 * hf] * inv, o[4 * j + 2 * hf + 1] * inv);
      if (t == 0 && p.lse) p.lse[q_row] = lt > 0.f ? (rs.m[hf] + log2f(lt)) * kLn2 : kNegInf;
    }
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_wgmma_kernel(const AttnParams p, const __grid_constant__ CUtensorMap qmap,
                         const __grid_constant__ CUtensorMap kmap, const __grid_constant__ CUtensorMap vmap,
                         int32_t max_tiles, int32_t tile_tokens) {
  extern __shared__ unsigned char smem_raw[];
  unsigned char* base = align_atom(smem_raw);
  const int32_t n_items = max_tiles * p.hkv * p.chunks * p.batch;
  if (threadIdx.x == 0) {
    const Rings bars(base);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&bars.k_full[s], 1);  // the producer's arrival (+ the TMA bytes)
      mbar_init(&bars.v_full[s], 1);
      mbar_init(&bars.q_full[s], 1);
      mbar_init(&bars.k_empty[s], 2 * 4);  // every consumer warp
      mbar_init(&bars.v_empty[s], 2 * 4);
      mbar_init(&bars.q_empty[s], 2 * 4);
    }
    fence_mbar_init();
  }
  __syncthreads();

  const int wg = threadIdx.x / 128;
  if (wg == 0) {
    setmaxnreg_dec72();
    const int warp = threadIdx.x / 32;
    if (warp == 0) produce<T, true>(p, &qmap, &kmap, max_tiles, tile_tokens, n_items, base);
    if (warp == 1) produce<T, false>(p, &qmap, &vmap, max_tiles, tile_tokens, n_items, base);
  } else {
    setmaxnreg_inc216();
    consume<T>(p, wg - 1, max_tiles, tile_tokens, n_items, base);
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
                                           int ctas, cudaStream_t stream, std::string* why) {
  if (tile_tokens < 1 || tile_tokens * p.hg > kRows) return cudaErrorInvalidConfiguration;
  const int64_t n_items = int64_t(max_tiles) * p.hkv * p.chunks * p.batch;
  if (n_items > INT32_MAX) {
    if (why) *why = std::to_string(n_items) + " query tiles exceed the kernel's int32 work index";
    return cudaErrorInvalidConfiguration;
  }
  CUtensorMap maps[3];
  const auto fail = [&](std::string e) {
    if (why) *why = std::move(e);
    return cudaErrorInvalidValue;
  };
  if (std::string e = encode_query_tensor_map({p.q, kv_dt, p.n_q_tokens, p.hq, p.d}, p.hg, tile_tokens, &maps[0]);
      !e.empty())
    return fail(e);
  const void* pools[2] = {p.k, p.v};
  for (int i = 0; i < 2; ++i) {
    const PagedPoolView view{pools[i], kv_dt, p.d, p.page_size, p.hkv, p.page_capacity, p.pages};
    if (std::string e = encode_paged_tensor_map(view, p.page_size, &maps[i + 1]); !e.empty()) return fail(e);
  }
  if (ctas <= 0) {
    int dev = 0;
    if (cudaError_t e = cudaGetDevice(&dev); e != cudaSuccess) return e;
    if (cudaError_t e = cudaDeviceGetAttribute(&ctas, cudaDevAttrMultiProcessorCount, dev); e != cudaSuccess) return e;
  }
  return dispatch_storage16(kv_dt, [&](auto tag) -> cudaError_t {
    using T = typename decltype(tag)::type;
    auto kernel = prefill_wgmma_kernel<T>;
    if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Smem::launch_bytes));
        e != cudaSuccess)
      return e;
    // Persistent: by default one CTA per SM (the shared memory allows one), each walking the items.
    const unsigned grid = unsigned(std::min<int64_t>(n_items, std::max(ctas, 1)));
    kernel<<<grid, kThreads, Smem::launch_bytes, stream>>>(p, maps[0], maps[1], maps[2], max_tiles, tile_tokens);
    return cudaGetLastError();
  });
}

}  // namespace sieve::kernels::cuda::sm90
