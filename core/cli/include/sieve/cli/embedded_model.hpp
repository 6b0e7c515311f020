// The default model compiled into libsieve_cli (hosts/sieve/models/stories260K/, see its
// README.md): `sieve run` and the plugins' tools work from any directory, without the source tree.
#pragma once
#include <cstddef>
#include <span>

namespace sieve::cli {
std::span<const std::byte> embedded_model();      // stories260K.bin (llama2.c format)
std::span<const std::byte> embedded_tokenizer();  // tok512.bin
inline constexpr const char* kEmbeddedModelName = "stories260K (embedded)";
inline constexpr const char* kEmbeddedTokenizerName = "tok512 (embedded)";
}  // namespace sieve::cli
