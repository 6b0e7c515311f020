// fuzz-links: sieve_runtime
// The chain parser (compact and file form) and chain resolution. Properties checked beyond "no
// crash": a parse error is one line of printable text (fuzz_check.hpp), and a spec that parses is
// written back by to_string() in a form that parses to the same spec again.
// Resolution runs against the real policies whose parameters name no file (dpxa and seer read
// files: their readers have their own fuzz targets), so each plugin's validate() sees the
// fuzzed parameters too.
#include <spdlog/spdlog.h>

#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "sieve/runtime/chain_spec.hpp"
#include "sieve/runtime/registry.hpp"

namespace {

using sieve::fuzz::violated;

void check_round_trip(const sieve::runtime::ChainSpec& spec) {
  const std::string text = sieve::runtime::to_string(spec);
  sieve::runtime::ChainSpec again;
  std::string error;
  if (!sieve::runtime::parse_chain_spec(text, &again, &error))
    violated("to_string() wrote a spec that does not parse", text + " -> " + error);
  if (sieve::runtime::to_string(again) != text)
    violated("to_string() does not round-trip", text + " -> " + sieve::runtime::to_string(again));
}

const sieve::runtime::Registry& policies() {
  static const sieve::runtime::Registry registry = [] {
    spdlog::set_level(spdlog::level::off);  // "serves no layer" and validate() warnings, per input
    sieve::runtime::Registry r;
    for (const char* name : {"dense", "streaming", "quest", "raas", "delta", "deltakv", "delta_correction"})
      if (!r.add_file(std::string(SIEVE_PLUGIN_DIR) + "/libsieve_" + name + ".so"))
        violated("cannot load a policy plugin", name);
    return r;
  }();
  return registry;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte picks the model's layer count (1..64); the rest is the chain text.
  const int32_t n_layers = size ? 1 + data[0] % 64 : 5;
  const std::string text = size ? std::string(reinterpret_cast<const char*>(data) + 1, size - 1) : std::string();

  sieve::runtime::ChainSpec compact, file;
  std::string error;
  if (sieve::runtime::parse_chain_spec(text, &compact, &error)) check_round_trip(compact);
  else sieve::fuzz::check_message_line(error);
  error.clear();
  if (sieve::runtime::parse_chain_file(text, "fuzz.chain", &file, &error)) check_round_trip(file);
  else sieve::fuzz::check_message_line(error);

  const sieve_geometry g{.hdr = SIEVE_HEADER_INIT(sieve_geometry), .n_layers = n_layers, .n_q_heads = 8,
                         .n_kv_heads = 2, .head_dim = 64, .page_size = 16, .max_batch = 4, .max_seq_len = 4096,
                         .kv_dtype = {kDLFloat, 32, 1}, .device = {kDLCPU, 0}, .rope_theta = 10000.f, .rope_dim = 64};
  for (const auto* spec : {&compact, &file}) {
    if (spec->empty()) continue;
    sieve::runtime::ResolvedChains chains;
    std::vector<std::string> errors;
    sieve::runtime::resolve_chains(*spec, policies(), g, &chains, &errors);
  }
  return 0;
}
