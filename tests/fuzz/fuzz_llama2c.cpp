// fuzz-links: sieve_model
// The llama2.c checkpoint parser on arbitrary bytes (the in-memory entry point; load_llama2c
// reads a file through the same checks). Beyond "no crash": a refusal is one printable line.
#include <cstddef>
#include <cstdint>
#include <span>

#include "fuzz_check.hpp"
#include "sieve/model/llama2c.hpp"
#include "sieve/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    sieve::model::parse_llama2c(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz.bin");
  } catch (const sieve::Error& e) {
    sieve::fuzz::check_message_line(e.what());
  }
  return 0;
}
