// fuzz-links: sieve_seer_gate
// SeerAttention-R gate files (the safetensors container plus gate metadata), read through a
// scratch file. Beyond "no crash": a refusal is one printable line, and an accepted gate holds
// exactly the weights its shape declares.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "fuzz_input_file.hpp"
#include "gate/gate_file.hpp"
#include "sieve/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = sieve::fuzz::scratch_file(data, size);
  try {
    const sieve::seer::GateWeights w = sieve::seer::read_gate(path);
    const auto& s = w.shape;
    const int64_t heads = int64_t(s.n_layers) * s.n_kv_heads;
    if (int64_t(w.wq.size()) != heads * s.wq_head_elems() || int64_t(w.wk.size()) != heads * s.wk_head_elems())
      sieve::fuzz::violated("gate weights do not match the declared shape", std::to_string(w.wq.size()));
  } catch (const sieve::Error& e) {
    sieve::fuzz::check_message_line(e.what());
  }
  return 0;
}
