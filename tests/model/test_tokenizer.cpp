// The llama2.c tokenizer on tok512.bin: encodings computed independently (a Python transcription
// of llama2.c's run.c encode), decode's leading-space and byte-fallback rules, round trips, and
// refusals of malformed files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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
