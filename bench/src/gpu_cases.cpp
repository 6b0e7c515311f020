// GPU cases: a paged workload on the device (random bf16 K/V in shuffled pages, the case's block
// selection), timed as CUDA-graph replays of attend_cuda calls with CUDA events (no host launch
// overhead in the numbers, as in a serving engine that captures its decode step). Inputs rotate
// among several copies when one copy would fit in L2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "device_arena.hpp"
#include "gpu_support.hpp"
#include "runner.hpp"
#include "sieve/kernels/attention_args.hpp"
#include "sieve/kernels/attention_cuda.hpp"
#include "sieve/kernels/attention_cuda_checks.hpp"

namespace sieve::bench {
namespace {

constexpr double kMinSampleMs = 1.0;   // graph replays of at least this long per sample
constexpr int kMaxCallsPerSample = 256;
constexpr int kMaxRotation = 8;

DeviceArena g_arena;
cudaStream_t g_stream = nullptr;
Ceilings g_ceilings;

std::string cuda_msg(const char* what, cudaError_t e) { return std::string(what) + ": " + cudaGetErrorString(e); }

// One call's tensors over one rotation set of inputs.
struct CallSet {
  int64_t q_shape[3], pool_shape[4], qo_shape[1], kvp_shape[1], idx_shape[1], last_shape[1],
      sel_ip_shape[1], sel_ix_shape[1];
  DLTensor q, out, qo;
  sieve_paged_kv kv{};
  sieve_selection sel{};
  sieve_attention_args args{};
};

}  // namespace

bool gpu_available(std::string* why) {
  const int n = kernels::cuda_device_count();
  if (n == 0) {
    *why = "no CUDA device";
    return false;
  }
  return true;
}

Ceilings measure_gpu_ceilings() {
  Ceilings c;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return c;
  c.device = prop.name;
  c.sm_count = prop.multiProcessorCount;
  c.l2_bytes = double(prop.l2CacheSize);
  std::string err;
  c.read_gbs = measure_read_gbs(size_t(4) << 30, 20, ReadPath::kLoads, &err);  // 4 GiB: far past L2
  c.bulk_read_gbs = measure_read_gbs(size_t(4) << 30, 20, ReadPath::kBulk, &err);
  c.paged8_read_gbs = measure_read_gbs(size_t(4) << 30, 20, ReadPath::kPaged8, &err);
  c.paged1_read_gbs = measure_read_gbs(size_t(4) << 30, 20, ReadPath::kPaged1, &err);
  c.copy_gbs = measure_copy_gbs(size_t(4) << 30, 20, &err);
  c.mma_tflops = measure_bf16_gemm_tflops(8192, 20, &err);
  c.mma_sync_tflops = measure_mma_sync_tflops(c.sm_count, &err);
  c.graph_launch_us = measure_graph_launch_us(2 * c.sm_count, false, 20, &err);
  c.graph_launch_pdl_us = measure_graph_launch_us(2 * c.sm_count, true, 20, &err);
  if (!err.empty()) c.device += " (ceiling failed: " + err + ")";
  if (!g_stream) cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking);
  g_ceilings = c;
  return c;
}

void release_gpu() {
  g_arena.release();
  if (g_stream) cudaStreamDestroy(g_stream);
  g_stream = nullptr;
}

void run_gpu_case(benchmark::State& state, const Case& c, CaseResult& out) {
  out.c = c;
  auto fail = [&](const std::string& msg) {
    out.error = msg;
    state.SkipWithError(msg.c_str());
  };
  if (!g_stream && cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess)
    return fail("cannot create a CUDA stream");

  // Page table: every sequence holds ctx keys in pages shuffled over the pool.
  const int32_t nq = n_new(c), np = kernels::ceil_div(c.ctx, c.page_size);
  const int64_t pages = int64_t(c.batch) * np;
  std::vector<int32_t> qo(size_t(c.batch) + 1), kvp(size_t(c.batch) + 1), last(size_t(c.batch)), idx(static_cast<size_t>(pages));
  for (int32_t b = 0; b <= c.batch; ++b) {
    qo[size_t(b)] = b * nq;
    kvp[size_t(b)] = b * np;
  }
  std::fill(last.begin(), last.end(), c.ctx - (np - 1) * c.page_size);
  std::iota(idx.begin(), idx.end(), 0);
  std::mt19937_64 rng(0x5eed + uint64_t(c.ctx) * 31 + uint64_t(c.batch));
  std::shuffle(idx.begin(), idx.end(), rng);
  const reference::SelectionRows rows = make_selection(c, 0x5e1 + uint64_t(c.sparsity * 1000));
  std::vector<int32_t> sel_ip(1, 0), sel_ix;
  for (const auto& r : rows) {
    sel_ix.insert(sel_ix.end(), r.begin(), r.end());
    sel_ip.push_back(int32_t(sel_ix.size()));
  }
  out.work = case_work(c, rows);

  // Rotation: enough input copies that one pass over them is >= 4x L2.
  const size_t elem = dtype_bytes(c.dtype);
  const size_t pool_elems = size_t(pages) * c.hkv * c.page_size * c.d;
  const size_t q_elems = size_t(c.batch) * nq * c.hq * c.d;
  const double set_bytes = double(2 * pool_elems + q_elems) * double(elem);
  const int sets = std::clamp(int(std::ceil(4.0 * g_ceilings.l2_bytes / set_bytes)), 1, kMaxRotation);
  const size_t small = (qo.size() + kvp.size() + last.size() + idx.size() + sel_ip.size() + sel_ix.size()) * 4 + 16 * 256;
  if (!g_arena.reserve(size_t(sets) * (2 * pool_elems + q_elems) * elem + q_elems * elem + small + 16 * 256))
    return fail("out of device memory for " + c.name);

  cudaError_t up = cudaSuccess;
  int32_t* d_qo = g_arena.upload(qo, g_stream, &up);
  int32_t* d_kvp = g_arena.upload(kvp, g_stream, &up);
  int32_t* d_last = g_arena.upload(last, g_stream, &up);
  int32_t* d_idx = g_arena.upload(idx, g_stream, &up);
  int32_t* d_sel_ip = g_arena.upload(sel_ip, g_stream, &up);
  int32_t* d_sel_ix = g_arena.upload(sel_ix, g_stream, &up);
  void* d_out = g_arena.take(q_elems * elem);
  if (up != cudaSuccess) return fail(cuda_msg("upload", up));

  std::string err;

  const DLDevice gpu{kDLCUDA, 0};
  std::vector<CallSet> calls(static_cast<size_t>(sets));
  for (int s = 0; s < sets; ++s) {
    CallSet& cs = calls[size_t(s)];
    void* k = g_arena.take(pool_elems * elem);
    void* v = g_arena.take(pool_elems * elem);
    void* q = g_arena.take(q_elems * elem);
    cudaError_t e = fill_device_random(k, c.dtype, int64_t(pool_elems), 100 + uint64_t(s) * 3, 1.f, g_stream);
    if (e == cudaSuccess) e = fill_device_random(v, c.dtype, int64_t(pool_elems), 101 + uint64_t(s) * 3, 1.f, g_stream);
    if (e == cudaSuccess) e = fill_device_random(q, c.dtype, int64_t(q_elems), 102 + uint64_t(s) * 3, 1.f, g_stream);
    if (e != cudaSuccess) return fail(cuda_msg("random fill", e));
    cs.q_shape[0] = int64_t(c.batch) * nq, cs.q_shape[1] = c.hq, cs.q_shape[2] = c.d;
    cs.pool_shape[0] = pages, cs.pool_shape[1] = c.hkv, cs.pool_shape[2] = c.page_size, cs.pool_shape[3] = c.d;
    cs.qo_shape[0] = cs.kvp_shape[0] = c.batch + 1;
    cs.idx_shape[0] = pages;
    cs.last_shape[0] = c.batch;
    cs.q = make_view(q, gpu, c.dtype, 3, cs.q_shape);
    cs.out = make_view(d_out, gpu, c.dtype, 3, cs.q_shape);
    cs.qo = make_view(d_qo, gpu, kI32, 1, cs.qo_shape);
    cs.kv.hdr = SIEVE_HEADER_INIT(sieve_paged_kv);
    cs.kv.batch = c.batch;
    cs.kv.page_size = c.page_size;
    cs.kv.k_pages = make_view(k, gpu, c.dtype, 4, cs.pool_shape);
    cs.kv.v_pages = make_view(v, gpu, c.dtype, 4, cs.pool_shape);
    cs.kv.indptr = make_view(d_kvp, gpu, kI32, 1, cs.kvp_shape);
    cs.kv.indices = make_view(d_idx, gpu, kI32, 1, cs.idx_shape);
    cs.kv.last_page_len = make_view(d_last, gpu, kI32, 1, cs.last_shape);
    cs.kv.indptr_host = kvp.data();
    cs.kv.last_page_len_host = last.data();
    cs.args = kernels::make_attention_args(c.phase, c.hq, c.hkv, c.d, &cs.q, &cs.out, &cs.qo, qo.data(), &cs.kv);
    if (!c.dense()) {
      cs.sel_ip_shape[0] = int64_t(sel_ip.size());
      cs.sel_ix_shape[0] = int64_t(std::max<size_t>(sel_ix.size(), 1));
      cs.sel.hdr = SIEVE_HEADER_INIT(sieve_selection);
      cs.sel.kind = SIEVE_SEL_BLOCKS;
      cs.sel.heads = SIEVE_SEL_PER_KV_HEAD;
      cs.sel.q_block = c.prefill() ? c.q_block : 1;
      cs.sel.k_block_pages = c.k_block_pages;
      cs.sel.n_rows = int32_t(rows.size());
      cs.sel.indptr = make_view(d_sel_ip, gpu, kI32, 1, cs.sel_ip_shape);
      cs.sel.indices = make_view(d_sel_ix, gpu, kI32, 1, cs.sel_ix_shape);
      cs.sel.capacity = cs.sel_ix_shape[0];
      cs.args.selection = &cs.sel;
    }
  }

  kernels::CudaAttentionOptions opt;
  opt.tensor_cores = c.tensor_cores;
  opt.hopper = c.hopper;
  opt.hopper_ctas = c.hopper_ctas;
  opt.kv_splits = c.kv_splits;
  opt.split_min_keys = c.split_min_keys;
  kernels::CudaAttentionPlan plan;
  if (kernels::cuda_attention_plan(calls[0].args, opt, &plan, &err) != SIEVE_OK) return fail(err);
  out.kernel = plan.kernel;
  out.splits = plan.kv_splits;
  out.merge = plan.merge;

  cudaEvent_t e0 = nullptr, e1 = nullptr;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  auto cleanup = [&] {
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
  };
  auto call = [&](int i) { return kernels::attend_cuda(calls[size_t(i % sets)].args, opt, g_stream, &err); };
  cudaError_t e = cudaEventCreate(&e0);
  if (e == cudaSuccess) e = cudaEventCreate(&e1);
  if (e != cudaSuccess) return cleanup(), fail(cuda_msg("cudaEventCreate", e));

  // One untimed call (first-use setup), then one timed the plain way to size the samples.
  if (call(0) != SIEVE_OK || call(1) != SIEVE_OK) return cleanup(), fail(err);
  cudaEventRecord(e0, g_stream);
  if (call(0) != SIEVE_OK) return cleanup(), fail(err);
  cudaEventRecord(e1, g_stream);
  if ((e = cudaEventSynchronize(e1)) != cudaSuccess) return cleanup(), fail(cuda_msg("first call", e));
  float est = 0;
  cudaEventElapsedTime(&est, e0, e1);
  const int per_sample = std::clamp(int(std::ceil(kMinSampleMs / std::max(est, 1e-3f))), 1, kMaxCallsPerSample);

  e = cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal);
  sieve_status st = SIEVE_OK;
  for (int i = 0; i < per_sample && st == SIEVE_OK && e == cudaSuccess; ++i) st = call(i);
  const cudaError_t end = cudaStreamEndCapture(g_stream, &graph);
  if (e == cudaSuccess) e = end;
  if (st != SIEVE_OK) return cleanup(), fail("captured call: " + err);
  if (e == cudaSuccess) e = cudaGraphInstantiate(&exec, graph, 0);
  if (e != cudaSuccess) return cleanup(), fail(cuda_msg("CUDA graph", e));
  for (int i = 0; i < 2 && e == cudaSuccess; ++i) e = cudaGraphLaunch(exec, g_stream);  // warm-up

  std::vector<double> ms;
  for (auto _ : state) {
    cudaEventRecord(e0, g_stream);
    e = cudaGraphLaunch(exec, g_stream);
    cudaEventRecord(e1, g_stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(e1);
    float t = 0;
    if (e == cudaSuccess) e = cudaEventElapsedTime(&t, e0, e1);
    if (e != cudaSuccess) break;
    ms.push_back(double(t) / per_sample);
    state.SetIterationTime(double(t) * 1e-3 / per_sample);
  }
  if (e != cudaSuccess) return cleanup(), fail(cuda_msg("timed replay", e));
  cleanup();

  // The outputs of the last call must be finite (and not all zero), and no bad entry recorded.
  if (kernels::cuda_attention_check_errors(0, g_stream, &err) != SIEVE_OK) return fail(err);
  const size_t check = std::min<size_t>(q_elems, size_t(1) << 22);
  std::vector<uint16_t> h16(check * elem / 2);
  if ((e = cudaMemcpy(h16.data(), d_out, check * elem, cudaMemcpyDeviceToHost)) != cudaSuccess)
    return fail(cuda_msg("reading the output", e));
  size_t bad = 0, nonzero = 0;
  for (size_t i = 0; i < check; ++i) {
    const float x = elem == 4 ? reinterpret_cast<const float*>(h16.data())[i]
                              : load_float(h16.data(), c.dtype, int64_t(i));
    bad += !std::isfinite(x);
    nonzero += x != 0.f;
  }
  if (bad || !nonzero) return fail("output check: " + std::to_string(bad) + " non-finite, " +
                                   std::to_string(nonzero) + " non-zero of " + std::to_string(check));

  out.t = summarize(ms, per_sample);
  out.ran = true;
  const double s = out.t.median_ms * 1e-3;
  state.counters["GB/s"] = out.work.bytes() / s / 1e9;
  state.counters["TFLOP/s"] = out.work.flops / s / 1e12;
  if (g_ceilings.read_gbs > 0) state.counters["of_read"] = out.work.bytes() / s / 1e9 / g_ceilings.read_gbs;
  if (g_ceilings.copy_gbs > 0) state.counters["of_copy"] = out.work.bytes() / s / 1e9 / g_ceilings.copy_gbs;
  if (g_ceilings.mma_tflops > 0) state.counters["of_mma"] = out.work.flops / s / 1e12 / g_ceilings.mma_tflops;
  state.counters["median_us"] = out.t.median_ms * 1e3;
  state.SetLabel(out.kernel + " splits " + std::to_string(out.splits) + " merge " + out.merge);
}

}  // namespace sieve::bench
