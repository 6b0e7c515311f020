// What the suite's parts share: ceilings, timings, per-case results, and the GPU / CPU runners.
// Internal to bench/.
#pragma once
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
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
  // Per-call floor of a chain of dependent kernels: us per empty kernel (2 CTAs per SM) replayed
  // back to back from a CUDA graph, plain and as programmatic dependent launches (sm_90)
  double graph_launch_us = 0;
  double graph_launch_pdl_us = 0;
  std::string host_cpu;      // the CPU's model name (/proc/cpuinfo)
  double host_copy_gbs = 0;  // memcpy over the CPU cases' threads, read + written
  // Read-only over the same threads, bytes read per second: a sequential stream, and 4 KiB slabs
  // of scattered pages (a K and a V slab per page, the next page's lines prefetched one per line
  // read, as the decode kernel reads them): the CPU decode cases' ceilings without compute
  double host_read_gbs = 0;
  double host_paged_read_gbs = 0;
  int host_threads = 0;
  // OpenBLAS sgemm on the same threads, operands past the LLC: the CPU prefill cases' ceiling
  double host_sgemm_gflops = 0;
};

struct Timing {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  int samples = 0;
  int calls_per_sample = 0;  // calls replayed back to back (one CUDA graph) per timed sample
};

// Ceilings measured beside each timed sample of a CPU decode case (HostStreamProbe, one
// repetition each right before the call): sample i's fraction of the ceiling is (bytes / ms[i]) /
// copy_gbs[i], so a neighbour that slows the memory slows both sides of the ratio.
struct Adjacent {
  std::vector<double> ms, copy_gbs, read_gbs;  // per sample, in order
  bool empty() const { return ms.empty(); }
};

struct CaseResult {
  Case c;
  Work work;
  Timing t;
  Adjacent adjacent;    // CPU decode: the ceilings beside each sample
  std::string kernel;   // which kernel family ran (CUDA plan), "cpu" on the CPU
  int splits = 0;       // split-KV upper bound of the row kernels
  std::string merge;    // how the splits merge (CUDA plan: none, cluster, combine)
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

// ---- CPU (host_ceilings.cpp, cpu_cases.cpp) ----------------------------------------------------
class PoolBuffer;
// One memcpy and one read-only stream over `threads` threads on buffers of `bytes` (past the LLC),
// a repetition per call: the ceilings measured right beside each timed CPU decode call.
class HostStreamProbe {
 public:
  explicit HostStreamProbe(int threads, size_t bytes = size_t(256) << 20);
  ~HostStreamProbe();
  double copy_gbs();  // read + written bytes per second
  double read_gbs();  // bytes read per second (8 independent 64-bit sums per thread)

 private:
  int threads_;
  size_t bytes_;
  std::unique_ptr<PoolBuffer> src_, dst_;
  std::vector<uint64_t> sink_;  // a sum per thread, a line apart (keeps the reads)
};
// {memcpy, sequential read-only} GB/s: medians of 6 repetitions after a warm-up.
std::pair<double, double> measure_host_stream_gbs(HostStreamProbe& probe);
// Read-only over 4 KiB K and V slabs of scattered pages (Ceilings::host_paged_read_gbs).
double measure_host_paged_read_gbs(int threads);
double measure_host_sgemm_gflops(int threads);
std::string host_cpu_model();
int host_threads();
// Runs one CPU case; with a probe, decode cases measure a copy and a read repetition before each
// timed call into out.adjacent.
void run_cpu_case(benchmark::State& state, const Case& c, CaseResult& out, HostStreamProbe* probe);

// Fills n values of dtype `dt` at `p` (host memory) with N(0,1)-like values from a counter hash:
// fast, parallel, deterministic, never all zero.
void fill_host_random(void* p, DLDataType dt, int64_t n, uint64_t seed);

}  // namespace sieve::bench
