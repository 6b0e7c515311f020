// The attention benchmark suite: decode and prefill, dense and block-sparse, on the GPU (attend_cuda)
// and the CPU (attend_cpu), timed with Google Benchmark, against ceilings measured in the same run
// (device copy bandwidth and bf16 matrix rate; host memcpy) and against PyTorch SDPA run side by
// side (bench/sdpa_reference.py). Shared by `sieve_bench` and `sieve bench`.
#pragma once
#include <string>
#include <vector>

namespace sieve::bench {

struct SuiteOptions {
  bool gpu = true;              // GPU cases (skipped with a message without CUDA or a device)
  bool cpu = true;              // CPU cases
  bool quick = false;           // a few small cases: a smoke run, not the table
  bool hopper = true;           // false: prefill on the mma.sync kernel even where the Hopper one applies
  int hopper_ctas = 0;          // CudaAttentionOptions::hopper_ctas (0: one persistent CTA per SM)
  int page_size = 0;            // GPU cases' page size (0: the suite's 16); names get "/pageN"
  std::string filter;           // regex over case names (as --benchmark_filter)
  std::string sdpa_script;      // run this sdpa_reference.py (with `python`) for the PyTorch side
  std::string sdpa_json;        // or read its output from this file; neither: no PyTorch column
  std::string python = "python3";
  std::string json_out;         // the merged report (cases, ceilings, SDPA, targets) as JSON
  std::string command;          // the command line, recorded in the report
  std::vector<std::string> benchmark_args;  // passed through to benchmark::Initialize
};

// Runs the suite; prints Google Benchmark's table, then the summary (rates, fractions of the
// ceilings, speedups, the targets met / not met). Returns the process exit status: 0, or
// 1 when a case failed (an attention call returned an error or produced non-finite output).
int run_suite(const SuiteOptions& options);

// Where the build found bench/sdpa_reference.py.
const char* default_sdpa_script();

}  // namespace sieve::bench
