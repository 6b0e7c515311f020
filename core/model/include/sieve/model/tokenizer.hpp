// The llama2.c tokenizer (tokenizer.bin / tok512.bin): SentencePiece-style BPE as in llama2.c's
// run.c, so token ids match what the checkpoints were trained with.
//
// File: int32 max_token_length, then for each of vocab_size tokens: f32 merge score, int32 byte
// length, the bytes. The vocabulary size is not stored: it is the model's (checked: the file must
// end exactly after vocab_size entries).
//
// Encode (run.c): optional BOS (1); a dummy-prefix " " token when the text is non-empty
// (SentencePiece's add_dummy_prefix); each UTF-8 code point looked up as a token, or its bytes as
// byte-fallback tokens "<0xXX>"; then, repeatedly, the adjacent pair whose concatenation is a
// token with the highest score is merged, until no pair merges; optional EOS (2). BOS/EOS never
// take part in merges. The merges run in O(n log n) (a heap of candidate pairs) with exactly
// run.c's order.
// Decode: a piece after BOS loses its leading space (SentencePiece strips the dummy prefix);
// "<0xXX>" pieces become that byte.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

namespace sieve::model {

class Tokenizer {
 public:
  static constexpr int32_t kUnk = 0, kBos = 1, kEos = 2;
  static constexpr uint64_t kMaxFileBytes = uint64_t(1) << 30;  // load() refuses larger files

  // Throws sieve::Error naming `name` when the bytes are not a tokenizer of vocab_size tokens.
  static Tokenizer parse(std::span<const std::byte> bytes, int32_t vocab_size, const std::string& name);
  // A regular file of at most kMaxFileBytes (sieve/util/file_input.hpp).
  static Tokenizer load(const std::string& path, int32_t vocab_size);

  // With max_tokens >= 0, a text that would encode to more tokens (BOS/EOS included) is refused
  // (sieve::Error), before encoding when its length alone shows it.
  std::vector<int32_t> encode(const std::string& text, bool bos, bool eos, int64_t max_tokens = -1) const;
  // The text of `token` when it follows `prev` (one piece, as run.c prints while generating).
  std::string decode_piece(int32_t prev, int32_t token) const;
  // A whole sequence (each piece after its predecessor; the first after `prev`).
  std::string decode(std::span<const int32_t> tokens, int32_t prev = kBos) const;

  int32_t vocab_size() const { return int32_t(pieces_.size()); }
  const std::string& piece(int32_t id) const { return pieces_.at(size_t(id)); }
  float score(int32_t id) const { return scores_.at(size_t(id)); }

 private:
  int32_t lookup(const std::string& s) const;
  std::vector<int32_t> initial_symbols(const std::string& text) const;  // code points / byte fallback
  std::vector<int32_t> merge(std::vector<int32_t> symbols) const;       // run.c's greedy merges
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::unordered_map<std::string, int32_t> ids_;  // first id of each piece
  std::vector<int32_t> byte_token_;               // [256]: id of "<0xXX>", or -1
  int64_t max_piece_bytes_ = 1;                   // the longest piece
};

}  // namespace sieve::model
