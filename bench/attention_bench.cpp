// sieve_bench: the attention benchmark suite on its own (the GPU image has no Boost.program_options,
// so no `sieve` CLI there). Its flags are below; --benchmark_* flags go to Google Benchmark.
#include <cstdio>
#include <cstring>
#include <string>

#include "sieve/bench/policy.hpp"
#include "sieve/bench/suite.hpp"

namespace {

const char kUsage[] =
    "usage: sieve_bench [options] [--benchmark_* ...]\n"
    "  --gpu-only / --cpu-only   run only the GPU (attend_cuda) or CPU (attend_cpu) cases\n"
    "  --quick                   a few small cases (a smoke run)\n"
    "  --filter=REGEX            only cases whose name matches\n"
    "  --sdpa                    time PyTorch SDPA on the dense GPU shapes (bench/sdpa_reference.py)\n"
    "  --sdpa-script=PATH        ... with this script; --python=EXE to run it (default python3)\n"
    "  --sdpa-json=PATH          ... or read an earlier run of the script\n"
    "  --json=PATH               write the merged report (cases, ceilings, SDPA, targets) as JSON\n"
    "  --policy ...              the policy-step benchmark instead (sieve_bench --policy --help)\n";

bool value_of(const char* arg, const char* name, std::string* out) {
  const size_t n = std::strlen(name);
  if (std::strncmp(arg, name, n) != 0 || arg[n] != '=') return false;
  *out = arg + n + 1;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (!std::strcmp(argv[i], "--policy")) return sieve::bench::policy_main(argc, argv, 1, "sieve_bench");
  sieve::bench::SuiteOptions o;
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
    } else if (!std::strcmp(a, "--sdpa")) {
      o.sdpa_script = sieve::bench::default_sdpa_script();
    } else if (value_of(a, "--filter", &o.filter) || value_of(a, "--sdpa-script", &o.sdpa_script) ||
               value_of(a, "--sdpa-json", &o.sdpa_json) || value_of(a, "--python", &o.python) ||
               value_of(a, "--json", &o.json_out)) {
    } else if (!std::strncmp(a, "--benchmark_", 12)) {
      o.benchmark_args.push_back(a);
    } else {
      std::fprintf(stderr, "sieve_bench: unknown argument '%s'\n%s", a, kUsage);
      return 2;
    }
  }
  return sieve::bench::run_suite(o);
}
