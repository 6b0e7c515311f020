// sieve_bench: the attention benchmark suite on its own (the GPU image has no Boost.program_options,
// so no `sieve` CLI there). Its flags are below; --benchmark_* flags go to Google Benchmark.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "sieve/bench/args.hpp"
#include "sieve/bench/policy.hpp"
#include "sieve/bench/suite.hpp"

namespace {

const char kUsage[] =
    "usage: sieve_bench [options] [--benchmark_* ...]   (--name VALUE or --name=VALUE)\n"
    "  --gpu-only / --cpu-only   run only the GPU (attend_cuda) or CPU (attend_cpu) cases\n"
    "  --quick                   a few small cases (a smoke run)\n"
    "  --no-hopper               prefill on the mma.sync kernel where the Hopper one would run\n"
    "  --hopper-ctas=N           the Hopper prefill kernel's persistent CTAs (default: one per SM)\n"
    "  --page-size=N             the GPU cases' KV page size (default 16; names get /pageN)\n"
    "  --filter=REGEX            only cases whose name matches\n"
    "  --sdpa                    time PyTorch SDPA on the dense GPU shapes (bench/sdpa_reference.py)\n"
    "  --sdpa-script=PATH        ... with this script; --python=EXE to run it (default python3)\n"
    "  --sdpa-json=PATH          ... or read an earlier run of the script\n"
    "  --json=PATH               write the merged report (cases, ceilings, SDPA, targets) as JSON\n"
    "  --policy ...              the policy-step benchmark instead (sieve_bench --policy --help)\n";

// `--name=VALUE`, or `--name VALUE` (the next argument, consumed): how `sieve bench`, which
// hands its arguments over unchanged, may have written it.
bool value_of(int argc, char** argv, int* i, const char* name, std::string* out) {
  const char* arg = argv[*i];
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0) return false;
  if (arg[n] == '=') {
    *out = arg + n + 1;
    return true;
  }
  if (arg[n] != '\0' || *i + 1 >= argc) return false;
  *out = argv[++*i];
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // Logs on stderr as the sieve CLI writes them: stdout carries the results.
  spdlog::set_default_logger(spdlog::stderr_color_mt("sieve_bench"));
  spdlog::set_pattern("%^%l%$: %v");
  // Named after argv[0]'s file name: "sieve_bench", or "sieve bench" when the CLI runs it.
  const char* slash = std::strrchr(argv[0], '/');
  const char* prog = slash ? slash + 1 : argv[0];
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--policy")) return sieve::bench::policy_main(argc, argv, 1, prog);
  sieve::bench::SuiteOptions o;
  bool sdpa = false;
  for (int i = 0; i < argc; ++i) {
    if (i) o.command += ' ';
    o.command += argv[i];
  }
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (!std::strcmp(a, "--help") || !std::strcmp(a, "-h")) {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (!std::strcmp(a, "--gpu-only")) {
      o.cpu = false;
    } else if (!std::strcmp(a, "--cpu-only")) {
      o.gpu = false;
    } else if (!std::strcmp(a, "--quick")) {
      o.quick = true;
    } else if (!std::strcmp(a, "--no-hopper")) {
      o.hopper = false;
    } else if (!std::strcmp(a, "--sdpa")) {
      sdpa = true;
    } else if (std::string n; value_of(argc, argv, &i, "--hopper-ctas", &n)) {
      int64_t v = 0;
      if (!sieve::bench::parse_int(n, 0, INT32_MAX, &v)) {
        std::fprintf(stderr, "%s: --hopper-ctas: '%s' is not a count (0 .. 2147483647)\n", prog, n.c_str());
        return 2;
      }
      o.hopper_ctas = int(v);
    } else if (std::string n; value_of(argc, argv, &i, "--page-size", &n)) {
      int64_t v = 0;
      if (!sieve::bench::parse_int(n, 1, 4096, &v)) {
        std::fprintf(stderr, "%s: --page-size: '%s' is not a page size (1 .. 4096)\n", prog, n.c_str());
        return 2;
      }
      o.page_size = int(v);
    } else if (value_of(argc, argv, &i, "--filter", &o.filter) ||
               value_of(argc, argv, &i, "--sdpa-script", &o.sdpa_script) ||
               value_of(argc, argv, &i, "--sdpa-json", &o.sdpa_json) ||
               value_of(argc, argv, &i, "--python", &o.python) || value_of(argc, argv, &i, "--json", &o.json_out)) {
    } else if (!std::strncmp(a, "--benchmark_", 12)) {
      o.benchmark_args.push_back(a);
    } else {
      std::fprintf(stderr, "%s: unknown argument '%s'\n%s", prog, a, kUsage);
      return 2;
    }
  }
  if (sdpa && o.sdpa_script.empty()) o.sdpa_script = sieve::bench::default_sdpa_script();  // --sdpa-script wins
  return sieve::bench::run_suite(o);
}
