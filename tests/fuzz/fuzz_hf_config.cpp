// fuzz-links: sieve_model
// config.json (Llama / Qwen2) as a ModelConfig. Beyond "no crash": a refusal is one printable
// line, and an accepted config is a possible model (ModelConfig::problem() is empty).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "sieve/model/hf_config.hpp"
#include "sieve/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const sieve::model::ModelConfig c =
        sieve::model::parse_hf_config(std::string(reinterpret_cast<const char*>(data), size), "config.json");
    if (const std::string p = c.problem(); !p.empty()) sieve::fuzz::violated("an impossible config was accepted", p);
  } catch (const sieve::Error& e) {
    sieve::fuzz::check_message_line(e.what());
  }
  return 0;
}
