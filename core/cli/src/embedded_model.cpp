// The embedded default model: the assembler's .incbin copies the two files into .rodata at build
// time (CMake passes their absolute paths and rebuilds this file when they change), so no
// generated source holds a megabyte of literals.
#include "sieve/cli/embedded_model.hpp"

#ifndef SIEVE_EMBEDDED_MODEL_PATH
#error "SIEVE_EMBEDDED_MODEL_PATH and SIEVE_EMBEDDED_TOKENIZER_PATH must be defined by CMake"
#endif

#define SIEVE_INCBIN(sym, path)                                     \
  __asm__(".pushsection .rodata\n"                                  \
          ".balign 16\n"                                            \
          ".global " #sym "_begin\n" #sym "_begin:\n"               \
          ".incbin \"" path "\"\n"                                  \
          ".global " #sym "_end\n" #sym "_end:\n"                   \
          ".byte 0\n"                                               \
          ".popsection\n")

SIEVE_INCBIN(sieve_embedded_model, SIEVE_EMBEDDED_MODEL_PATH);
SIEVE_INCBIN(sieve_embedded_tokenizer, SIEVE_EMBEDDED_TOKENIZER_PATH);

extern "C" {
extern const unsigned char sieve_embedded_model_begin[], sieve_embedded_model_end[];
extern const unsigned char sieve_embedded_tokenizer_begin[], sieve_embedded_tokenizer_end[];
}

namespace sieve::cli {
namespace {
std::span<const std::byte> bytes(const unsigned char* b, const unsigned char* e) {
  return {reinterpret_cast<const std::byte*>(b), size_t(e - b)};
}
}  // namespace
std::span<const std::byte> embedded_model() {
  return bytes(sieve_embedded_model_begin, sieve_embedded_model_end);
}
std::span<const std::byte> embedded_tokenizer() {
  return bytes(sieve_embedded_tokenizer_begin, sieve_embedded_tokenizer_end);
}
}  // namespace sieve::cli
