// vLLM-shaped inputs through the engine-pool store (issue 18 item 7; no vLLM needed): a ragged
// step of a new prompt, a decode and a chunked-prefill continuation, built the way vLLM v1's
// model runner hands them to an attention backend — block_table [num_reqs, max_blocks],
// slot_mapping [num_tokens] (block * block_size + offset), query_start_loc [num_reqs + 1],
// seq_lens [num_reqs] — with the new K/V written by slot_mapping as reshape_and_cache does, the
// block table converted to FlashInfer's CSR as vLLM's FlashInfer backend does (indptr = cumsum of
// cdiv(seq_len, block_size), indices = each row's first blocks, last_page_len = seq_len mod
// block_size or block_size), and the cache in each backend's layout. Dense attention through the
// runner matches an f64 reference computed from the tokens themselves (not from any pool) within
// the attention bound of tests/common; a layout the core kernel does not read yet is refused
// with its line, and its view still reads back every token through the CSR.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "common/tolerance.hpp"
#include "engine/engine_sim.hpp"
#include "engine/view_read.hpp"
#include "sieve/kv/engine_pool.hpp"
#include "sieve/policy.h"
#include "sieve/runtime/kv_layouts.hpp"
#include "sieve/runtime/layer_runner.hpp"

using namespace sieve;
using namespace sieve::engine_test;

namespace {

constexpr int32_t kBlock = 16, kHkv = 2, kHq = 4, kDim = 32, kBlocks = 24;

// One step as vLLM v1's model runner describes it to an attention backend.
struct VllmStep {
  std::vector<int32_t> query_start_loc;  // [num_reqs + 1]
  std::vector<int32_t> seq_lens;         // [num_reqs], tokens after this step
  int32_t max_blocks = 0;
  std::vector<int32_t> block_table;      // [num_reqs, max_blocks] row-major, zero-padded
  std::vector<int64_t> slot_mapping;     // [num_tokens]
};

// FlashInfer's paged-KV CSR from the block table, as vLLM's FlashInfer metadata builder makes it.
struct Csr {
  std::vector<int32_t> indptr, indices, last_page_len;
};
Csr to_csr(const VllmStep& s) {
  Csr c;
  c.indptr.push_back(0);
  for (size_t r = 0; r < s.seq_lens.size(); ++r) {
    const int32_t n = (s.seq_lens[r] + kBlock - 1) / kBlock;
    c.indices.insert(c.indices.end(), s.block_table.begin() + ptrdiff_t(r) * s.max_blocks,
                     s.block_table.begin() + ptrdiff_t(r) * s.max_blocks + n);
    c.indptr.push_back(c.indptr.back() + n);
    c.last_page_len.push_back(s.seq_lens[r] % kBlock == 0 ? kBlock : s.seq_lens[r] % kBlock);
  }
  return c;
}

// The engine: requests' block lists from a shuffled free list, and the tokens it has cached
// (the ground truth the reference reads).
struct Requests {
  std::mt19937 rng{5};
  std::vector<int32_t> free_blocks;
  std::vector<std::vector<int32_t>> blocks;             // per request
  std::vector<std::vector<std::vector<float>>> k, v;    // per request: [token][h * D + d]
  Requests(int n) : blocks(size_t(n)), k(size_t(n)), v(size_t(n)) {
    free_blocks.resize(kBlocks);
    std::iota(free_blocks.begin(), free_blocks.end(), 0);
    std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  }
  // The step where request r gets n_new[r] tokens (0: not scheduled).
  VllmStep schedule(const std::vector<int32_t>& n_new) {
    VllmStep s;
    s.query_start_loc.push_back(0);
    for (size_t r = 0; r < n_new.size(); ++r) {
      if (!n_new[r]) continue;
      const int32_t before = int32_t(k[r].size()), after = before + n_new[r];
      while (int32_t(blocks[r].size()) * kBlock < after) {
        blocks[r].push_back(free_blocks.back());
        free_blocks.pop_back();
      }
      for (int32_t p = before; p < after; ++p)
        s.slot_mapping.push_back(int64_t(blocks[r][size_t(p / kBlock)]) * kBlock + p % kBlock);
      s.query_start_loc.push_back(s.query_start_loc.back() + n_new[r]);
      s.seq_lens.push_back(after);
      s.max_blocks = std::max(s.max_blocks, int32_t(blocks[r].size()));
    }
    for (size_t r = 0; r < n_new.size(); ++r) {
      if (!n_new[r]) continue;
      std::vector<int32_t> row(size_t(s.max_blocks), 0);
      std::copy(blocks[r].begin(), blocks[r].end(), row.begin());
      s.block_table.insert(s.block_table.end(), row.begin(), row.end());
    }
    return s;
  }
};

struct Backend {
  const char* name;
  uint32_t layout;
  int32_t combined_hnd;
  int64_t choice;
};
// vLLM's FlashInfer backend keeps one [num_blocks, 2, block, heads, dim] tensor per layer (NHD,
// or HND through its stride order); its FlashAttention backend [2, num_blocks, block, heads, dim]
// (K and V halves, each NHD); FlashInfer's own API also takes separate HND K and V pools.
const Backend kBackends[] = {{"flashinfer-hnd-tuple", SIEVE_KV_LAYOUT_HND, 0, 0},
                             {"flashattention", SIEVE_KV_LAYOUT_NHD, 0, 1},
                             {"flashinfer-nhd", SIEVE_KV_LAYOUT_COMBINED, 0, 2},
                             {"flashinfer-hnd", SIEVE_KV_LAYOUT_COMBINED, 1, 3}};

// Element offset of (block, kv, head, slot) in the backend's cache (one buffer; FlashAttention's
// V half starts num_blocks blocks in).
int64_t cache_offset(const Backend& be, int32_t block, int kv, int32_t h, int32_t slot) {
  const int64_t H = kHkv, P = kBlock, D = kDim, N = kBlocks;
  if (be.layout == SIEVE_KV_LAYOUT_HND) return ((int64_t(kv) * N * H + int64_t(block) * H + h) * P + slot) * D;
  if (be.layout == SIEVE_KV_LAYOUT_NHD) return (((int64_t(kv) * N + block) * P + slot) * H + h) * D;
  if (be.combined_hnd) return (((int64_t(block) * 2 + kv) * H + h) * P + slot) * D;
  return (((int64_t(block) * 2 + kv) * P + slot) * H + h) * D;
}

void run_backend(const Backend& be) {
  SCOPED_TRACE(be.name);
  runtime::HostServices services(kCpu);
  std::vector<float> cache(size_t(2) * kBlocks * kBlock * kHkv * kDim, 0.f);
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 1, g.n_q_heads = kHq, g.n_kv_heads = kHkv, g.head_dim = kDim, g.page_size = kBlock;
  g.max_batch = 3, g.max_seq_len = kBlocks * kBlock, g.kv_dtype = kF32, g.device = kCpu;
  sieve_param_value layout{};
  layout.type = SIEVE_PARAM_ENUM;
  layout.i = be.choice;
  sieve_kv_config kc{};
  kc.hdr = SIEVE_HEADER_INIT(sieve_kv_config);
  kc.geometry = g;
  kc.pages_per_layer = kBlocks;
  kc.params = &layout;
  kc.n_params = 1;
  const sieve_kv_store_api* api = kv::engine_pool_store_api();
  sieve_kv_store* store = nullptr;
  ASSERT_EQ(api->create(services.table(), &kc, &store, {}), SIEVE_OK);
  std::unique_ptr<sieve_kv_store, void (*)(sieve_kv_store*)> owned(store, api->destroy);
  runtime::ResolvedChains dense;  // no chain: dense attention by the core kernel
  const std::vector<std::string> refused = runtime::kv_layout_refusals(dense, be.layout, "engine_pool");
  std::unique_ptr<runtime::LayerRunner> runner;
  if (refused.empty()) {
    runner = std::make_unique<runtime::LayerRunner>(services, g, store, api, dense, runtime::LayerRunner::Options{});
  } else {
    ASSERT_EQ(refused.size(), 1u);
    EXPECT_NE(refused[0].find("the core attention kernel reads only compact hnd pages"), std::string::npos) << refused[0];
  }

  Requests reqs(3);
  std::vector<int32_t> seq(3);
  for (auto& id : seq) ASSERT_EQ(api->add_sequence(store, &id), SIEVE_OK);
  std::mt19937 rng(9);
  std::normal_distribution<float> nd;
  // Step 1: prompts of requests 1 and 2; step 2: request 0's prompt (37), request 1 decodes,
  // request 2's chunked prefill goes on (13).
  for (const std::vector<int32_t>& n_new : {std::vector<int32_t>{0, 50, 20}, std::vector<int32_t>{37, 1, 13}}) {
    const VllmStep step = reqs.schedule(n_new);
    const int32_t tokens = step.query_start_loc.back();
    std::vector<int32_t> ids, positions;
    for (size_t r = 0; r < n_new.size(); ++r) {
      if (!n_new[r]) continue;
      ids.push_back(seq[r]);
      for (int32_t i = 0; i < n_new[r]; ++i) positions.push_back(int32_t(reqs.k[r].size()) + i);
    }
    HostTensor q({tokens, kHq, kDim}, kF32), k({tokens, kHkv, kDim}, kF32), v({tokens, kHkv, kDim}, kF32),
        out({tokens, kHq, kDim}, kF32), qo({int64_t(ids.size()) + 1}, kI32);
    for (HostTensor* t : {&q, &k, &v})
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, nd(rng));
    std::memcpy(qo.data<int32_t>(), step.query_start_loc.data(), step.query_start_loc.size() * 4);
    // reshape_and_cache: the engine writes the new K/V at slot_mapping; the ground truth grows.
    for (int32_t t = 0, r = 0; t < tokens; ++t) {
      while (t >= step.query_start_loc[size_t(r) + 1]) ++r;
      const size_t req = size_t(std::find(seq.begin(), seq.end(), ids[size_t(r)]) - seq.begin());
      const int32_t block = int32_t(step.slot_mapping[size_t(t)] / kBlock), slot = int32_t(step.slot_mapping[size_t(t)] % kBlock);
      reqs.k[req].emplace_back(size_t(kHkv * kDim));
      reqs.v[req].emplace_back(size_t(kHkv * kDim));
      for (int32_t h = 0; h < kHkv; ++h)
        for (int32_t d = 0; d < kDim; ++d) {
          const float kx = k.get((int64_t(t) * kHkv + h) * kDim + d), vx = v.get((int64_t(t) * kHkv + h) * kDim + d);
          cache[size_t(cache_offset(be, block, 0, h, slot) + d)] = kx;
          cache[size_t(cache_offset(be, block, 1, h, slot) + d)] = vx;
          reqs.k[req].back()[size_t(h * kDim + d)] = kx;
          reqs.v[req].back()[size_t(h * kDim + d)] = vx;
        }
    }
    // The backend's cache as the store's pool, and the CSR.
    Csr csr = to_csr(step);
    int64_t shape4[4] = {kBlocks, kHkv, kBlock, kDim}, nhd[4] = {kBlocks, kBlock, kHkv, kDim};
    int64_t comb[5] = {kBlocks, 2, kBlock, kHkv, kDim}, comb_hnd[5] = {kBlocks, 2, kHkv, kBlock, kDim};
    int64_t n1[1] = {int64_t(ids.size()) + 1}, n2[1] = {int64_t(csr.indices.size())}, n3[1] = {int64_t(ids.size())};
    sieve_kv_pages p{};
    p.hdr = SIEVE_HEADER_INIT(sieve_kv_pages);
    p.batch = int32_t(ids.size());
    p.seq_ids = ids.data();
    p.layout = be.layout;
    p.combined_hnd = be.combined_hnd;
    const int64_t half = int64_t(kBlocks) * kBlock * kHkv * kDim;
    if (be.layout == SIEVE_KV_LAYOUT_COMBINED) {
      p.k_pool = make_view(cache.data(), kCpu, kF32, 5, be.combined_hnd ? comb_hnd : comb);
    } else {
      p.k_pool = make_view(cache.data(), kCpu, kF32, 4, be.layout == SIEVE_KV_LAYOUT_NHD ? nhd : shape4);
      p.v_pool = p.k_pool;
      p.v_pool.byte_offset = uint64_t(half) * 4;
    }
    p.indptr = make_view(csr.indptr.data(), kCpu, kI32, 1, n1);
    p.indices = make_view(csr.indices.data(), kCpu, kI32, 1, n2);
    p.last_page_len = make_view(csr.last_page_len.data(), kCpu, kI32, 1, n3);
    p.indptr_host = csr.indptr.data();
    p.last_page_len_host = csr.last_page_len.data();
    p.new_tokens_written = 1;
    ASSERT_EQ(api->bind_pages(store, &p), SIEVE_OK) << api->last_error(store);
    if (runner) {
      runtime::LayerInputs in;
      in.phase = SIEVE_PHASE_PREFILL;  // a mixed step is causal over each request's new rows
      in.batch = int32_t(ids.size());
      in.seq_ids = ids.data();
      in.qo_indptr_host = step.query_start_loc.data();
      in.qo_indptr = &qo.dl();
      in.positions_host = positions.data();
      in.q = &q.dl();
      in.k = &k.dl();
      in.v = &v.dl();
      std::string err;
      ASSERT_EQ(runner->run_layer(in, &out.dl(), &err), SIEVE_OK) << err;
    } else {
      sieve_kv_append a{};
      a.hdr = SIEVE_HEADER_INIT(sieve_kv_append);
      a.batch = int32_t(ids.size());
      a.seq_ids = ids.data();
      a.token_indptr = step.query_start_loc.data();
      a.k = &k.dl();
      a.v = &v.dl();
      ASSERT_EQ(api->append(store, &a), SIEVE_OK) << api->last_error(store);
    }
    // The view through the CSR reads back each request's tokens in order.
    sieve_paged_kv view{};
    ASSERT_EQ(api->view(store, 0, ids.data(), int32_t(ids.size()), &view), SIEVE_OK) << api->last_error(store);
    ViewReader rd(services, view);
    for (size_t b = 0; b < ids.size(); ++b) {
      const size_t req = size_t(std::find(seq.begin(), seq.end(), ids[b]) - seq.begin());
      ASSERT_EQ(rd.tokens(int32_t(b)), int32_t(reqs.k[req].size()));
      for (int32_t t = 0; t < rd.tokens(int32_t(b)); ++t)
        for (int32_t h = 0; h < kHkv; ++h) {
          const auto& want = reqs.k[req][size_t(t)];
          ASSERT_EQ(rd.row(0, int32_t(b), t, h), std::vector<float>(want.begin() + h * kDim, want.begin() + (h + 1) * kDim))
              << "request " << req << ", token " << t;
        }
    }
    if (!runner) continue;
    // f64 causal attention from the tokens themselves; bound from the arithmetic (f32 kernel).
    double max_q = 0, max_k = 0, max_v = 0;
    int32_t max_len = 0;
    for (int64_t i = 0; i < q.numel(); i += kDim)
      max_q = std::max(max_q, std::sqrt(std::inner_product(q.data<float>() + i, q.data<float>() + i + kDim,
                                                           q.data<float>() + i, 0.0)));
    for (size_t r = 0; r < 3; ++r) {
      max_len = std::max(max_len, int32_t(reqs.k[r].size()));
      for (size_t t = 0; t < reqs.k[r].size(); ++t)
        for (int32_t h = 0; h < kHkv; ++h) {
          const float* kr = reqs.k[r][t].data() + h * kDim;
          max_k = std::max(max_k, std::sqrt(std::inner_product(kr, kr + kDim, kr, 0.0)));
          for (int32_t d = 0; d < kDim; ++d) max_v = std::max(max_v, double(std::abs(reqs.v[r][t][size_t(h * kDim + d)])));
        }
    }
    const double scale = 1.0 / std::sqrt(double(kDim));
    const double bound = tolerance::softmax_sum(max_len, kDim, scale * max_q * max_k, tolerance::kF32, 0, 0) * max_v;
    for (int32_t t = 0, b = 0; t < tokens; ++t) {
      while (t >= step.query_start_loc[size_t(b) + 1]) ++b;
      const size_t req = size_t(std::find(seq.begin(), seq.end(), ids[size_t(b)]) - seq.begin());
      const int32_t pos = positions[size_t(t)];
      for (int32_t hq = 0; hq < kHq; ++hq) {
        const int32_t h = hq / (kHq / kHkv);
        std::vector<double> s(size_t(pos) + 1);
        double mx = -INFINITY, sum = 0;
        for (int32_t j = 0; j <= pos; ++j) {
          double dot = 0;
          for (int32_t d = 0; d < kDim; ++d)
            dot += double(q.get((int64_t(t) * kHq + hq) * kDim + d)) * reqs.k[req][size_t(j)][size_t(h * kDim + d)];
          s[size_t(j)] = dot * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (int32_t d = 0; d < kDim; ++d) {
          double o = 0;
          for (int32_t j = 0; j <= pos; ++j) o += s[size_t(j)] * reqs.v[req][size_t(j)][size_t(h * kDim + d)];
          EXPECT_NEAR(out.get((int64_t(t) * kHq + hq) * kDim + d), o / sum, bound)
              << "token " << t << " (request " << req << ", position " << pos << "), head " << hq << ", dim " << d;
        }
      }
    }
  }
}

}  // namespace

TEST(VllmShapes, ARaggedStepThroughTheEnginePoolMatchesDenseInEveryBackendLayout) {
  for (const Backend& be : kBackends) run_backend(be);
}
