// What the suite's parts share: ceilings, timings, per-case results, and the GPU / CPU runners.
// Internal to bench/.
#pragma once
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cases.hpp"

namespace sieve::bench {

// Measured in the same process before the cases run.
struct Ceilings {
  std::string device;        // GPU name (empty: no GPU run)
  int sm_count = 0;
  double l2_bytes = 0;
  double read_gbs = 0;       // read-only stream of 16-byte loads, bytes read per second: the
                             // decode kernels' ceiling (they read K/V and write almost nothing)
  double bulk_read_gbs = 0;  // the same bytes through the bulk-copy engine (cp.async.bulk)
  double paged8_read_gbs = 0;  // 16-byte loads, 4 KB of every 32 KB per CTA (paged KV, 8 heads)
  double paged1_read_gbs = 0;  // the same grid, contiguous per CTA
  double copy_gbs = 0;       // device-to-device cudaMemcpy, bytes read + written per second
  double mma_tflops = 0;     // cuBLAS bf16 GEMM 8192^3 (f32 accumulation) on random data
  double mma_sync_tflops = 0;  // mma.sync m16n8k16 bf16 in a register-only loop (our kernels' MMA)
  double host_copy_gbs = 0;  // memcpy over the CPU cases' threads, read + written
  int host_threads = 0;
  // OpenBLAS sgemm on the same threads, operands past the LLC: the CPU prefill cases' ceiling
  double host_sgemm_gflops = 0;
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int samples = 0;
  int calls_per_sample = 0;  // calls replayed back to back (one CUDA graph) per timed sample
};

struct CaseResult {
  Case c;
  Work work;
  Timing t;
  std::string kernel;   // which kernel family ran (CUDA plan), "cpu" on the CPU
  int splits = 0;       // split-KV upper bound of the row kernels
  std::string error;    // non-empty: the case failed
  bool ran = false;
};

// Timing statistics of per-call times in milliseconds.
Timing summarize(std::vector<double> ms, int calls_per_sample);

// ---- GPU (gpu_cases.cpp, gpu_support.cu; only in a CUDA build) ----------------------------------
bool gpu_available(std::string* why);
Ceilings measure_gpu_ceilings();
// Sets up the case on the device, times it inside Google Benchmark's loop (manual time: one
// iteration = one sample = a CUDA-graph replay of calls_per_sample calls), checks the outputs are
// finite and no device-side error was recorded, and fills `out`.
void run_gpu_case(benchmark::State& state, const Case& c, CaseResult& out);
void release_gpu();

// ---- CPU (cpu_cases.cpp) ---------------------------------------------------------------------
double measure_host_copy_gbs(int threads);
double measure_host_sgemm_gflops(int threads);
int host_threads();
void run_cpu_case(benchmark::State& state, const Case& c, CaseResult& out);

// Fills n values of dtype `dt` at `p` (host memory) with N(0,1)-like values from a counter hash:
// fast, parallel, deterministic, never all zero.
void fill_host_random(void* p, DLDataType dt, int64_t n, uint64_t seed);

}  // namespace sieve::bench
