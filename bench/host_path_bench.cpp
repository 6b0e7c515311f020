// Host time of one decode sieve_session_attend call (Google Benchmark): the runtime's own work per
// layer and step (validation, positions, the qo_indptr upload, store append and view, the chain's
// hooks, the kernel plan and its launches), the part an engine that drives Sieve from Python or C
// pays on top of its kernels. A dense session of one layer through the C host API, as
// python/bench/binding_cost.py's "bare" column calls it.
//   cpu/B:  1 q head, 1 KV head, d 8, f32: the kernel is a few hundred flops, so the time is the host path.
//   cuda/B: 32q/8kv d64 bf16 (binding_cost.py's geometry), kernels enqueued and not waited for:
//           the time is what the call costs the calling thread (registered only with a CUDA device).
// The context restarts (a fresh sequence, untimed) every kRestart calls so it stays small.
//   sieve_host_path_bench [--benchmark_filter=cpu] [Google Benchmark flags]
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "sieve/host.h"

#ifdef SIEVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

constexpr int32_t kRestart = 256;  // calls per sequence; also bounds max_seq_len

struct Shape {
  int32_t hq, hkv, d;
  DLDataType dtype;
  DLDevice device;
};

// Zeroed memory on the shape's device for `n` elements, freed with the object.
class Buffer {
 public:
  Buffer(const Shape& s, size_t n) : device_(s.device) {
    const size_t bytes = n * size_t(s.dtype.bits / 8);
    if (device_.device_type == kDLCPU) {
      host_.assign(bytes, 0);
      data_ = host_.data();
    }
#ifdef SIEVE_WITH_CUDA
    else if (cudaMalloc(&data_, bytes) != cudaSuccess || cudaMemset(data_, 0, bytes) != cudaSuccess) {
      data_ = nullptr;
    }
#endif
  }
  ~Buffer() {
#ifdef SIEVE_WITH_CUDA
    if (device_.device_type == kDLCUDA && data_) cudaFree(data_);
#endif
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }

 private:
  DLDevice device_;
  std::vector<char> host_;
  void* data_ = nullptr;
};

void host_path(benchmark::State& state, Shape shape) {
  const int32_t batch = int32_t(state.range(0));
  sieve_runtime_options ro = {SIEVE_HEADER_INIT(sieve_runtime_options), SIEVE_RUNTIME_NO_ENV | SIEVE_RUNTIME_NO_DEFAULT_DIRS};
  sieve_runtime* rt = nullptr;
  if (sieve_runtime_create(&ro, &rt) != SIEVE_OK) return state.SkipWithError("sieve_runtime_create failed");
  sieve_geometry g{};
  g.hdr = SIEVE_HEADER_INIT(sieve_geometry);
  g.n_layers = 1;
  g.n_q_heads = shape.hq;
  g.n_kv_heads = shape.hkv;
  g.head_dim = shape.d;
  g.page_size = 16;
  g.max_batch = batch;
  g.max_seq_len = kRestart;
  g.kv_dtype = shape.dtype;
  g.device = shape.device;
  g.rope_theta = 10000.f;
  g.rope_dim = shape.d;
  sieve_session* s = nullptr;
  if (sieve_session_create(rt, &g, nullptr, nullptr, &s) != SIEVE_OK) {
    const std::string why = std::string("sieve_session_create: ") + sieve_runtime_last_error(rt);
    sieve_runtime_destroy(rt);
    return state.SkipWithError(why.c_str());
  }
  Buffer q(shape, size_t(batch) * shape.hq * shape.d), k(shape, size_t(batch) * shape.hkv * shape.d),
      v(shape, size_t(batch) * shape.hkv * shape.d), o(shape, size_t(batch) * shape.hq * shape.d);
  int64_t qs[3] = {batch, shape.hq, shape.d}, ks[3] = {batch, shape.hkv, shape.d};
  auto tensor = [&](const Buffer& b, int64_t* sh) { return DLTensor{b.data(), shape.device, 3, shape.dtype, sh, nullptr, 0}; };
  DLTensor tq = tensor(q, qs), tk = tensor(k, ks), tv = tensor(v, ks), to = tensor(o, qs);
  std::vector<int32_t> seqs(static_cast<size_t>(batch)), qo(static_cast<size_t>(batch) + 1);
  for (int32_t b = 0; b <= batch; ++b) qo[size_t(b)] = b;
  sieve_layer_inputs in{};
  in.hdr = SIEVE_HEADER_INIT(sieve_layer_inputs);
  in.phase = SIEVE_PHASE_DECODE;
  in.batch = batch;
  in.seq_ids = seqs.data();
  in.qo_indptr = qo.data();
  in.q = &tq;
  in.k = &tk;
  in.v = &tv;
  auto restart = [&](bool remove) {
    for (int32_t& id : seqs) {
      if (remove) sieve_session_remove_sequence(s, id);
      sieve_session_add_sequence(s, &id);
    }
  };
  restart(false);
  int32_t calls = 0;
  for (auto _ : state) {
    if (calls++ == kRestart - 1) {  // the next call would pass max_seq_len
      state.PauseTiming();
      sieve_session_synchronize(s);
      restart(true);
      calls = 1;
      state.ResumeTiming();
    }
    if (sieve_session_attend(s, &in, &to) != SIEVE_OK) {
      state.SkipWithError(sieve_session_last_error(s));
      break;
    }
  }
  sieve_session_synchronize(s);
  sieve_session_destroy(s);
  sieve_runtime_destroy(rt);
}

void register_all() {
  constexpr DLDataType kF32{kDLFloat, 32, 1}, kBF16{kDLBfloat, 16, 1};
  benchmark::RegisterBenchmark("host_path/cpu", host_path, Shape{1, 1, 8, kF32, {kDLCPU, 0}})->Arg(1)->Arg(16);
#ifdef SIEVE_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) == cudaSuccess && n > 0)
    benchmark::RegisterBenchmark("host_path/cuda", host_path, Shape{32, 8, 64, kBF16, {kDLCUDA, 0}})->Arg(1)->Arg(16);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
