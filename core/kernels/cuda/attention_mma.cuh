// What the tensor-core attention kernels share (attention_decode_mma.cu, attention_prefill_mma.cu):
// the sm_80+ warp-level primitives (16-byte cp.async with zero fill, ldmatrix, mma.sync
// m16n8k16 with f32 accumulation), the padded shared-memory tile of K or V, and the key list a
// CTA walks (dense: every visible key; block-sparse: the pages of the selected key blocks,
// concatenated, so sparse work packs into full tiles).
//
// Fragment layouts are PTX's for mma.m16n8k16 (.row.col): lane = 4 * g + t (g = lane / 4,
// t = lane % 4). A (16 x 16): a0 = (g, 2t..2t+1), a1 = (g+8, 2t..), a2 = (g, 2t+8..), a3 = (g+8,
// 2t+8..). B (16 x 8): b0 = (2t..2t+1, g), b1 = (2t+8.., g). C (16 x 8): c0,c1 = (g, 2t..2t+1),
// c2,c3 = (g+8, 2t..2t+1). Internal to core/kernels/cuda.
#pragma once
#include <cstdint>
#include <type_traits>

#include "attention_cuda_common.cuh"

namespace sieve::kernels::cuda::mma {

constexpr int kTileKeys = 64;  // keys per K/V tile in shared memory

// Row stride of a K/V/Q tile in shared memory, in elements: head_dim plus 16 bytes, so the 8 rows
// an ldmatrix reads start in 8 different 16-byte bank groups (no conflicts), and every row start
// stays 16-byte aligned for cp.async.
template <int D>
__host__ __device__ constexpr int smem_stride() {
  return D + 8;
}

__device__ inline uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously; `bytes` = 0 writes zeros and reads nothing (masked
// keys must be finite zeros: a NaN in a padded page would survive P = 0 in the P·V product).
__device__ inline void cp_async16(void* smem, const void* gmem, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a · b over one 16x8x16 step, f32 accumulation; T is the 16-bit operand type.
template <class T>
__device__ inline void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ inline void mma16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                               uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ inline void mma16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two f32 -> one register of two 16-bit values, `lo` in the low half (the lower column).
template <class T>
__device__ inline uint32_t pack2(float lo, float hi);
template <>
__device__ inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ inline uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Stores out[i], out[i + 1]: one 4-byte store when out has the kernels' 16-bit type.
template <class T>
__device__ inline void store_pair(const AttnParams& p, int64_t i, float a, float b) {
  if (p.out_dt == storage_of_type<T>()) {
    *reinterpret_cast<uint32_t*>(static_cast<T*>(p.out) + i) = pack2<T>(a, b);
  } else {
    store_storage(p.out, p.out_dt, i, a);
    store_storage(p.out, p.out_dt, i + 1, b);
  }
}

// ---- the key list of one CTA ------------------------------------------------------------------

// Page slots (pages of the key list) resolved at a time into shared memory: the loaders then find
// a key's physical page with one shared-memory read instead of dependent global reads per key row.
constexpr int kSlots = 512;

// The keys one (query token or query tile, selection row) attends, as a list of "virtual keys":
// dense, virtual key i is position i (i < limit); block-sparse, the pages of the row's selected
// key blocks concatenated (entry e's block contributes k_block_pages pages, each page_size keys),
// up to the last block that starts before `limit`. Virtual key i lies in page slot i / page_size;
// a slot resolves to a physical page and the position of its first key. Keys past the sequence,
// past `limit` or in a bad entry (recorded) are invalid: the loader zero-fills them and the
// scores mask them.
struct KeyList {
  int32_t b, page_base, n_pages, limit;
  int64_t row;              // selection row, -1: dense
  int32_t begin, n_blocks;  // the row's first entry; key blocks of the sequence
  int32_t n_keys;           // virtual keys

  __device__ void init_dense(int32_t b_, int32_t page_base_, int32_t n_pages_, int32_t limit_) {
    b = b_;
    page_base = page_base_;
    n_pages = n_pages_;
    limit = limit_;
    row = -1;
    begin = n_blocks = 0;
    n_keys = max(limit_, 0);
  }

  // Warp-uniform: every lane of the calling warp passes the same row.
  __device__ void init_sparse(const AttnParams& p, int32_t b_, int32_t page_base_, int32_t n_pages_,
                              int32_t limit_, int64_t row_) {
    int32_t begin_, end_;
    selection_row_range(p, row_, begin_, end_);
    init_sparse(p, b_, page_base_, n_pages_, limit_, row_, begin_, end_);
  }
  // The same with the row's indptr entries already loaded by the caller (validated here).
  __device__ void init_sparse(const AttnParams& p, int32_t b_, int32_t page_base_, int32_t n_pages_,
                              int32_t limit_, int64_t row_, int32_t begin_, int32_t end) {
    b = b_;
    page_base = page_base_;
    n_pages = n_pages_;
    limit = limit_;
    row = row_;
    begin = begin_;
    check_row_range(p, row, begin, end);
    n_blocks = ceil_div_d(n_pages, p.k_block_pages);
    // Entries are increasing: drop those whose block starts at or past the limit (a warp-parallel
    // search; a malformed row only changes how many keys are visited, each entry is checked when
    // used). When the last block of the sequence starts before the limit (decode: the limit is
    // the sequence's end), no valid entry is dropped and nothing is searched.
    const int32_t block_keys = p.k_block_pages * p.page_size;
    int32_t last = end;
    if (int64_t(n_blocks - 1) * block_keys >= limit)
      last = warp_partition_point(begin, end, [&](int32_t e) {
        return int64_t(__ldg(p.sel_indices + e)) * block_keys < limit;
      });
    n_keys = (last - begin) * block_keys;
  }

  __device__ int32_t slot_of(const AttnParams& p, int32_t i) const {
    return p.page_shift >= 0 ? i >> p.page_shift : i / p.page_size;
  }

  // Slot -> physical page (-1: invalid) and the position of its first key.
  __device__ int32_t resolve_slot(const AttnParams& p, int32_t slot, int32_t& pos0) const {
    int32_t lpage = slot;
    if (row >= 0) {
      const int32_t kbp = p.k_block_pages;
      const int32_t e = slot / kbp;
      const int32_t j = selected_block(p, row, begin, begin + e, n_blocks);
      if (j < 0) return -1;
      lpage = j * kbp + (slot - e * kbp);
      if (lpage >= n_pages) return -1;  // the sequence's last block is short
    }
    pos0 = lpage * p.page_size;
    if (pos0 >= limit) return -1;
    return physical_page(p, b, page_base, lpage);
  }
};

// Tiles [t0, t1) of a key list in chunks whose page slots fit the slot table; slots of the chunk
// holding tile t0: [first, first + count).
struct SlotChunk {
  int32_t t0, t1, first, count;
};
__device__ inline int32_t tiles_per_chunk(const AttnParams& p) {
  // A span of n tiles touches at most n * kTileKeys / page_size + 2 slots.
  return max(1, int32_t((int64_t(kSlots - 2) * p.page_size) / kTileKeys));
}
__device__ inline SlotChunk slot_chunk(const AttnParams& p, const KeyList& keys, int32_t t0, int32_t t_end) {
  SlotChunk c;
  c.t0 = t0;
  c.t1 = min(t_end, t0 + tiles_per_chunk(p));
  c.first = keys.slot_of(p, t0 * kTileKeys);
  const int32_t last_key = min(c.t1 * kTileKeys, keys.n_keys) - 1;
  c.count = last_key >= t0 * kTileKeys ? keys.slot_of(p, last_key) - c.first + 1 : 0;
  return c;
}

// Every thread of the CTA: resolves the chunk's slots into the table (phys, pos0); the caller
// puts a barrier before (the previous chunk's table is no longer read) and after.
template <int NT>
__device__ inline void fill_slots(const AttnParams& p, const KeyList& keys, const SlotChunk& c,
                                  int32_t* phys, int32_t* pos0) {
  for (int i = threadIdx.x; i < c.count; i += NT) {
    int32_t q0 = 0;
    phys[i] = keys.resolve_slot(p, c.first + i, q0);
    pos0[i] = q0;
  }
}

// Copies K and V of virtual keys [k0, k0 + kTileKeys) into shared tiles sk / sv
// ([kTileKeys][smem_stride<D>()]), asynchronously, zeros for invalid keys, finding each key's page
// in the chunk's slot table. kpos[c] receives the position of column c (INT32_MAX when invalid),
// written with ordinary stores: a barrier makes it visible. Every thread of the CTA (NT threads)
// calls it; each returns the largest kpos of the key rows it loaded.
template <class T, int D, int NT, int UNROLL = kTileKeys>
__device__ inline int32_t load_kv_tile(const AttnParams& p, const KeyList& keys, const SlotChunk& chunk,
                                       const int32_t* phys, const int32_t* pos0, int32_t kvh,
                                       int32_t k0, T* sk, T* sv, int32_t* kpos) {
  constexpr int CPR = D / 8;         // 16-byte chunks per key row
  constexpr int RPP = NT / CPR;      // key rows per pass of the CTA
  static_assert(NT % CPR == 0 && kTileKeys % RPP == 0, "tile rows must divide among the threads");
  constexpr int S = smem_stride<D>();
  const int c = threadIdx.x % CPR;
  const T* kbase = static_cast<const T*>(p.k);
  const T* vbase = static_cast<const T*>(p.v);
  const int32_t P = p.page_size;
  int32_t max_pos = -1;
#pragma unroll UNROLL
  for (int i = 0; i < kTileKeys / RPP; ++i) {
    const int r = int(threadIdx.x) / CPR + i * RPP;
    const int32_t key = k0 + r;
    int32_t kp = INT32_MAX;
    int64_t src = 0;
    if (key < keys.n_keys) {
      const int32_t slot = keys.slot_of(p, key);
      const int32_t ph = phys[slot - chunk.first];
      const int32_t off = key - slot * P;
      const int32_t pos = pos0[slot - chunk.first] + off;
      if (ph >= 0 && pos < keys.limit) {
        kp = pos;
        src = p.pages.row(ph, kvh, off) + c * 8;
      }
    }
    const int bytes = kp != INT32_MAX ? 16 : 0;
    cp_async16(sk + r * S + c * 8, kbase + src, bytes);
    cp_async16(sv + r * S + c * 8, vbase + src, bytes);
    if (c == 0) kpos[r] = kp;
    max_pos = max(max_pos, kp);
  }
  return max_pos;
}

// ---- the rows of a tensor-core prefill CTA (attention_prefill_mma.cu, attention_variant_mma.cu) --
// ROWS rows = query tokens tok0.. x heads h0 .. h0 + nh - 1 (row = token * nh + head); each of
// the 4 warps owns 32 rows as MT m16 tiles, a lane the rows 32 * warp + 16 * mt + 8 * hf + g.

// The Q tile into sq ([ROWS][smem_stride<D>()]), asynchronously (zeros past n_rows); the caller
// commits it with its first K/V tile.
template <class T, int D, int ROWS>
__device__ inline void load_q_tile(const AttnParams& p, T* sq, int32_t tok0, int32_t h0, int32_t nh, int32_t n_rows) {
  constexpr int S = smem_stride<D>();
  constexpr int CPR = D / 8;
  const T* qbase = static_cast<const T*>(p.q);
  for (int i = threadIdx.x; i < ROWS * CPR; i += kThreads) {
    const int row = i / CPR, c = i % CPR;
    const bool ok = row < n_rows;
    const int64_t src = ok ? (int64_t(tok0 + row / nh) * p.hq + h0 + row % nh) * D + c * 8 : 0;
    cp_async16(sq + row * S + c * 8, qbase + src, ok ? 16 : 0);
  }
}

// The online softmax's state of a lane's rows, empty: o = 0, m = -inf, l = 0.
template <int D, int MT>
__device__ __forceinline__ void init_rows(float (&o)[MT][D / 8][4], float (&m)[MT][2], float (&l)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int nb = 0; nb < D / 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nb][e] = 0.f;
    m[mt][0] = m[mt][1] = kNegInf;
    l[mt][0] = l[mt][1] = 0.f;
  }
}

// Finalise a lane's rows: the quad's row sums, normalise, store out (and lse when asked); a row
// that attended nothing outputs 0 (lse -inf).
template <class T, int D, int MT>
__device__ inline void store_rows(const AttnParams& p, float (&o)[MT][D / 8][4], const float (&m)[MT][2],
                                  const float (&l)[MT][2], int32_t tok0, int32_t h0, int32_t nh, int32_t n_rows) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float lt = l[mt][hf];
      lt += __shfl_xor_sync(0xffffffffu, lt, 1);
      lt += __shfl_xor_sync(0xffffffffu, lt, 2);
      const int row = warp * 32 + mt * 16 + hf * 8 + g;
      if (row >= n_rows) continue;
      const int32_t tok = tok0 + row / nh;
      const int32_t h = h0 + row % nh;
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      const int64_t base = (int64_t(tok) * p.hq + h) * D + 2 * t;
#pragma unroll
      for (int nb = 0; nb < D / 8; ++nb)
        store_pair<T>(p, base + nb * 8, o[mt][nb][2 * hf] * inv, o[mt][nb][2 * hf + 1] * inv);
      if (t == 0 && p.lse)
        p.lse[int64_t(tok) * p.hq + h] = lt > 0.f ? (m[mt][hf] + log2f(lt)) * kLn2 : kNegInf;
    }
}

// ---- one online-softmax step of the tensor-core prefill kernels -------------------------------

// A warp's step over 32 keys (columns c0 .. c0 + 31 of a K/V tile in shared memory): S = Q·Kᵀ for
// its MT m16 row tiles (rows 32 * warp + 16 * mt of sq), then `logits(s)` turns the raw scores
// s[mt][n8 block][c-fragment] into log2-domain logits in place (scale, bias; -inf where masked),
// then the running max m, the running sum l (this lane's columns; the quad is summed at the end)
// and the output o are rescaled and O += P·V with P straight from the score registers.
// Shared by attention_prefill_mma.cu and the deltakv plugin's tensor-core kernel.
template <class T, int D, int MT, class Logits>
__device__ __forceinline__ void softmax_step32(const T* sq, const T* tk, const T* tv, int c0, int warp,
                                               int lane, float (&o)[MT][D / 8][4], float (&m)[MT][2],
                                               float (&l)[MT][2], Logits&& logits) {
  constexpr int S = smem_stride<D>();
  constexpr int KS = D / 16;
  constexpr int NB = D / 8;
  constexpr int HB = 4;  // n8 blocks in 32 keys
  float s[MT][HB][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nb = 0; nb < HB; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][nb][e] = 0.f;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    uint32_t qa[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
      ldmatrix_x4(qa[mt], sq + (warp * 32 + mt * 16 + (lane & 15)) * S + kk * 16 + (lane >> 4) * 8);
#pragma unroll
    for (int np = 0; np < HB / 2; ++np) {
      uint32_t kb[4];
      ldmatrix_x4(kb, tk + (c0 + np * 16 + (lane & 7) + (lane >> 4) * 8) * S + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(s[mt][2 * np], qa[mt], kb[0], kb[1]);
        mma16816<T>(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
      }
    }
  }
  logits(s);

  uint32_t pa[MT][HB / 2][4];  // P as the A operand of P·V, per 16-key step
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float mx = -__builtin_huge_valf();
#pragma unroll
      for (int nb = 0; nb < HB; ++nb) mx = fmaxf(mx, fmaxf(s[mt][nb][2 * hf], s[mt][nb][2 * hf + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[mt][hf], mx);
      const float m_use = m_new == -__builtin_huge_valf() ? 0.f : m_new;  // nothing visible yet: p = 0
      const float alpha = exp2f(m[mt][hf] - m_use);
      m[mt][hf] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nb = 0; nb < HB; ++nb)
#pragma unroll
        for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
          s[mt][nb][e] = exp2f(s[mt][nb][e] - m_use);
          sum += s[mt][nb][e];
        }
      l[mt][hf] = l[mt][hf] * alpha + sum;
#pragma unroll
      for (int nb = 0; nb < NB; ++nb) {
        o[mt][nb][2 * hf] *= alpha;
        o[mt][nb][2 * hf + 1] *= alpha;
      }
    }
#pragma unroll
    for (int ks = 0; ks < HB / 2; ++ks) {
      pa[mt][ks][0] = pack2<T>(s[mt][2 * ks][0], s[mt][2 * ks][1]);
      pa[mt][ks][1] = pack2<T>(s[mt][2 * ks][2], s[mt][2 * ks][3]);
      pa[mt][ks][2] = pack2<T>(s[mt][2 * ks + 1][0], s[mt][2 * ks + 1][1]);
      pa[mt][ks][3] = pack2<T>(s[mt][2 * ks + 1][2], s[mt][2 * ks + 1][3]);
    }
  }
#pragma unroll
  for (int ks = 0; ks < HB / 2; ++ks) {
#pragma unroll
    for (int np = 0; np < D / 16; ++np) {
      uint32_t vb[4];
      ldmatrix_x4_trans(vb, tv + (c0 + ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * S + np * 16 + (lane >> 4) * 8);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma16816<T>(o[mt][2 * np], pa[mt][ks], vb[0], vb[1]);
        mma16816<T>(o[mt][2 * np + 1], pa[mt][ks], vb[2], vb[3]);
      }
    }
  }
}

// ---- launching a tensor-core kernel ------------------------------------------------------------

// f(type tag of T, std::integral_constant<int, D>) for the 16-bit storage kv_dt and head_dim d of
// 64 or 128; f32 storage or another head_dim is cudaErrorInvalidValue (the host plans the FMA
// kernels there).
template <class F>
cudaError_t dispatch_mma(Storage kv_dt, int32_t d, F&& f) {
  return dispatch_cuda_storage(kv_dt, [&](auto t) -> cudaError_t {
    using T = typename decltype(t)::type;
    if constexpr (std::is_same_v<T, float>) {
      return cudaErrorInvalidValue;
    } else {
      switch (d) {
        case 64: return f(t, std::integral_constant<int, 64>{});
        case 128: return f(t, std::integral_constant<int, 128>{});
        default: return cudaErrorInvalidValue;
      }
    }
  });
}

// Launches Kernel (kThreads threads a CTA) with `smem` bytes of dynamic shared memory, raising its
// limit once per device.
template <auto Kernel, class... Args>
cudaError_t launch_mma(dim3 grid, size_t smem, cudaStream_t stream, const Args&... args) {
  static unsigned long long smem_set = 0;  // devices whose limit is raised
  if (cudaError_t e = allow_dynamic_smem(Kernel, smem, smem_set); e != cudaSuccess) return e;
  Kernel<<<grid, kThreads, smem, stream>>>(args...);
  return cudaGetLastError();
}

// ---- a prefill-shaped tensor-core CTA (attention_prefill_mma.cu, attention_variant_mma.cu) ----
// Grid (query tile, head unit, sequence).
inline dim3 prefill_grid(const AttnParams& p, int32_t max_tiles) {
  return dim3(unsigned(max_tiles), unsigned(p.hkv * p.chunks), unsigned(p.batch));
}

// Launches a kernel of that shape for kv_dt and p.d: K<T, D>::kernel(p, tile_tokens) with
// K<T, D>::bytes of shared memory (K: its shared-memory layout), tile_tokens tokens x p.hg heads a
// CTA.
template <template <class, int> class K>
cudaError_t launch_prefill_tiles(const AttnParams& p, Storage kv_dt, int32_t max_tiles, int32_t tile_tokens,
                                 cudaStream_t stream) {
  if (tile_tokens < 1 || tile_tokens * p.hg > kMmaPrefillRows) return cudaErrorInvalidConfiguration;
  return dispatch_mma(kv_dt, p.d, [&](auto t, auto d) {
    using Kernel = K<typename decltype(t)::type, decltype(d)::value>;
    return launch_mma<Kernel::kernel>(prefill_grid(p, max_tiles), Kernel::bytes, stream, p, tile_tokens);
  });
}

// Its shared memory: the Q tile [ROWS][S], two stages of K and V tiles [kTileKeys][S], then the
// kernel's own arrays from `rest` (16-byte aligned).
template <class T, int D, int ROWS>
struct PrefillTiles {
  static constexpr int S = smem_stride<D>();
  static constexpr int tile = kTileKeys * S;  // elements of one K or V tile
  static constexpr size_t q_bytes = size_t(ROWS) * S * sizeof(T);
  static constexpr size_t bytes = q_bytes + 2 * 2 * size_t(tile) * sizeof(T);  // K and V, two stages
  T* sq;
  T* sk;  // stage st at sk + st * tile
  T* sv;
  unsigned char* rest;
  __device__ explicit PrefillTiles(unsigned char* smem)
      : sq(reinterpret_cast<T*>(smem)), sk(reinterpret_cast<T*>(smem + q_bytes)), sv(sk + 2 * tile),
        rest(smem + bytes) {}
};

}  // namespace sieve::kernels::cuda::mma
