// The llama2.c tokenizer on tok512.bin: encodings computed independently (a Python transcription
// of llama2.c's run.c encode), decode's leading-space and byte-fallback rules, round trips, and
// refusals of malformed files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <unordered_map>

#include "model_files.hpp"
#include "sieve/util/file_input.hpp"
#include "sieve/model/tokenizer.hpp"
#include "sieve/util/error.hpp"

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using sieve::model::Tokenizer;

namespace {

const Tokenizer& tok() {
  static const Tokenizer t = Tokenizer::load(sieve::test::default_tokenizer_path(), 512);
  return t;
}

TEST(Tokenizer, KnownEncodings) {
  EXPECT_THAT(tok().encode("Once upon a time", true, false), ElementsAre(1, 403, 407, 261, 378));
  EXPECT_THAT(tok().encode("Lily's mom said, \"Hi!\"", true, false),
              ElementsAre(1, 317, 439, 419, 357, 336, 432, 313, 440, 417, 443, 436));
  // é is a token; ☃ is not: byte fallback <0xE2><0x98><0x83>.
  EXPECT_THAT(tok().encode("café ☃", true, false), ElementsAre(1, 280, 412, 431, 485, 410, 229, 155, 134));
  EXPECT_THAT(tok().encode("Tom\nran", true, false), ElementsAre(1, 274, 287, 13, 420, 303));
  // Empty text: BOS alone (no dummy prefix); EOS on request.
  EXPECT_THAT(tok().encode("", true, false), ElementsAre(1));
  EXPECT_THAT(tok().encode("", true, true), ElementsAre(1, 2));
  EXPECT_THAT(tok().encode("Once", false, true), ElementsAre(403, 2));
}

TEST(Tokenizer, DecodeStripsTheDummySpaceAfterBosAndMapsBytes) {
  EXPECT_EQ(tok().decode_piece(1, 403), "Once");
  EXPECT_EQ(tok().decode_piece(378, 403), " Once");
  EXPECT_EQ(tok().decode_piece(1, 13), "\n");                   // <0x0A>
  EXPECT_EQ(tok().decode_piece(5, 229), std::string("\xE2"));  // <0xE2>
  EXPECT_THROW(tok().decode_piece(1, 512), sieve::Error);
}

TEST(Tokenizer, RoundTrips) {
  for (const std::string text : {"Once upon a time, there was a little girl named Lily.",
                                 "She said: \"Look! 3 big, red balls...\"\n\tOK?", "naïve café ☃ 日本 🙂", "  two  spaces"}) {
    const std::vector<int32_t> ids = tok().encode(text, true, false);
    EXPECT_EQ(tok().decode(std::span<const int32_t>(ids).subspan(1), 1), text);
  }
}

TEST(Tokenizer, MergesPreferHigherScores) {
  // " the" (score -6) must come out whole rather than " t" + "he".
  EXPECT_THAT(tok().encode("the", false, false), ElementsAre(265));
  EXPECT_EQ(tok().piece(265), " the");
}

// run.c's encode as it was before the heap: rescan every adjacent pair, merge the best (strictly
// above -1e10, leftmost on ties), repeat. Quadratic; the oracle the fast merge must equal.
std::vector<int32_t> run_c_encode(const Tokenizer& t, const std::string& text) {
  std::unordered_map<std::string, int32_t> ids;
  for (int32_t i = 0; i < t.vocab_size(); ++i) ids.emplace(t.piece(i), i);
  auto lookup = [&](const std::string& s) {
    auto it = ids.find(s);
    return it == ids.end() ? -1 : it->second;
  };
  std::vector<int32_t> out;
  if (!text.empty() && lookup(" ") >= 0) out.push_back(lookup(" "));
  for (size_t i = 0; i < text.size();) {
    size_t n = 1;
    while (i + n < text.size() && n < 4 && (static_cast<unsigned char>(text[i + n]) & 0xC0) == 0x80) ++n;
    if (const int32_t id = lookup(text.substr(i, n)); id >= 0) {
      out.push_back(id);
    } else {
      for (size_t k = i; k < i + n; ++k) {
        char piece[8];
        std::snprintf(piece, sizeof piece, "<0x%02X>", static_cast<unsigned char>(text[k]));
        out.push_back(std::max(lookup(piece), 0));
      }
    }
    i += n;
  }
  for (;;) {
    float best = -1e10f;
    int64_t at = -1;
    int32_t best_id = -1;
    for (size_t i = 0; i + 1 < out.size(); ++i) {
      const int32_t id = lookup(t.piece(out[i]) + t.piece(out[i + 1]));
      if (id >= 0 && t.score(id) > best) best = t.score(id), at = int64_t(i), best_id = id;
    }
    if (at < 0) return out;
    out[size_t(at)] = best_id;
    out.erase(out.begin() + at + 1);
  }
}

TEST(Tokenizer, MergesInRunCOrderOnRandomTexts) {
  const std::vector<std::string> alphabet = {"a", "e", "t", "h", " ", " ", "s", "o", "n", "L", ".", ",", "\n",
                                             "'", "é", "☃", "日", "\xff", "\x80", "🙂", "the", " and", "ing"};
  std::mt19937 rng(7);
  for (int n = 0; n < 300; ++n) {
    std::string text;
    const int len = std::uniform_int_distribution<int>(0, 120)(rng);
    for (int i = 0; i < len; ++i) text += alphabet[rng() % alphabet.size()];
    std::vector<int32_t> want = run_c_encode(tok(), text);
    want.insert(want.begin(), Tokenizer::kBos);
    ASSERT_EQ(tok().encode(text, true, false), want) << text;
  }
  for (const std::string text : {"Once upon a time", "Lily and Ben went to the park to play",
                                 "The little dog was sad because", "One day, a big bird flew"})
    EXPECT_EQ(tok().encode(text, false, false), run_c_encode(tok(), text)) << text;
}

// Equal scores everywhere: only the leftmost-first rule decides, and "aaaa" must pair (aa)(aa)
// while a greedy that preferred the right pair would give a(aa)a.
TEST(Tokenizer, TiesMergeLeftmostFirst) {
  std::vector<std::byte> b;
  auto put = [&](const void* p, size_t n) {
    const auto* c = static_cast<const std::byte*>(p);
    b.insert(b.end(), c, c + n);
  };
  const std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", " ", "a", "b", "aa", "ab", "ba", " a", "aaa"};
  const int32_t max_len = 8;
  put(&max_len, 4);
  for (const auto& p : pieces) {
    const float score = 1.f;
    const int32_t len = int32_t(p.size());
    put(&score, 4);
    put(&len, 4);
    put(p.data(), p.size());
  }
  const Tokenizer t = Tokenizer::parse(b, int32_t(pieces.size()), "ties");
  std::mt19937 rng(3);
  for (int n = 0; n < 200; ++n) {
    std::string text;
    for (int i = int(rng() % 30); i > 0; --i) text += "ab"[rng() % 2];
    EXPECT_EQ(t.encode(text, false, false), run_c_encode(t, text)) << text;
  }
  EXPECT_EQ(t.encode("aaaa", false, false), run_c_encode(t, "aaaa"));
}

// Issue 17: a 120 KB prompt took over 20 s (quadratic merges). Now a megabyte encodes in well
// under a second, and a length limit refuses an over-long text before encoding it.
TEST(Tokenizer, LongTextsEncodeFastAndLimitsApplyFirst) {
  std::string text;
  while (text.size() < (1u << 20)) text += "Once upon a time, Lily saw a big dog. ";
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok().encode(text, true, false);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  EXPECT_EQ(tok().decode(std::span<const int32_t>(ids).subspan(1), 1), text);
  try {
    tok().encode(text, true, false, 512);
    FAIL() << "a megabyte of text fit 512 tokens";
  } catch (const sieve::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("needs at least"));
  }
  EXPECT_EQ(tok().encode("Once upon a time", true, false, 5).size(), 5u);
  EXPECT_THROW(tok().encode("Once upon a time", true, false, 4), sieve::Error);
}

TEST(Tokenizer, RefusesMalformedFiles) {
  const std::vector<std::byte> good = sieve::read_file(sieve::test::default_tokenizer_path(), "tokenizer", 1 << 20);
  std::vector<std::byte> cut(good.begin(), good.end() - 3);
  try {
    Tokenizer::parse(cut, 512, "cut.bin");
    FAIL() << "a truncated tokenizer was accepted";
  } catch (const sieve::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tokenizer 'cut.bin': truncated at token 511"));
  }
  try {
    Tokenizer::parse(good, 500, "tok512.bin");
    FAIL() << "a tokenizer for another vocabulary was accepted";
  } catch (const sieve::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("bytes follow the 500 tokens"));
  }
  std::vector<std::byte> bad = good;
  const int32_t huge = 1 << 20;
  std::memcpy(bad.data() + 4 + 4, &huge, 4);  // token 0's length
  EXPECT_THROW(Tokenizer::parse(bad, 512, "bad.bin"), sieve::Error);
}

}  // namespace
