// seer_random_gate: write an untrained (random, PyTorch-Linear-initialised) SeerAttention-R gate
// file for any geometry, without a model and without Boost (the GPU image has no
// Boost.program_options, so `sieve distill-gate --random` is not there). For speed runs and
// conformance, where the gate's quality does not matter, only its shape and cost.
//   seer_random_gate --out F --layers L --hq HQ --hkv HKV --d D [--block 64] [--gate-dim 128]
//                    [--rmsnorm] [--seed 1] [--rope-theta 10000]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "gate/gate_file.hpp"

int main(int argc, char** argv) {
  sieve::seer::GateShape s;
  s.block = 64;
  s.gate_dim = 128;
  std::string out;
  unsigned long long seed = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "seer_random_gate: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto integer = [&]() {
      const char* v = next();
      char* end = nullptr;
      const long x = std::strtol(v, &end, 10);
      if (!*v || *end || x < 0 || x > (1L << 20)) {
        std::fprintf(stderr, "seer_random_gate: %s '%s' is not an integer in [0, 2^20]\n", a.c_str(), v);
        std::exit(2);
      }
      return int32_t(x);
    };
    if (a == "--out") out = next();
    else if (a == "--layers") s.n_layers = integer();
    else if (a == "--hq") s.n_q_heads = integer();
    else if (a == "--hkv") s.n_kv_heads = integer();
    else if (a == "--d") s.head_dim = integer();
    else if (a == "--block") s.block = integer();
    else if (a == "--gate-dim") s.gate_dim = integer();
    else if (a == "--seed") seed = unsigned(integer());
    else if (a == "--rope-theta") s.rope_theta = std::strtof(next(), nullptr);
    else if (a == "--rmsnorm") s.rmsnorm = true;
    else if (a == "-h" || a == "--help") {
      std::puts("seer_random_gate --out F --layers L --hq HQ --hkv HKV --d D [--block 64] [--gate-dim 128] [--rmsnorm] "
                "[--seed 1] [--rope-theta 10000]");
      return 0;
    } else {
      std::fprintf(stderr, "seer_random_gate: unknown option '%s' (--help)\n", a.c_str());
      return 2;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "seer_random_gate: --out is required\n");
    return 2;
  }
  if (std::string p = s.problem(); !p.empty()) {
    std::fprintf(stderr, "seer_random_gate: %s\n", p.c_str());
    return 2;
  }
  try {
    sieve::seer::write_gate(out, sieve::seer::random_gate(s, seed));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "seer_random_gate: %s\n", e.what());
    return 1;
  }
  std::printf("wrote %s: %d layers, %d/%d heads, head_dim %d, block %d, gate_dim %d%s (random)\n", out.c_str(),
              s.n_layers, s.n_q_heads, s.n_kv_heads, s.head_dim, s.block, s.gate_dim, s.rmsnorm ? ", rmsnorm" : "");
  return 0;
}
