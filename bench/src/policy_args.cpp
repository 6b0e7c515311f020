// sieve_bench --policy / sieve bench --policy: the usage text and the argument parser, which
// fills PolicyOptions and hands them to run_policy_bench (policy.cpp).
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "sieve/bench/args.hpp"
#include "sieve/bench/policy.hpp"

namespace sieve::bench {
namespace {

// ---- options ----------------------------------------------------------------------------------

const char kUsage[] =
    "usage: %s --policy [options]\n"
    "Times a whole layer step through the runtime (KV append + chain hooks + core attention) on a\n"
    "synthetic geometry, for each --chain against dense, with the core kernel alone on the chain's\n"
    "selection (selection overhead = step - core). docs/bench/policy.md explains every number.\n"
    "  --phase decode|prefill       (decode)\n"
    "  --chain SPEC                 a chain (repeatable): 'decode:*=quest(token_budget=2048)', or bare\n"
    "                               'streaming(window=1024)' for every layer; dense always runs first\n"
    "  --layers N --hq N --hkv N --d N --page N    geometry (1, 32, 8, 128, 16)\n"
    "  --dtype bf16|f16|f32         K/V, q and out (bf16)\n"
    "  --device cuda|cpu            (cuda when there is one)\n"
    "  --ctx N,N,...                tokens per sequence in the cache (32768)\n"
    "  --batch N,N,...              sequences (1)\n"
    "  --new N                      prefill: the timed call is the last N tokens (default all)\n"
    "  --keys random|similar[:cos]  K/V/q: hash-random, or long_context.hpp with that adjacent-key\n"
    "                               cosine (default 0.9; generated on the host, one thread per sequence)\n"
    "  --similar-period N           ... N tokens generated per sequence, repeated along the context\n"
    "                               (16384; 0: the whole context, ~1 s per 1K tokens of 32q/8kv d128)\n"
    "  --fill decode|prefill        whose on_append hooks see the context (default: the timed phase)\n"
    "  --steps N --warmup N         decode steps timed / untimed before them (20, 3)\n"
    "  --samples N                  prefill calls timed, each on a freshly filled store (3)\n"
    "  --min-q-block N              prefill: selection buffers sized for query blocks >= N (16)\n"
    "  --seed N                     (1)\n"
    "  --check                      the runner's checks on (selections, finite outputs): to debug a\n"
    "                               plugin; its host copies are then inside the timed step\n"
    "  --sdpa                       also time PyTorch SDPA on the dense shape (bench/sdpa_reference.py)\n"
    "  --sdpa-script PATH --python EXE\n"
    "  --memory-fraction F          skip sizes needing more than F of the free memory (0.9)\n"
    "  --kv-store NAME(k=v,...)     the KV store of every chain, dense included (paged); repeat it to run\n"
    "                               every case on each store, step times side by side with the first's\n"
    "                               (an ENGINE_PAGES store runs over a stand-in engine's own shuffled\n"
    "                               pages, its table bound before every layer call)\n"
    "  --plugin-dir DIR             searched first (repeatable); then SIEVE_PLUGIN_PATH, <exe>/../lib/sieve/plugins\n"
    "  --json FILE                  every number, the device, date and command line\n";

bool parse_int_list(const std::string& s, std::vector<int32_t>* out) {
  out->clear();
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    const std::string part = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end || v < 1 || v > (1L << 30)) return false;
    out->push_back(int32_t(v));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return !out->empty();
}

}  // namespace

int policy_main(int argc, char** argv, int first, const char* prog) {
  PolicyOptions o;
  o.command = prog;  // as a shell would take it back: arguments with other characters quoted
  for (int i = first; i < argc; ++i) {
    const std::string a = argv[i];
    const bool plain = !a.empty() && a.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                                         "0123456789_./=:,+-@%") == std::string::npos;
    o.command += " " + (plain ? a : "'" + a + "'");
  }
  auto bad = [&](const std::string& m) {
    std::fprintf(stderr, "%s --policy: %s\n", prog, m.c_str());
    return 2;
  };
  for (int i = first; i < argc; ++i) {
    std::string a = argv[i], val;
    bool has_val = false;
    if (const size_t eq = a.find('='); a.rfind("--", 0) == 0 && eq != std::string::npos) {
      val = a.substr(eq + 1);
      a = a.substr(0, eq);
      has_val = true;
    }
    auto value = [&]() -> const std::string& {
      if (!has_val) {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        val = argv[++i];
        has_val = true;
      }
      return val;
    };
    auto int_opt = [&](int64_t lo, int64_t hi) {
      int64_t v = 0;
      if (!parse_int(value(), lo, hi, &v))
        throw std::invalid_argument(a + " '" + val + "': expected an integer in [" + std::to_string(lo) + ", " +
                                    std::to_string(hi) + "]");
      return v;
    };
    try {
      if (a == "--policy") {
      } else if (a == "--help" || a == "-h") {
        std::printf(kUsage, prog);
        return 0;
      } else if (a == "--phase") {
        o.phase = value();
        if (o.phase != "decode" && o.phase != "prefill") return bad("--phase '" + o.phase + "': decode or prefill");
      } else if (a == "--chain") {
        o.chains.push_back(value());
      } else if (a == "--layers") {
        o.layers = int32_t(int_opt(1, 1024));
      } else if (a == "--hq") {
        o.hq = int32_t(int_opt(1, 1024));
      } else if (a == "--hkv") {
        o.hkv = int32_t(int_opt(1, 1024));
      } else if (a == "--d") {
        o.d = int32_t(int_opt(1, 1024));
      } else if (a == "--page") {
        o.page = int32_t(int_opt(1, 4096));
      } else if (a == "--dtype") {
        o.dtype = value();
      } else if (a == "--device") {
        o.device = value();
      } else if (a == "--ctx" || a == "--batch") {
        if (!parse_int_list(value(), a == "--ctx" ? &o.ctx : &o.batch))
          return bad(a + " '" + val + "': expected positive integers separated by commas");
      } else if (a == "--new") {
        o.new_tokens = int32_t(int_opt(1, 1 << 30));
      } else if (a == "--keys") {
        o.keys = value();
      } else if (a == "--similar-period") {
        o.similar_period = int32_t(int_opt(0, 1 << 30));
      } else if (a == "--fill") {
        o.fill = value();
        if (o.fill != "decode" && o.fill != "prefill") return bad("--fill '" + o.fill + "': decode or prefill");
      } else if (a == "--steps") {
        o.steps = int32_t(int_opt(1, 100000));
      } else if (a == "--warmup") {
        o.warmup = int32_t(int_opt(0, 100000));
      } else if (a == "--samples") {
        o.samples = int32_t(int_opt(1, 100000));
      } else if (a == "--min-q-block") {
        o.min_q_block = int32_t(int_opt(1, 1 << 20));
      } else if (a == "--seed") {
        o.seed = uint64_t(int_opt(0, INT64_MAX));
      } else if (a == "--check") {
        o.check = true;
      } else if (a == "--sdpa") {
        o.sdpa = true;
      } else if (a == "--sdpa-script") {
        o.sdpa_script = value();
        o.sdpa = true;
      } else if (a == "--python") {
        o.python = value();
      } else if (a == "--memory-fraction") {
        char* end = nullptr;
        o.memory_fraction = std::strtod(value().c_str(), &end);
        if (*end || !(o.memory_fraction > 0 && o.memory_fraction <= 1)) return bad("--memory-fraction '" + val + "': in (0, 1]");
      } else if (a == "--kv-store") {
        o.kv_stores.push_back(value());
      } else if (a == "--plugin-dir") {
        o.plugin_dirs.push_back(value());
      } else if (a == "--json") {
        o.json_out = value();
      } else {
        return bad("unknown argument '" + a + "' (--help lists the options)");
      }
      if (has_val && a == "--policy") return bad("--policy takes no value");
    } catch (const std::invalid_argument& e) {
      return bad(e.what());
    }
  }
  return run_policy_bench(o);
}

}  // namespace sieve::bench
