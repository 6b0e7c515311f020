#include "sieve/model/tokenizer.hpp"

#include <cstdio>
#include <cstring>

#include "sieve/model/llama2c.hpp"
#include "sieve/util/error.hpp"

namespace sieve::model {

namespace {
[[noreturn]] void refuse(const std::string& name, const std::string& what) {
  fail(SIEVE_ERR_INVALID_ARGUMENT, "tokenizer '" + name + "': " + what);
}
// "<0xXX>" → XX, or -1.
int byte_piece(const std::string& p) {
  unsigned v = 0;
  char tail = 0;
  if (p.size() == 6 && std::sscanf(p.c_str(), "<0x%2X%c", &v, &tail) == 2 && tail == '>') return int(v);
  return -1;
}
}  // namespace

Tokenizer Tokenizer::parse(std::span<const std::byte> bytes, int32_t vocab_size, const std::string& name) {
  if (vocab_size < 3) refuse(name, "vocab_size " + std::to_string(vocab_size) + " leaves no room for <unk>, BOS, EOS");
  size_t at = 0;
  auto read = [&](void* dst, size_t n, const char* what, int32_t token) {
    if (bytes.size() - at < n)
      refuse(name, "truncated at token " + std::to_string(token) + " (" + what + ", byte " + std::to_string(at) +
                       " of " + std::to_string(bytes.size()) + ")");
    std::memcpy(dst, bytes.data() + at, n);
    at += n;
  };
  int32_t max_len = 0;
  read(&max_len, 4, "max_token_length", -1);
  if (max_len <= 0) refuse(name, "max_token_length " + std::to_string(max_len) + " must be positive");
  Tokenizer t;
  t.pieces_.resize(size_t(vocab_size));
  t.scores_.resize(size_t(vocab_size));
  t.byte_token_.assign(256, -1);
  for (int32_t i = 0; i < vocab_size; ++i) {
    int32_t len = 0;
    read(&t.scores_[size_t(i)], 4, "score", i);
    read(&len, 4, "length", i);
    if (len < 0 || len > max_len)
      refuse(name, "token " + std::to_string(i) + " has length " + std::to_string(len) + " (max_token_length " +
                       std::to_string(max_len) + ")");
    std::string s(size_t(len), '\0');
    read(s.data(), size_t(len), "bytes", i);
    t.ids_.emplace(s, i);  // keeps the first id of a duplicated piece
    if (int b = byte_piece(s); b >= 0 && t.byte_token_[size_t(b)] < 0) t.byte_token_[size_t(b)] = i;
    t.pieces_[size_t(i)] = std::move(s);
  }
  if (at != bytes.size())
    refuse(name, std::to_string(bytes.size() - at) + " bytes follow the " + std::to_string(vocab_size) +
                     " tokens of the model's vocabulary (a tokenizer for another vocabulary?)");
  return t;
}

Tokenizer Tokenizer::load(const std::string& path, int32_t vocab_size) {
  std::vector<std::byte> bytes = read_file_bytes(path);
  return parse(bytes, vocab_size, path);
}

int32_t Tokenizer::lookup(const std::string& s) const {
  auto it = ids_.find(s);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool bos, bool eos) const {
  std::vector<int32_t> out;
  if (bos) out.push_back(kBos);
  const size_t first = out.size();
  if (!text.empty()) {
    const int32_t space = lookup(" ");
    if (space >= 0) out.push_back(space);
  }
  // Code points (a lead byte and its continuation bytes, at most 4) → tokens or byte fallback.
  for (size_t i = 0; i < text.size();) {
    size_t n = 1;
    while (i + n < text.size() && n < 4 && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
    const std::string cp = text.substr(i, n);
    if (int32_t id = lookup(cp); id >= 0) {
      out.push_back(id);
    } else {
      for (char c : cp) {
        const int32_t b = byte_token_[static_cast<unsigned char>(c)];
        out.push_back(b >= 0 ? b : kUnk);
      }
    }
    i += n;
  }
  // Greedy merges by score, leftmost pair on ties (run.c's strict '>').
  std::string buf;
  for (;;) {
    float best = -1e10f;
    int64_t best_at = -1;
    int32_t best_id = -1;
    for (size_t i = first; i + 1 < out.size(); ++i) {
      buf = pieces_[size_t(out[i])];
      buf += pieces_[size_t(out[i + 1])];
      const int32_t id = lookup(buf);
      if (id >= 0 && scores_[size_t(id)] > best) {
        best = scores_[size_t(id)];
        best_at = int64_t(i);
        best_id = id;
      }
    }
    if (best_at < 0) break;
    out[size_t(best_at)] = best_id;
    out.erase(out.begin() + best_at + 1);
  }
  if (eos) out.push_back(kEos);
  return out;
}

std::string Tokenizer::decode_piece(int32_t prev, int32_t token) const {
  if (token < 0 || token >= vocab_size())
    fail(SIEVE_ERR_INVALID_ARGUMENT, "token id " + std::to_string(token) + " is outside the vocabulary [0, " +
                                         std::to_string(vocab_size()) + ")");
  const std::string& p = pieces_[size_t(token)];
  if (int b = byte_piece(p); b >= 0) return std::string(1, char(b));
  if (prev == kBos && !p.empty() && p[0] == ' ') return p.substr(1);
  return p;
}

std::string Tokenizer::decode(std::span<const int32_t> tokens, int32_t prev) const {
  std::string s;
  for (int32_t t : tokens) {
    s += decode_piece(prev, t);
    prev = t;
  }
  return s;
}

}  // namespace sieve::model
