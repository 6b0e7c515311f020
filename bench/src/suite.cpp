// run_suite: picks the cases, measures the ceilings, runs PyTorch SDPA on the dense GPU shapes
// (a separate python3 process, before our cases, so the two never share the GPU), registers every
// case with Google Benchmark (manual time: each iteration is one timed sample), runs them, and
// prints / writes the summary.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <tuple>
#include <unistd.h>

#include "report.hpp"
#include "runner.hpp"
#include "sieve/bench/suite.hpp"

namespace sieve::bench {

std::string today_utc() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

namespace {

// The dense GPU shapes PyTorch should time, as the script's input.
nlohmann::json sdpa_cases(const std::vector<Case>& cases) {
  nlohmann::json j = nlohmann::json::array();
  for (const Case& c : cases)
    if (c.sdpa)
      j.push_back({{"shape", c.shape},
                   {"phase", c.prefill() ? "prefill" : "decode"},
                   {"n_q_heads", c.hq},
                   {"n_kv_heads", c.hkv},
                   {"head_dim", c.d},
                   {"batch", c.batch},
                   {"context", c.ctx},
                   {"dtype", dtype_name(c.dtype)},
                   {"samples", c.samples}});
  return j;
}

}  // namespace

// Runs `python script --cases FILE` and parses what it prints on stdout.
std::string run_sdpa_script(const SuiteOptions& o, const nlohmann::json& cases, nlohmann::json* out) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("sieve_bench_sdpa_cases_" + std::to_string(getpid()) + ".json");
  {
    std::ofstream f(path);
    f << cases.dump();
    if (!f) return "cannot write " + path.string();
  }
  const std::string cmd = o.python + " '" + o.sdpa_script + "' --cases '" + path.string() + "'";
  spdlog::info("PyTorch SDPA: {}", cmd);
  std::FILE* p = popen(cmd.c_str(), "r");
  if (!p) return "cannot start: " + cmd;
  std::string text;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, p)) text.append(buf, n);
  const int status = pclose(p);
  std::filesystem::remove(path);
  if (status != 0) return cmd + " exited with status " + std::to_string(status);
  try {
    *out = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return std::string("cannot parse the SDPA script's output: ") + e.what();
  }
  return {};
}

const char* default_sdpa_script() { return SIEVE_BENCH_SDPA_SCRIPT; }

int run_suite(const SuiteOptions& o) {
  Report report;
  report.date = today_utc();
  report.command = o.command;

  std::vector<Case> cases;
  bool gpu = false;
  if (o.gpu) {
#ifdef SIEVE_WITH_CUDA
    std::string why;
    gpu = gpu_available(&why);
    if (!gpu) spdlog::warn("GPU cases skipped: {}", why);
#else
    spdlog::warn("GPU cases skipped: this build has no CUDA");
#endif
  }
  if (gpu)
    for (Case& c : gpu_cases(o.quick)) {
      c.hopper = o.hopper;
      c.hopper_ctas = o.hopper_ctas;
      if (o.page_size > 0 && o.page_size != c.page_size) {
        // Same keys per selection block (64) where the page allows it; the SDPA shape is unchanged.
        c.page_size = o.page_size;
        c.k_block_pages = std::max(1, 64 / o.page_size);
        c.name += "/page" + std::to_string(o.page_size);
      }
      cases.push_back(c);
    }
  if (o.cpu)
    for (Case& c : cpu_cases(o.quick)) cases.push_back(c);
  if (!o.filter.empty()) {
    std::regex re;
    try {
      re = std::regex(o.filter);
    } catch (const std::regex_error& e) {
      spdlog::error("--filter '{}': {}", o.filter, e.what());
      return 2;
    }
    std::erase_if(cases, [&](const Case& c) { return !std::regex_search(c.name, re); });
  }
  if (cases.empty()) {
    spdlog::error("no benchmark case left to run");
    return 2;
  }
  const bool any_gpu = std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.backend == Backend::kCuda; });
  const bool any_cpu = std::any_of(cases.begin(), cases.end(), [](const Case& c) { return c.backend == Backend::kCpu; });

  // PyTorch first (its own process; it frees the GPU when it exits), then the ceilings.
  const nlohmann::json wanted = sdpa_cases(cases);
  if (any_gpu && !wanted.empty() && (!o.sdpa_script.empty() || !o.sdpa_json.empty())) {
    nlohmann::json sdpa;
    std::string err;
    if (!o.sdpa_script.empty()) {
      err = run_sdpa_script(o, wanted, &sdpa);
    } else {
      std::ifstream f(o.sdpa_json);
      try {
        sdpa = nlohmann::json::parse(f);
      } catch (const std::exception& e) {
        err = o.sdpa_json + ": " + e.what();
      }
    }
    if (err.empty()) err = merge_sdpa(report, sdpa);
    if (!err.empty()) spdlog::warn("no PyTorch SDPA column: {}", err);
  }
#ifdef SIEVE_WITH_CUDA
  if (any_gpu) report.ceilings = measure_gpu_ceilings();
#endif
  std::unique_ptr<HostStreamProbe> probe;  // the ceilings beside each CPU decode call
  if (any_cpu) {
    report.ceilings.host_threads = host_threads();
    report.ceilings.host_cpu = host_cpu_model();
    probe = std::make_unique<HostStreamProbe>(report.ceilings.host_threads);
    std::tie(report.ceilings.host_copy_gbs, report.ceilings.host_read_gbs) = measure_host_stream_gbs(*probe);
    report.ceilings.host_paged_read_gbs = measure_host_paged_read_gbs(report.ceilings.host_threads);
    if (std::any_of(cases.begin(), cases.end(),
                    [](const Case& c) { return c.backend == Backend::kCpu && c.prefill(); }))
      report.ceilings.host_sgemm_gflops = measure_host_sgemm_gflops(report.ceilings.host_threads);
  }

  std::vector<std::string> args_store = {"sieve_bench"};
  for (const auto& a : o.benchmark_args) args_store.push_back(a);
  std::vector<char*> argv;
  for (auto& a : args_store) argv.push_back(a.data());
  int argc = int(argv.size());
  benchmark::Initialize(&argc, argv.data());
  if (argc > 1) {
    spdlog::error("unknown argument '{}' (Google Benchmark flags start with --benchmark_)", argv[1]);
    return 2;
  }

  std::vector<CaseResult> results(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    auto* b = benchmark::RegisterBenchmark(cases[i].name.c_str(), [&cases, &results, &probe, i](benchmark::State& st) {
#ifdef SIEVE_WITH_CUDA
      if (cases[i].backend == Backend::kCuda) return run_gpu_case(st, cases[i], results[i]);
#endif
      run_cpu_case(st, cases[i], results[i], probe.get());
    });
    b->UseManualTime()->Iterations(cases[i].samples)->Unit(benchmark::kMicrosecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
#ifdef SIEVE_WITH_CUDA
  if (any_gpu) release_gpu();
#endif

  bool failed = false;
  for (auto& r : results) {
    if (r.c.name.empty()) continue;  // not run (Google Benchmark's own filter)
    failed |= !r.ran;
    report.results.push_back(std::move(r));
  }
  print_summary(report, stdout);
  if (!o.json_out.empty()) {
    std::ofstream f(o.json_out);
    f << report_json(report).dump(2) << "\n";
    if (!f) {
      spdlog::error("cannot write {}", o.json_out);
      return 1;
    }
  }
  return failed ? 1 : 0;
}

}  // namespace sieve::bench
