// The tensor-core row kernel: attention of single query tokens (decode, and prefill rows listed
// in q_rows) over the paged cache when q and K/V share a 16-bit dtype; mma.sync m16n8k16 with f32
// accumulation.
//
// One CTA per (work row, head unit, KV split), as the FMA row kernel (attention_row.cu). The head
// unit's query heads (a GQA group of up to 16, or one head for PER_Q_HEAD selections) are the 16
// rows of the MMA's A operand, so the group shares every K/V load. The CTA streams its split of
// the key list (mma::KeyList: dense keys, or the selected pages packed) in tiles of 64 keys
// through a 3-stage cp.async ring (2 tiles in flight while one is computed), finding each key's
// page in a slot table it resolves in parallel per chunk of 512 pages (one shared-memory read per
// key row; resolving page ids per key row with dependent global reads made the first version
// latency-bound at ~65% of bandwidth). Each of the 4 warps takes 16 keys of every tile with its
// own online softmax (S = Q·Kᵀ from ldmatrix'd K, P·V from ldmatrix.trans'd V, P kept in
// registers), and the warps merge through shared memory at the end.
// With one split the CTA writes out and lse. With several, on sm_90 and up to
// row_mma_cluster_splits() of them, the splits of one (row, head unit) are one thread-block
// cluster: each leaves its normalised partial state in its shared memory, and after a cluster
// barrier every used split merges a slice of the unit's outputs reading the others' states
// through distributed shared memory (no global partials, no second kernel, no scratch to
// allocate). With more splits, a partial state goes to global memory for launch_split_combine(),
// launched as a programmatic dependent of this kernel: the CTAs allow it once their K/V are read,
// so its launch overlaps their epilogue. The kernel itself is launched as a programmatic dependent
// of whatever kernel precedes it on the stream (its first instruction waits for that kernel), so
// its CTAs are scheduled while that kernel drains instead of after it. When page statistics
// are asked for, every logit is also stored (AttnParams::logits), so the statistics come from this
// pass (launch_page_mass_from_logits).
// A row whose key list is short uses fewer splits (split_min_keys), so a sparse selection is not
// spread over CTAs that would each do almost nothing; a row short enough for one split is written
// by the row kernel and skipped by the combine (AttnParams::split_used), so a short block-sparse
// row pays neither a merge nor a partial state's round trip.
#include <cooperative_groups.h>

#include "attention_mma.cuh"

namespace sieve::kernels::cuda {
namespace {

using namespace mma;

constexpr int kWarps = kThreads / 32;
constexpr int kStages = 3;
constexpr int kRows = kMmaRowHeads;  // query heads per CTA: one m16 tile

template <int D>
struct RowMmaSmem {
  static constexpr int S = smem_stride<D>();
  static constexpr int tile = kTileKeys * S;  // elements of one K or V tile
  static constexpr size_t kv_bytes = size_t(kStages) * 2 * tile * 2;
  // The warps' partial states [warps][rows][D] + m, l [warps][rows], over the K/V ring after it.
  static constexpr size_t merge_bytes = (size_t(kWarps) * kRows * D + 2 * kWarps * kRows) * 4;
  static constexpr size_t ring_bytes = kv_bytes > merge_bytes ? kv_bytes : merge_bytes;
  static constexpr size_t q_bytes = size_t(kRows) * S * 2;
  static constexpr size_t kpos_bytes = size_t(kStages) * kTileKeys * 4;
  static constexpr size_t slot_bytes = 2 * size_t(kSlots) * 4;
  static constexpr size_t bytes = ring_bytes + q_bytes + kpos_bytes + slot_bytes;
  // The CTA's merged partial state for the cluster merge: out [rows][D] and the log2-domain lse
  // [rows], after the warps' states in the ring.
  static constexpr size_t part_at = merge_bytes;
  static_assert(part_at + (size_t(kRows) * D + kRows) * 4 <= ring_bytes, "the partial state fits in the ring");
};

// The cluster merge (AttnParams::cluster_merge): every CTA of the cluster (the splits of one row
// and head unit, cluster rank = split) has its normalised partial out [nh][D] and log2-domain lse
// in `part` / `part_lse` of its shared memory. The used splits (rank < n_used) each merge a slice
// of the nh x D outputs by log-sum-exp over the used ranks' states, read through distributed
// shared memory, and write out and lse. Two cluster barriers: the states are complete before
// anyone reads them, and no CTA exits while another still reads its shared memory.
template <int D>
__device__ inline void cluster_merge(const AttnParams& p, int32_t tok, int32_t h0, int32_t nh, int32_t split,
                                     int32_t n_used, float* part, float* part_lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  cl.sync();  // release / acquire: every CTA's state is visible cluster-wide
  if (split < n_used) {
    const float* rp[kMaxClusterSplits];
    const float* rl[kMaxClusterSplits];
#pragma unroll
    for (int s = 0; s < kMaxClusterSplits; ++s) {
      const unsigned rank = unsigned(s < n_used ? s : 0);
      rp[s] = cl.map_shared_rank(part, rank);
      rl[s] = cl.map_shared_rank(part_lse, rank);
    }
    for (int i = split * kThreads + int(threadIdx.x); i < nh * D; i += n_used * kThreads) {
      const int row = i / D, d = i % D;
      float ls[kMaxClusterSplits];
      float mx = kNegInf;
#pragma unroll
      for (int s = 0; s < kMaxClusterSplits; ++s) {
        ls[s] = s < n_used ? rl[s][row] : kNegInf;
        mx = fmaxf(mx, ls[s]);
      }
      float sum = 0.f, o = 0.f;
      if (mx != kNegInf) {
#pragma unroll
        for (int s = 0; s < kMaxClusterSplits; ++s) {
          if (ls[s] == kNegInf) continue;  // an idle or empty split: weight 0
          const float w = exp2f(ls[s] - mx);
          sum += w;
          o = fmaf(w, rp[s][row * D + d], o);
        }
      }
      const int32_t h = h0 + row;
      store_storage(p.out, p.out_dt, (int64_t(tok) * p.hq + h) * D + d, sum > 0.f ? o / sum : 0.f);
      if (d == 0) {
        const float lse = sum > 0.f ? (mx + log2f(sum)) * kLn2 : kNegInf;
        if (p.lse) p.lse[int64_t(tok) * p.hq + h] = lse;
        if (p.lse_all) p.lse_all[int64_t(tok) * p.hq + h] = lse;
      }
    }
  }
  cl.sync();  // the other CTAs' shared memory is no longer read
#endif
}

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 2) row_mma_kernel(const AttnParams p) {
  using L = RowMmaSmem<D>;
  constexpr int S = L::S;
  constexpr int KS = D / 16;  // k-steps of Q·Kᵀ over head_dim
  constexpr int NB = D / 8;   // n-blocks of the output row
  extern __shared__ __align__(16) unsigned char smem[];
  T* sk = reinterpret_cast<T*>(smem);
  T* sv = sk + kStages * L::tile;
  T* sq = reinterpret_cast<T*>(smem + L::ring_bytes);
  int32_t* skpos = reinterpret_cast<int32_t*>(smem + L::ring_bytes + L::q_bytes);
  int32_t* sphys = skpos + kStages * kTileKeys;  // the chunk's slot table
  int32_t* spos0 = sphys + kSlots;

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int32_t units = p.hkv * p.chunks;
  const int32_t r = blockIdx.x / units;
  const int32_t unit = blockIdx.x % units;
  const int32_t split = blockIdx.y;
  // Everything below may read what the previous kernel on the stream wrote (a programmatic
  // dependent launch): nothing is loaded before this.
  pdl_wait();

  int32_t tok;
  if (!row_token(p, r, tid == 0 && unit == 0 && split == 0, &tok)) return;  // the whole cluster
  const auto [kvh, h0, nh] = head_unit(p, unit);
  // With one query per row block (decode) the selection row follows from the token alone: its
  // indptr entries are loaded here, in flight with the sequence's page-table reads below instead
  // of one dependent round trip after them.
  const bool early_row = p.sel_heads >= 0 && p.q_block == 1;
  const int64_t sel_row = early_row ? int64_t(tok) * p.sel_h + row_head(p, h0) : -1;
  const int32_t sel_begin = early_row ? __ldg(p.sel_indptr + sel_row) : 0;
  const int32_t sel_end = early_row ? __ldg(p.sel_indptr + sel_row + 1) : 0;
  const QueryToken qt = query_token(p, tok);

  // The queries' loads go out first: their latency overlaps the key list's setup below.
  constexpr int kQChunks = kRows * (D / 8) / kThreads;
  static_assert(kQChunks * kThreads == kRows * (D / 8), "query chunks divide among the threads");
  uint4 qreg[kQChunks];
  {
    const T* qbase = static_cast<const T*>(p.q);
#pragma unroll
    for (int j = 0; j < kQChunks; ++j) {
      const int i = tid + j * kThreads, row = i / (D / 8), c = i % (D / 8);
      qreg[j] = row < nh ? __ldg(reinterpret_cast<const uint4*>(qbase + (int64_t(tok) * p.hq + h0 + row) * D) + c)
                         : make_uint4(0, 0, 0, 0);
    }
  }

  KeyList keys;
  if (p.sel_heads < 0) {
    keys.init_dense(qt.b, qt.page_base, qt.n_pages, qt.limit);
  } else {
    if (early_row) {
      keys.init_sparse(p, qt.b, qt.page_base, qt.n_pages, qt.limit, sel_row, sel_begin, sel_end);
    } else {
      const int64_t row = query_row(p, qt) * p.sel_h + row_head(p, h0);
      keys.init_sparse(p, qt.b, qt.page_base, qt.n_pages, qt.limit, row);
    }
  }
  // Splits this row uses: from its own key count, decided here on the device (the host planned
  // n_splits from the longest dense row and never sees a selection's row lengths).
  int32_t n_used = p.n_splits;
  if (p.split_min_keys > 0) n_used = max(1, min(p.n_splits, ceil_div_d(keys.n_keys, p.split_min_keys)));
  if (p.split_used && split == 0 && tid == 0) p.split_used[int64_t(r) * units + unit] = n_used;
  const bool direct = n_used == 1;  // one split: out and lse are written here, no combine
  // n_used is the same in every CTA of a cluster (it follows the row): all of them take part in
  // the cluster merge's barriers, or (one split) none does and the idle ones leave now.
  const bool cluster = p.cluster_merge && !direct;
  // The row is short: the combine does not read this split; in a cluster merge it holds an empty
  // state (no tiles below) that nobody reads.
  if (split >= n_used && !cluster) return;
  const int32_t tiles_all = ceil_div_d(keys.n_keys, kTileKeys);
  const int32_t per = ceil_div_d(tiles_all, n_used);
  const int32_t t_begin = min(split * per, tiles_all);
  const int32_t n_tiles = min(t_begin + per, tiles_all) - t_begin;

  // Queries of the unit's heads into shared memory (rows past nh are zero), loaded above.
#pragma unroll
  for (int j = 0; j < kQChunks; ++j) {
    const int i = tid + j * kThreads, row = i / (D / 8), c = i % (D / 8);
    *reinterpret_cast<uint4*>(sq + row * S + c * 8) = qreg[j];
  }
  __syncthreads();  // sq
  uint32_t qf[KS][4];
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) ldmatrix_x4(qf[kk], sq + (lane & 15) * S + kk * 16 + (lane >> 4) * 8);

  float o[NB][4];
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e) o[nb][e] = 0.f;
  float m[2] = {kNegInf, kNegInf}, l[2] = {0.f, 0.f};  // rows g and g + 8
  const int key0 = warp * 16;                           // this warp's keys in every tile
  // Where this unit's logits go (AttnParams::logits), or null.
  const int64_t logit_head_stride = int64_t(qt.n_pages) * p.page_size;
  float* const logits =
      p.logits ? p.logits + int64_t(qt.page_base) * p.page_size * p.hq + int64_t(h0) * logit_head_stride
               : nullptr;

  // The split's tiles, a slot-table chunk at a time; each chunk runs the cp.async ring from empty.
  for (int32_t c0 = t_begin; c0 < t_begin + n_tiles;) {
    const SlotChunk ch = slot_chunk(p, keys, c0, t_begin + n_tiles);
    c0 = ch.t1;
    __syncthreads();  // the previous chunk's tiles and slot table are no longer read
    fill_slots<kThreads>(p, keys, ch, sphys, spos0);
    __syncthreads();
    const int nt = ch.t1 - ch.t0;
    auto load = [&](int i, int st) {
      load_kv_tile<T, D, kThreads>(p, keys, ch, sphys, spos0, kvh, (ch.t0 + i) * kTileKeys, sk + st * L::tile,
                                   sv + st * L::tile, skpos + st * kTileKeys);
    };
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st < nt) load(st, st);
      cp_async_commit();  // an empty group keeps the wait counts uniform
    }
    for (int it = 0; it < nt; ++it) {
      cp_async_wait<kStages - 2>();  // this thread's copies of tile `it` landed
      __syncthreads();               // everyone's did, and tile it - 1's stage is free again
      {
        const int nx = it + kStages - 1;
        if (nx < nt) load(nx, nx % kStages);
        cp_async_commit();
      }
      const int st = it % kStages;
      const T* tk = sk + st * L::tile;
      const T* tv = sv + st * L::tile;
      const int32_t* kp = skpos + st * kTileKeys;

      // S = Q·Kᵀ for the warp's 16 keys: two n-blocks of 8 keys.
      float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int kk = 0; kk < KS; ++kk) {
        uint32_t b[4];
        ldmatrix_x4(b, tk + (key0 + (lane & 7) + (lane >> 4) * 8) * S + kk * 16 + ((lane >> 3) & 1) * 8);
        mma16816<T>(s[0], qf[kk], b[0], b[1]);
        mma16816<T>(s[1], qf[kk], b[2], b[3]);
      }
#pragma unroll
      for (int nb = 0; nb < 2; ++nb)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const bool valid = kp[key0 + nb * 8 + 2 * t + (e & 1)] != INT32_MAX;
          s[nb][e] = valid ? s[nb][e] * p.scale_log2 : kNegInf;
        }
      if (logits) {
        // Page statistics: the logits of (head h0 + row, key) for the reduction after the lse is
        // final. A lane holds keys 2t, 2t + 1 of a row: one 8-byte store when they are adjacent
        // positions (always on dense rows), so the quad fills whole 32-byte sectors.
#pragma unroll
        for (int nb = 0; nb < 2; ++nb) {
          const int32_t pos0 = kp[key0 + nb * 8 + 2 * t], pos1 = kp[key0 + nb * 8 + 2 * t + 1];
#pragma unroll
          for (int hf = 0; hf < 2; ++hf) {
            const int row = g + 8 * hf;
            if (row >= nh) continue;
            float* dst = logits + int64_t(row) * logit_head_stride;
            if (pos0 != INT32_MAX && pos1 == pos0 + 1 && (reinterpret_cast<uintptr_t>(dst + pos0) & 7) == 0) {
              *reinterpret_cast<float2*>(dst + pos0) = make_float2(s[nb][2 * hf], s[nb][2 * hf + 1]);
            } else {
              if (pos0 != INT32_MAX) dst[pos0] = s[nb][2 * hf];
              if (pos1 != INT32_MAX) dst[pos1] = s[nb][2 * hf + 1];
            }
          }
        }
      }

      // Online softmax (log2 domain) of rows g (hf 0) and g + 8 (hf 1); a row's 16 scores sit in
      // the 4 lanes of its quad.
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float mx = fmaxf(fmaxf(s[0][2 * hf], s[0][2 * hf + 1]), fmaxf(s[1][2 * hf], s[1][2 * hf + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[hf], mx);
        const float m_use = m_new == kNegInf ? 0.f : m_new;  // nothing visible yet: p = 0, no NaN
        const float alpha = exp2f(m[hf] - m_use);
        m[hf] = m_new;
        float sum = 0.f;
#pragma unroll
        for (int nb = 0; nb < 2; ++nb)
#pragma unroll
          for (int e = 2 * hf; e < 2 * hf + 2; ++e) {
            s[nb][e] = exp2f(s[nb][e] - m_use);
            sum += s[nb][e];
          }
        l[hf] = l[hf] * alpha + sum;
#pragma unroll
        for (int nb = 0; nb < NB; ++nb) {
          o[nb][2 * hf] *= alpha;
          o[nb][2 * hf + 1] *= alpha;
        }
      }

      // O += P·V: P (16 rows x 16 keys) is the A operand straight from the score registers.
      uint32_t a[4];
      a[0] = pack2<T>(s[0][0], s[0][1]);
      a[1] = pack2<T>(s[0][2], s[0][3]);
      a[2] = pack2<T>(s[1][0], s[1][1]);
      a[3] = pack2<T>(s[1][2], s[1][3]);
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, tv + (key0 + (lane & 7) + ((lane >> 3) & 1) * 8) * S + np * 16 + (lane >> 4) * 8);
        mma16816<T>(o[2 * np], a, b[0], b[1]);
        mma16816<T>(o[2 * np + 1], a, b[2], b[3]);
      }
    }
  }

  // Every K/V byte is read: the split combine or the next kernel on the stream (programmatic
  // dependent launches, waiting for this grid to finish and flush) may be scheduled now, so its
  // launch overlaps this epilogue.
  pdl_launch_dependents();

  // Merge the warps: partial states to shared memory (over the K/V ring), then per element.
  cp_async_wait<0>();
  __syncthreads();
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 1);
    l[hf] += __shfl_xor_sync(0xffffffffu, l[hf], 2);
  }
  float* so = reinterpret_cast<float*>(smem);  // [warps][rows][D]
  float* sm = so + kWarps * kRows * D;         // [warps][rows]
  float* sl = sm + kWarps * kRows;
#pragma unroll
  for (int nb = 0; nb < NB; ++nb)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      so[(warp * kRows + g + 8 * (e >> 1)) * D + nb * 8 + 2 * t + (e & 1)] = o[nb][e];
  if (t == 0) {
    sm[warp * kRows + g] = m[0];
    sm[warp * kRows + g + 8] = m[1];
    sl[warp * kRows + g] = l[0];
    sl[warp * kRows + g + 8] = l[1];
  }
  __syncthreads();

  float* part = reinterpret_cast<float*>(smem + L::part_at);  // cluster merge: [rows][D], lse [rows]
  float* part_lse = part + kRows * D;
  for (int i = tid; i < nh * D; i += kThreads) {
    const int row = i / D, d = i % D;
    float mx = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, sm[w * kRows + row]);
    float Lsum = 0.f, O = 0.f;
    if (mx != kNegInf) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wt = exp2f(sm[w * kRows + row] - mx);
        Lsum = fmaf(sl[w * kRows + row], wt, Lsum);
        O = fmaf(so[(w * kRows + row) * D + d], wt, O);
      }
    }
    const int32_t h = h0 + row;
    const float out = Lsum > 0.f ? O / Lsum : 0.f;  // a row that attended nothing outputs 0
    const float lse = Lsum > 0.f ? (mx + log2f(Lsum)) * kLn2 : kNegInf;
    if (cluster) {
      part[row * D + d] = out;
      if (d == 0) part_lse[row] = Lsum > 0.f ? mx + log2f(Lsum) : kNegInf;
    } else if (direct) {
      store_storage(p.out, p.out_dt, (int64_t(tok) * p.hq + h) * D + d, out);
      if (d == 0) {
        if (p.lse) p.lse[int64_t(tok) * p.hq + h] = lse;
        if (p.lse_all) p.lse_all[int64_t(tok) * p.hq + h] = lse;
      }
    } else {
      const int64_t slot = (int64_t(split) * p.n_work + r) * p.hq + h;
      p.part_o[slot * D + d] = out;
      if (d == 0) p.part_lse[slot] = lse;
    }
  }
  if (cluster) cluster_merge<D>(p, tok, h0, nh, split, n_used, part, part_lse);
}

template <class T, int D>
cudaError_t launch_d(const AttnParams& p, cudaStream_t stream) {
  constexpr size_t smem = RowMmaSmem<D>::bytes;
  static unsigned long long smem_set = 0;  // devices whose limit is raised
  if (cudaError_t e = allow_dynamic_smem(row_mma_kernel<T, D>, smem, smem_set); e != cudaSuccess) return e;
  const dim3 grid(unsigned(p.n_work) * unsigned(p.hkv * p.chunks), unsigned(p.n_splits));
  return launch_pdl(row_mma_kernel<T, D>, grid, smem, stream, p.cluster_merge ? unsigned(p.n_splits) : 1u, p);
}

template <class T>
cudaError_t launch_t(const AttnParams& p, cudaStream_t stream) {
  switch (p.d) {
    case 64: return launch_d<T, 64>(p, stream);
    case 128: return launch_d<T, 128>(p, stream);
    default: return cudaErrorInvalidValue;  // the host plans this kernel for 64 and 128 only
  }
}

}  // namespace

cudaError_t launch_row_attention_mma(const AttnParams& p, Storage kv_dt, cudaStream_t stream) {
  if (p.hg > kRows) return cudaErrorInvalidConfiguration;
  if (p.cluster_merge && p.n_splits > kMaxClusterSplits) return cudaErrorInvalidConfiguration;
  return dispatch_cuda_storage(kv_dt, [&](auto t) {
    using T = typename decltype(t)::type;
    if constexpr (std::is_same_v<T, float>) return cudaErrorInvalidValue;  // f32 storage: the FMA row kernel
    else return launch_t<T>(p, stream);
  });
}

void row_mma_resident_clusters(int (&resident)[kMaxClusterSplits + 1]) {
  for (int& r : resident) r = 0;
  // This build's kernels must hold sm_90 code (cluster_merge() is empty below) and the device
  // must have clusters. A failed query leaves no error behind: the combine kernel merges instead.
  int dev = 0, major = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
    return void(cudaGetLastError());
  if (major < 9) return;
  auto kernel = row_mma_kernel<__nv_bfloat16, 128>;
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess || fa.binaryVersion < 90) return void(cudaGetLastError());
  constexpr size_t smem = RowMmaSmem<128>::bytes;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)) != cudaSuccess)
    return void(cudaGetLastError());
  for (int s = 2; s <= kMaxClusterSplits; ++s) {
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(1, unsigned(s));
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr{};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = 1;
    attr.val.clusterDim.y = unsigned(s);
    attr.val.clusterDim.z = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&resident[s], kernel, &cfg) != cudaSuccess) {
      resident[s] = 0;
      cudaGetLastError();
    }
  }
}

}  // namespace sieve::kernels::cuda
