// fuzz-links: sieve_model
// The llama2.c tokenizer file. Its vocabulary size comes from the model, not the file, so each
// input is parsed for a few sizes (the corpus has files valid for 3, 20 and 512 tokens). Beyond
// "no crash": a refusal is one printable line; an accepted file has exactly that many tokens.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "fuzz_check.hpp"
#include "sieve/model/tokenizer.hpp"
#include "sieve/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span bytes(reinterpret_cast<const std::byte*>(data), size);
  for (int32_t vocab : {3, 20, 512}) {
    try {
      const sieve::model::Tokenizer t = sieve::model::Tokenizer::parse(bytes, vocab, "tok.bin");
      if (t.vocab_size() != vocab) sieve::fuzz::violated("wrong vocabulary size", std::to_string(t.vocab_size()));
    } catch (const sieve::Error& e) {
      sieve::fuzz::check_message_line(e.what());
    }
  }
  return 0;
}
