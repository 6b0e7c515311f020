// fuzz-links: sieve_model
// Tokenizer::encode on arbitrary text, with a small vocabulary built here: every byte has a
// fallback token, printable ASCII has single characters, and a few merges share scores so the
// leftmost-first rule is exercised. Properties beyond "no crash": decoding gives the text back,
// and a limit of exactly the token count is accepted while one less is refused.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_check.hpp"
#include "sieve/model/tokenizer.hpp"
#include "sieve/util/error.hpp"

namespace {

const sieve::model::Tokenizer& tokenizer() {
  static const sieve::model::Tokenizer t = [] {
    std::vector<std::pair<std::string, float>> pieces = {{"<unk>", 0.f}, {"<s>", 0.f}, {"</s>", 0.f}};
    for (int b = 0; b < 256; ++b) {
      char p[8];
      std::snprintf(p, sizeof p, "<0x%02X>", b);
      pieces.emplace_back(p, 0.f);
    }
    for (char c = 0x20; c < 0x7f; ++c) pieces.emplace_back(std::string(1, c), -100.f);
    pieces.emplace_back("é", -100.f);
    for (const auto& [p, s] : std::vector<std::pair<std::string, float>>{
             {" t", -1.f}, {"th", -2.f}, {"he", -2.f}, {"the", -3.f}, {" the", -1.f}, {"in", -2.f},
             {"ng", -2.f}, {"ing", -2.f}, {" a", -1.f}, {"an", -2.f}, {"and", -2.f}, {"aa", -5.f},
             {"aaa", -5.f}, {"ab", -5.f}, {"ba", -5.f}, {"é!", -4.f}, {"\xe2\x98", -4.f}})
      pieces.emplace_back(p, s);
    std::vector<std::byte> bytes;
    auto put = [&](const void* p, size_t n) {
      const auto* b = static_cast<const std::byte*>(p);
      bytes.insert(bytes.end(), b, b + n);
    };
    const int32_t max_len = 16;
    put(&max_len, 4);
    for (const auto& [p, s] : pieces) {
      const int32_t len = int32_t(p.size());
      put(&s, 4);
      put(&len, 4);
      put(p.data(), p.size());
    }
    return sieve::model::Tokenizer::parse(bytes, int32_t(pieces.size()), "fuzz vocabulary");
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const sieve::model::Tokenizer& t = tokenizer();
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::vector<int32_t> ids = t.encode(text, true, false);
  const std::string back = t.decode(std::span<const int32_t>(ids).subspan(1), sieve::model::Tokenizer::kBos);
  if (back != text) sieve::fuzz::violated("decode(encode(text)) != text", std::to_string(ids.size()) + " tokens");
  try {
    if (t.encode(text, true, false, int64_t(ids.size())) != ids)
      sieve::fuzz::violated("a limit changed the encoding", std::to_string(ids.size()));
  } catch (const sieve::Error& e) {
    sieve::fuzz::violated("a limit of exactly the token count was refused", e.what());
  }
  try {
    t.encode(text, true, false, int64_t(ids.size()) - 1);
    sieve::fuzz::violated("a limit below the token count was accepted", std::to_string(ids.size()));
  } catch (const sieve::Error& e) {
    sieve::fuzz::check_message_line(e.what());
  }
  return 0;
}
