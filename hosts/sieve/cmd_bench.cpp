// sieve bench: the attention benchmark suite (bench/): decode and prefill, dense and block-sparse,
// against ceilings measured in the same run and, with --sdpa, PyTorch SDPA on the same shapes. The
// suite is its own executable, sieve_bench, beside this one; sieve bench checks its options here
// (the same messages and --help as always) and then becomes sieve_bench with the same arguments
// and argv[0] = "sieve bench", so the CLI links no benchmark code.
#include <unistd.h>

#include <boost/program_options.hpp>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "sieve/cli/error_line.hpp"
#include "sieve/util/printable.hpp"

namespace po = boost::program_options;

namespace sieve::cli {

namespace {

// Replace this process by sieve_bench (found beside this executable) with argv[1..) unchanged;
// returns only on failure, with the status to exit with.
int exec_bench(const std::filesystem::path& bench, int argc, char** argv) {
  std::vector<const char*> args = {"sieve bench"};  // sieve_bench names itself after argv[0]
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  std::fflush(nullptr);
  ::execv(bench.c_str(), const_cast<char* const*>(args.data()));
  return report_error("sieve bench", "cannot run " + bench.string() + ": " + std::strerror(errno), 1);
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  std::error_code ec;
  const std::filesystem::path bench = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "sieve_bench";
  if (ec || !std::filesystem::is_regular_file(bench, ec))
    return report_error("sieve bench", "this build has no benchmarks (configure with -DSIEVE_BUILD_BENCH=ON)", 1);
  // --policy: the policy-step benchmark, with its own options (sieve_bench parses them).
  for (int i = 1; i < argc; ++i)
    if (std::string(argv[i]) == "--policy") return exec_bench(bench, argc, argv);
  // Parsed only to check them (sieve_bench reads the same arguments again).
  bool gpu_only = false, cpu_only = false;
  using text = std::string;
  po::options_description desc(
      "sieve bench [options]\n\nTime the core attention kernels (decode and prefill, dense and "
      "block-sparse) against the device's measured copy bandwidth and bf16 matrix rate, and PyTorch SDPA.\n"
      "Google Benchmark flags (--benchmark_*) pass through");
  desc.add_options()("help,h", "this help")
      ("gpu-only", po::bool_switch(&gpu_only), "only the GPU (attend_cuda) cases")
      ("cpu-only", po::bool_switch(&cpu_only), "only the CPU (attend_cpu) cases")
      ("quick", po::bool_switch(), "a few small cases (a smoke run)")
      ("no-hopper", po::bool_switch(), "prefill on the mma.sync kernel where the Hopper (wgmma) one would run")
      ("hopper-ctas", po::value<text>(), "the Hopper prefill kernel's persistent CTAs (default: one per SM)")
      ("page-size", po::value<text>(), "the GPU cases' KV page size (default 16; case names get /pageN)")
      ("filter", po::value<text>(), "only cases whose name matches this regex")
      ("sdpa", po::bool_switch(), "time PyTorch SDPA on the dense GPU shapes (python3 + torch)")
      ("sdpa-script", po::value<text>(), "the SDPA script to run (default: the source tree's)")
      ("sdpa-json", po::value<text>(), "read an earlier SDPA run instead")
      ("python", po::value<text>()->default_value("python3"), "interpreter for the SDPA script")
      ("json", po::value<text>(), "write the merged report as JSON to this file")
      ("policy", "the policy-step benchmark instead: chains vs dense through the runtime (sieve bench --policy --help)");
  po::variables_map vm;
  try {
    // Google Benchmark's own flags (--benchmark_out=F, --benchmark_repetitions=N, ...) pass through.
    const po::parsed_options parsed = po::command_line_parser(argc, argv).options(desc).allow_unregistered().run();
    for (const std::string& a : po::collect_unrecognized(parsed.options, po::include_positional))
      if (a.rfind("--benchmark_", 0) != 0) return report_error("sieve bench", "unknown argument '" + printable(a) + "'", 2);
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
  return exec_bench(bench, argc, argv);
}

}  // namespace sieve::cli
