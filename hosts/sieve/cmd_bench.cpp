// sieve bench: the attention benchmark suite (bench/, the same code as the standalone sieve_bench):
// decode and prefill, dense and block-sparse, against ceilings measured in the same run and, with
// --sdpa, PyTorch SDPA on the same shapes.
#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/util/printable.hpp"
#ifdef SIEVE_HAVE_BENCH
#include "sieve/bench/policy.hpp"
#include "sieve/bench/suite.hpp"
#endif

namespace po = boost::program_options;

namespace sieve::cli {

int cmd_bench(int argc, char** argv) {
#ifndef SIEVE_HAVE_BENCH
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "sieve bench: this build has no benchmarks (configure with -DSIEVE_BUILD_BENCH=ON)\n");
  return 1;
#else
  // --policy: the policy-step benchmark, with its own options (shared with sieve_bench).
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--policy") return bench::policy_main(argc, argv, 1, "sieve bench");
  bench::SuiteOptions o;
  bool gpu_only = false, cpu_only = false, sdpa = false;
  std::vector<std::string> gbench;
  po::options_description desc(
      "sieve bench [options]\n\nTime the core attention kernels (decode and prefill, dense and "
      "block-sparse) against the device's measured copy bandwidth and bf16 matrix rate, and PyTorch SDPA.\n"
      "Google Benchmark flags (--benchmark_*) pass through");
  desc.add_options()("help,h", "this help")
      ("gpu-only", po::bool_switch(&gpu_only), "only the GPU (attend_cuda) cases")
      ("cpu-only", po::bool_switch(&cpu_only), "only the CPU (attend_cpu) cases")
      ("quick", po::bool_switch(&o.quick), "a few small cases (a smoke run)")
      ("filter", po::value(&o.filter), "only cases whose name matches this regex")
      ("sdpa", po::bool_switch(&sdpa), "time PyTorch SDPA on the dense GPU shapes (python3 + torch)")
      ("sdpa-script", po::value(&o.sdpa_script), "the SDPA script to run (default: the source tree's)")
      ("sdpa-json", po::value(&o.sdpa_json), "read an earlier SDPA run instead")
      ("python", po::value(&o.python)->default_value("python3"), "interpreter for the SDPA script")
      ("json", po::value(&o.json_out), "write the merged report as JSON to this file")
      ("policy", "the policy-step benchmark instead: chains vs dense through the runtime (sieve bench --policy --help)");
  po::variables_map vm;
  try {
    // Google Benchmark's own flags (--benchmark_out=F, --benchmark_repetitions=N, ...) pass through.
    const po::parsed_options parsed = po::command_line_parser(argc, argv).options(desc).allow_unregistered().run();
    for (const std::string& a : po::collect_unrecognized(parsed.options, po::include_positional)) {
      if (a.rfind("--benchmark_", 0) != 0) {
        return report_error("sieve bench", "unknown argument '" + printable(a) + "'", 2);
      }
      gbench.push_back(a);
    }
    po::store(parsed, vm);
    po::notify(vm);
  } catch (const std::exception& e) {
    return report_error("sieve bench", e.what(), 2);
  }
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  if (gpu_only && cpu_only) {
    std::fprintf(stderr, "sieve bench: --gpu-only and --cpu-only exclude each other\n");
    return 2;
  }
  o.gpu = !cpu_only;
  o.cpu = !gpu_only;
  if (sdpa && o.sdpa_script.empty()) o.sdpa_script = bench::default_sdpa_script();
  o.benchmark_args = gbench;
  o.command = "sieve";
  for (int i = 0; i < argc; ++i) {
    o.command += ' ';
    o.command += argv[i];
  }
  return bench::run_suite(o);
#endif
}

}  // namespace sieve::cli
