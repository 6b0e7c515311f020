// Parameters: user text against a schema (every error class, exact wording), the schema checker,
// the --help formatter, and the value storage's pointer stability.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sieve/runtime/params.hpp>

using namespace sieve::runtime;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace {

sieve_param_spec spec(const char* name, uint32_t type, const char* def, double lo, double hi,
                      const char* choices, const char* doc) {
  return {SIEVE_HEADER_INIT(sieve_param_spec), name, type, def, lo, hi, choices, doc};
}

const std::vector<sieve_param_spec>& quest_like() {
  static const std::vector<sieve_param_spec> s = {
      spec("budget", SIEVE_PARAM_INT, "64", 1, 4096, nullptr, "pages kept"),
      spec("ratio", SIEVE_PARAM_FLOAT, "0.5", 0, 1, nullptr, "recent fraction"),
      spec("mode", SIEVE_PARAM_ENUM, "first", 0, 0, "first|last|both", "which end"),
      spec("keep_last", SIEVE_PARAM_BOOL, "true", 0, 0, nullptr, "keep the last page"),
      spec("layers", SIEVE_PARAM_INT_LIST, "2,14", 0, 31, nullptr, "layers that select"),
      spec("weights", SIEVE_PARAM_STRING, "", 0, 0, nullptr, "weights file")};
  return s;
}
ParamSchema schema() { return {quest_like().data(), uint32_t(quest_like().size())}; }

std::vector<std::string> errors_of(const ParamPairs& user) {
  ParamValues v;
  std::vector<std::string> errors;
  EXPECT_FALSE(parse_params(schema(), user, &v, &errors, "quest@q"));
  EXPECT_EQ(v.size(), 0u);  // nothing half-parsed is handed out
  return errors;
}

TEST(Params, DefaultsFillEveryValueInSchemaOrder) {
  ParamValues v;
  std::vector<std::string> errors;
  ASSERT_TRUE(parse_params(schema(), {}, &v, &errors)) << errors.front();
  ASSERT_EQ(v.size(), 6u);
  EXPECT_EQ(v[0].type, uint32_t(SIEVE_PARAM_INT));
  EXPECT_EQ(v[0].i, 64);
  EXPECT_DOUBLE_EQ(v[1].f, 0.5);
  EXPECT_EQ(v[2].i, 0);
  EXPECT_STREQ(v[2].s, "first");
  EXPECT_EQ(v[3].i, 1);
  ASSERT_EQ(v[4].list_len, 2u);
  EXPECT_EQ(v[4].list[0], 2);
  EXPECT_EQ(v[4].list[1], 14);
  EXPECT_STREQ(v[5].s, "");
}

TEST(Params, UserValuesOfEveryType) {
  ParamValues v;
  std::vector<std::string> errors;
  ASSERT_TRUE(parse_params(schema(),
                           {{"mode", "both"}, {"budget", " 4096"}, {"ratio", "1e-3"},
                            {"keep_last", "off"}, {"layers", "[ 0, 7 ,31 ]"},
                            {"weights", "/tmp/a b.bin"}},
                           &v, &errors))
      << errors.front();
  EXPECT_EQ(v[0].i, 4096);
  EXPECT_DOUBLE_EQ(v[1].f, 1e-3);
  EXPECT_EQ(v[2].i, 2);
  EXPECT_STREQ(v[2].s, "both");
  EXPECT_EQ(v[3].i, 0);
  EXPECT_THAT(std::vector<int64_t>(v[4].list, v[4].list + v[4].list_len), ElementsAre(0, 7, 31));
  EXPECT_STREQ(v[5].s, "/tmp/a b.bin");
}

TEST(Params, EmptyList) {
  ParamValues v;
  std::vector<std::string> errors;
  ASSERT_TRUE(parse_params(schema(), {{"layers", "[]"}}, &v, &errors));
  EXPECT_EQ(v[4].list_len, 0u);
}

TEST(Params, UnknownNameSuggestsTheClosest) {
  EXPECT_THAT(errors_of({{"budgte", "3"}}),
              ElementsAre("quest@q: unknown parameter 'budgte' (did you mean 'budget'?)"));
  EXPECT_THAT(errors_of({{"zzzzzz", "3"}}),
              ElementsAre("quest@q: unknown parameter 'zzzzzz' (known: budget, ratio, mode, "
                          "keep_last, layers, weights)"));
}

TEST(Params, NoParametersAtAll) {
  ParamValues v;
  std::vector<std::string> errors;
  EXPECT_FALSE(parse_params(ParamSchema(), {{"k", "1"}}, &v, &errors));
  EXPECT_THAT(errors, ElementsAre("unknown parameter 'k' (it takes no parameters)"));
}

TEST(Params, GivenTwice) {
  EXPECT_THAT(errors_of({{"budget", "3"}, {"budget", "4"}}),
              ElementsAre("quest@q: parameter 'budget' is given twice"));
}

TEST(Params, WrongTypes) {
  EXPECT_THAT(errors_of({{"budget", "abc"}}), ElementsAre("quest@q: budget='abc' is not an integer"));
  EXPECT_THAT(errors_of({{"budget", "1.5"}}), ElementsAre("quest@q: budget='1.5' is not an integer"));
  EXPECT_THAT(errors_of({{"budget", "99999999999999999999"}}),
              ElementsAre("quest@q: budget='99999999999999999999' is not an integer"));
  EXPECT_THAT(errors_of({{"ratio", "half"}}),
              ElementsAre("quest@q: ratio='half' is not a finite number"));
  EXPECT_THAT(errors_of({{"ratio", "nan"}}),
              ElementsAre("quest@q: ratio='nan' is not a finite number"));
  EXPECT_THAT(errors_of({{"keep_last", "maybe"}}),
              ElementsAre("quest@q: keep_last='maybe' is not a bool (true or false)"));
  EXPECT_THAT(errors_of({{"layers", "[1,x]"}}),
              ElementsAre("quest@q: layers='[1,x]': 'x' is not an integer (write [2,14,22])"));
  EXPECT_THAT(errors_of({{"layers", "2/14"}}),
              ElementsAre("quest@q: layers='2/14': '2/14' is not an integer (write [2,14,22])"));
  EXPECT_THAT(errors_of({{"layers", "[1,2"}}), ElementsAre("quest@q: layers='[1,2': missing ']'"));
}

TEST(Params, ControlCharactersAreNotWhiteSpaceAndAreEscaped) {
  // strtoll skipped a form feed ("\f32" read as 32) and the message echoed it raw; found by
  // tests/fuzz/fuzz_params.cpp (corpus/params/found_formfeed_element).
  EXPECT_THAT(errors_of({{"budget", "\f32"}}), ElementsAre("quest@q: budget='\\x0C32' is not an integer"));
  EXPECT_THAT(errors_of({{"ratio", "\n0.5"}}), ElementsAre("quest@q: ratio='\\n0.5' is not a finite number"));
  EXPECT_THAT(errors_of({{"layers", "[\f3]"}}),
              ElementsAre("quest@q: layers='[\\x0C3]': '\\x0C3' is not an integer (write [2,14,22])"));
  EXPECT_THAT(errors_of({{"mode", "\x1b[2J"}}), ElementsAre("quest@q: mode='\\x1B[2J' is not one of first|last|both"));
  EXPECT_THAT(errors_of({{"bud\x07get", "1"}}), ElementsAre(HasSubstr("unknown parameter 'bud\\x07get'")));
}

TEST(Params, OutOfRangeNamesTheRange) {
  EXPECT_THAT(errors_of({{"budget", "0"}}),
              ElementsAre("quest@q: budget=0 is out of range [1, 4096]"));
  EXPECT_THAT(errors_of({{"ratio", "1.5"}}),
              ElementsAre("quest@q: ratio=1.5 is out of range [0, 1]"));
  EXPECT_THAT(errors_of({{"layers", "[3,32]"}}),
              ElementsAre("quest@q: layers=[3,32]: element 32 is out of range [0, 31]"));
}

TEST(Params, BadEnumChoiceListsTheChoices) {
  EXPECT_THAT(errors_of({{"mode", "middle"}}),
              ElementsAre("quest@q: mode='middle' is not one of first|last|both"));
}

TEST(Params, EveryProblemIsReported) {
  EXPECT_EQ(errors_of({{"budget", "0"}, {"mode", "x"}, {"nope", "1"}}).size(), 3u);
}

TEST(Params, BadDefaultIsBlamedOnThePolicy) {
  std::vector<sieve_param_spec> s = {spec("k", SIEVE_PARAM_INT, "99", 1, 10, nullptr, "k")};
  ParamValues v;
  std::vector<std::string> errors;
  EXPECT_FALSE(parse_params({s.data(), 1}, {}, &v, &errors));
  EXPECT_THAT(errors, ElementsAre("k=99 is out of range [1, 10] (the policy's own default)"));
  errors.clear();
  EXPECT_TRUE(parse_params({s.data(), 1}, {{"k", "3"}}, &v, &errors));  // overriding it is fine
}

TEST(Params, ValuesStayValidAcrossCopiesAndMoves) {
  ParamValues keep;
  {
    ParamValues v;
    std::vector<std::string> errors;
    ASSERT_TRUE(parse_params(schema(), {{"mode", "last"}, {"layers", "[5,6,7]"}, {"weights", "w"}},
                             &v, &errors));
    ParamValues copy = v;
    keep = std::move(copy);
    EXPECT_NE(keep[2].s, v[2].s);  // its own storage, not the original's
  }
  EXPECT_STREQ(keep[2].s, "last");
  EXPECT_STREQ(keep[5].s, "w");
  EXPECT_EQ(keep.text(5), "w");
  ASSERT_EQ(keep[4].list_len, 3u);
  EXPECT_EQ(keep[4].list[2], 7);
  EXPECT_EQ(keep.list(4).data(), keep[4].list);
}

TEST(Params, SchemaStrideFollowsStructSize) {
  // A plugin built against a later minor has a larger sieve_param_spec; index by its size.
  struct Grown {
    sieve_param_spec s;
    double later_field;
  };
  Grown g[2] = {{spec("a", SIEVE_PARAM_INT, "1", 0, 9, nullptr, "a"), 0.0},
                {spec("b", SIEVE_PARAM_INT, "2", 0, 9, nullptr, "b"), 0.0}};
  g[0].s.hdr.struct_size = g[1].s.hdr.struct_size = sizeof(Grown);
  ParamSchema view(&g[0].s, 2);
  EXPECT_STREQ(view[1].name, "b");
  EXPECT_EQ(view.find("b"), 1);
  EXPECT_TRUE(check_schema(view).empty());
}

TEST(Params, SchemaCheckerFindsEachProblem) {
  std::vector<sieve_param_spec> s = {
      spec("ok", SIEVE_PARAM_INT, "1", 0, 9, nullptr, "fine"),
      spec("Bad-Name", SIEVE_PARAM_INT, "1", 0, 9, nullptr, "x"),
      spec("ok", SIEVE_PARAM_INT, "1", 0, 9, nullptr, "again"),
      spec("inverted", SIEVE_PARAM_FLOAT, "1", 5, 2, nullptr, "x"),
      spec("choiceless", SIEVE_PARAM_ENUM, "a", 0, 0, nullptr, "x"),
      spec("undocumented", SIEVE_PARAM_BOOL, "true", 0, 0, nullptr, ""),
      spec("bad_default", SIEVE_PARAM_INT, "ten", 0, 9, nullptr, "x"),
      spec("far_default", SIEVE_PARAM_INT_LIST, "[1,20]", 0, 9, nullptr, "x"),
      spec("no_default", SIEVE_PARAM_STRING, nullptr, 0, 0, nullptr, "x"),
      spec("weird", 17, "1", 0, 0, nullptr, "x"),
      spec("dup_choice", SIEVE_PARAM_ENUM, "a", 0, 0, "a|b|a", "x"),
      spec("enum_default", SIEVE_PARAM_ENUM, "c", 0, 0, "a|b", "x"),
  };
  s.push_back(spec("small", SIEVE_PARAM_INT, "1", 0, 9, nullptr, "x"));
  s.back().hdr.struct_size = 16;
  EXPECT_THAT(check_schema({s.data(), uint32_t(s.size())}),
              ElementsAre("parameter 1: name 'Bad-Name' does not match [a-z0-9_]+",
                          "parameter 'ok' is declared twice",
                          "parameter 'inverted': min 5 > max 2",
                          "parameter 'choiceless': enum without choices",
                          "parameter 'undocumented': empty doc",
                          "parameter 'bad_default': default bad_default='ten' is not an integer",
                          "parameter 'far_default': default far_default=[1,20]: element 20 is out "
                          "of range [0, 9]",
                          "parameter 'no_default': no default value",
                          "parameter 'weird': unknown type 17",
                          "parameter 'dup_choice': enum choice 'a' repeated",
                          "parameter 'enum_default': default enum_default='c' is not one of a|b",
                          "parameter 12: struct_size 16 < " +
                              std::to_string(sizeof(sieve_param_spec)) + " (v1.0 size)"));
}

TEST(Params, HelpListing) {
  std::string text = format_schema(schema(), "  ");
  EXPECT_EQ(text,
            "  budget     int       = 64     [1, 4096]          pages kept\n"
            "  ratio      float     = 0.5    [0, 1]             recent fraction\n"
            "  mode       enum      = first  {first|last|both}  which end\n"
            "  keep_last  bool      = true                      keep the last page\n"
            "  layers     int_list  = 2,14   [0, 31]            layers that select\n"
            "  weights    string    = \"\"                        weights file\n");
  EXPECT_EQ(format_schema(ParamSchema()), "  (no parameters)\n");
}

TEST(Params, ClosestName) {
  EXPECT_EQ(closest_name("top_kk", {"top_k", "budget"}), "top_k");
  EXPECT_EQ(closest_name("xyz", {"top_k", "budget"}), "");
}

}  // namespace
