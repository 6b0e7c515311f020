// fuzz-links: sieve_safetensors
// The safetensors container: header parse and, for every tensor it accepts, the tensor read
// (through a scratch file: the reader takes a path). Beyond "no crash": refusals are one
// printable line, and accepted extents lie inside the file.
#include <cstddef>
#include <cstdint>

#include "fuzz_check.hpp"
#include "fuzz_input_file.hpp"
#include "sieve/model/safetensors_file.hpp"
#include "sieve/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = sieve::fuzz::scratch_file(data, size);
  sieve::model::SafetensorsHeader h;
  try {
    sieve::model::read_safetensors_header(path, &h, "fuzz");
  } catch (const sieve::Error& e) {
    sieve::fuzz::check_message_line(e.what());
    return 0;
  }
  for (const auto& [name, entry] : h.tensors) {
    if (entry.begin > entry.end || entry.end > size)
      sieve::fuzz::violated("an accepted tensor lies outside the file", name);
    try {
      sieve::model::read_safetensors_tensor(entry, name, "fuzz");
    } catch (const sieve::Error& e) {
      sieve::fuzz::check_message_line(e.what());
    }
  }
  return 0;
}
