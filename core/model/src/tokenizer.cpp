#include "sieve/model/tokenizer.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <queue>

#include "sieve/util/error.hpp"
#include "sieve/util/file_input.hpp"

namespace sieve::model {

namespace {
[[noreturn]] void refuse(const std::string& name, const std::string& what) {
  fail(SIEVE_ERR_INVALID_ARGUMENT, file_label("tokenizer", name) + ": " + what);
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
  // Every token takes at least 8 bytes (score, length): checked before the tables are sized.
  if (uint64_t(bytes.size()) < 4 + 8 * uint64_t(vocab_size))
    refuse(name, std::to_string(bytes.size()) + " bytes cannot hold " + std::to_string(vocab_size) +
                     " tokens (8 bytes each at least; a tokenizer for another vocabulary?)");
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
    std::string s;
    s.resize(std::min(size_t(len), bytes.size() - at));  // never more than the file holds
    read(s.data(), size_t(len), "bytes", i);
    t.ids_.emplace(s, i);  // keeps the first id of a duplicated piece
    if (int b = byte_piece(s); b >= 0 && t.byte_token_[size_t(b)] < 0) t.byte_token_[size_t(b)] = i;
    t.max_piece_bytes_ = std::max(t.max_piece_bytes_, int64_t(len));
    t.pieces_[size_t(i)] = std::move(s);
  }
  if (at != bytes.size())
    refuse(name, std::to_string(bytes.size() - at) + " bytes follow the " + std::to_string(vocab_size) +
                     " tokens of the model's vocabulary (a tokenizer for another vocabulary?)");
  return t;
}

Tokenizer Tokenizer::load(const std::string& path, int32_t vocab_size) {
  return parse(read_file(path, "tokenizer", kMaxFileBytes), vocab_size, path);
}

int32_t Tokenizer::lookup(const std::string& s) const {
  auto it = ids_.find(s);
  return it == ids_.end() ? -1 : it->second;
}

std::vector<int32_t> Tokenizer::initial_symbols(const std::string& text) const {
  std::vector<int32_t> out;
  if (text.empty()) return out;
  if (const int32_t space = lookup(" "); space >= 0) out.push_back(space);
  // Code points (a lead byte and its continuation bytes, at most 4) -> tokens or byte fallback.
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
  return out;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool bos, bool eos, int64_t max_tokens) const {
  if (text.size() > size_t(INT32_MAX) - 4)  // symbols are indexed in int32
    fail(SIEVE_ERR_INVALID_ARGUMENT, "a text of " + std::to_string(text.size()) + " bytes is too long to encode");
  // A token covers at most max_piece_bytes_ bytes of text, which bounds the count from below:
  // an over-long text is refused before any work on it.
  const int64_t at_least = int64_t(bos) + int64_t(eos) +
                           (int64_t(text.size()) + max_piece_bytes_ - 1) / std::max<int64_t>(max_piece_bytes_, 1);
  if (max_tokens >= 0 && at_least > max_tokens)
    fail(SIEVE_ERR_INVALID_ARGUMENT, "a text of " + std::to_string(text.size()) + " bytes needs at least " +
                                         std::to_string(at_least) + " tokens, more than the " +
                                         std::to_string(max_tokens) + " the model's positions allow");
  const std::vector<int32_t> merged = merge(initial_symbols(text));
  std::vector<int32_t> out;
  out.reserve(merged.size() + 2);
  if (bos) out.push_back(kBos);
  out.insert(out.end(), merged.begin(), merged.end());
  if (eos) out.push_back(kEos);
  if (max_tokens >= 0 && int64_t(out.size()) > max_tokens)
    fail(SIEVE_ERR_INVALID_ARGUMENT, "a text of " + std::to_string(text.size()) + " bytes encodes to " +
                                         std::to_string(out.size()) + " tokens, more than the " +
                                         std::to_string(max_tokens) + " the model's positions allow");
  return out;
}

std::vector<int32_t> Tokenizer::merge(std::vector<int32_t> tok) const {
  // run.c merges, repeatedly, the adjacent pair whose concatenation is the token with the highest
  // score (strictly above -1e10; the leftmost pair on ties) by rescanning the whole sequence:
  // quadratic. The same order here from a heap of candidate pairs over a linked list of symbols.
  // A symbol keeps its first index, so list order is index order and "leftmost" is "smallest
  // left index"; a candidate is stale once its pair no longer stands with the same tokens.
  constexpr float kNoMerge = -1e10f;
  const int32_t n = int32_t(tok.size());
  std::vector<int32_t> next(static_cast<size_t>(n)), prev(static_cast<size_t>(n));
  std::vector<char> alive(static_cast<size_t>(n), 1);
  for (int32_t i = 0; i < n; ++i) {
    next[size_t(i)] = i + 1 < n ? i + 1 : -1;
    prev[size_t(i)] = i - 1;
  }
  struct Candidate {
    float score;
    int32_t left, right, left_tok, right_tok, merged;
  };
  auto lower = [](const Candidate& a, const Candidate& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower)> heap(lower);
  std::string buf;
  auto consider = [&](int32_t l, int32_t r) {
    if (l < 0 || r < 0) return;
    buf = pieces_[size_t(tok[size_t(l)])];
    buf += pieces_[size_t(tok[size_t(r)])];
    const int32_t id = lookup(buf);
    if (id >= 0 && scores_[size_t(id)] > kNoMerge)
      heap.push({scores_[size_t(id)], l, r, tok[size_t(l)], tok[size_t(r)], id});
  };
  for (int32_t i = 0; i + 1 < n; ++i) consider(i, i + 1);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const auto l = size_t(c.left), r = size_t(c.right);
    if (!alive[l] || !alive[r] || next[l] != c.right || tok[l] != c.left_tok || tok[r] != c.right_tok) continue;
    tok[l] = c.merged;
    alive[r] = 0;
    next[l] = next[r];
    if (next[r] >= 0) prev[size_t(next[r])] = c.left;
    consider(prev[l], c.left);
    consider(c.left, next[l]);
  }
  std::vector<int32_t> out;
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = next[size_t(i)]) out.push_back(tok[size_t(i)]);
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
