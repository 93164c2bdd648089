// Users' regular expressions over value names (core/ir/name_pattern.h, RE2) and sub-axis names
// (parse_sub_axis_name): hostile patterns and names finish in linear time, and bad patterns are one-line errors.
// Users' JSON (core/ir/json_bounded.h): nested at most 64 levels.
#include "core/ir/name_pattern.h"

#include <gtest/gtest.h>

#include <string>

#include "core/ir/ir.h"
#include "core/ir/json_bounded.h"
#include "core/sharding/sharding.h"

namespace gspmd {
namespace {

std::string error_of(const std::string& pattern, const std::string& what) {
  try {
    NamePattern p(pattern, what);
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

TEST(NamePattern, SearchesLikeRegexSearch) {
  const NamePattern p(R"(h\.(\d+)\.mlp)", "t");
  EXPECT_TRUE(p.search("transformer.h.12.mlp.fc_in.weight"));
  EXPECT_FALSE(p.search("transformer.h.12.attn.q.weight"));
  EXPECT_EQ(p.groups(), 1);
  EXPECT_EQ(p.search_group1("transformer.h.12.mlp.w"), std::make_pair(size_t{14}, size_t{16}));
  EXPECT_EQ(p.search_group1("h.x.mlp"), std::nullopt);
  EXPECT_EQ(NamePattern("a|(b)", "t").search_group1("a"), std::nullopt);  // group 1 did not take part
  EXPECT_TRUE(NamePattern("^fc$", "t").search("fc"));
  EXPECT_FALSE(NamePattern("^fc$", "t").search("fc2"));
}

// The patterns that crashed (std::regex recursed once per character) or hung (backtracking) before: each is one
// linear scan now. A hang would show as the test's timeout.
TEST(NamePattern, HostilePatternsAndNamesAreLinear) {
  const std::string as(50000, 'a'), vs(50000, 'v');
  EXPECT_FALSE(NamePattern("^(.*.*)*X$", "t").search(as));
  EXPECT_TRUE(NamePattern("^v+$", "t").search(vs));
  EXPECT_FALSE(NamePattern(R"((.|\s)*Q)", "t").search(std::string(20000, 'a')));
  EXPECT_TRUE(NamePattern("(a|aa)+$", "t").search(as));
  std::string alternatives;  // 50,000 alternatives: within RE2's memory bound
  for (int i = 0; i < 50000; ++i) alternatives += (i ? "|w" : "w") + std::to_string(i);
  EXPECT_TRUE(NamePattern(alternatives, "t").search("x.w49999"));
  // A program over the bound is refused when it is compiled, in one line.
  EXPECT_EQ(
      error_of(R"(\pL{1000})", "rules[0].match"),
      R"(rules[0].match: '\pL{1000}' is not a regular expression RE2 accepts: pattern too large - compile failed)");
}

TEST(NamePattern, PatternsRe2RefusesAreOneLine) {
  EXPECT_EQ(error_of(R"((a)\1)", "--trainable"),
            R"(--trainable: '(a)\1' is not a regular expression RE2 accepts: invalid escape sequence: \1)");
  EXPECT_EQ(error_of("(?=x)", "--layers"),
            "--layers: '(?=x)' is not a regular expression RE2 accepts: invalid perl operator: (?=");
  EXPECT_EQ(error_of("(" + std::string(100, 'a'), "--layers"),
            "--layers: '(" + std::string(56, 'a') + "...' is not a regular expression RE2 accepts: missing ): (" +
                std::string(100, 'a'));
}

TEST(SubAxisName, ParsesShardysNotationOnly) {
  auto s = parse_sub_axis_name("model:(2)4");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->parent, "model");
  EXPECT_EQ(s->pre, 2);
  EXPECT_EQ(s->size, 4);
  s = parse_sub_axis_name("a:b:(1)2");  // the last ":(" starts the sub-axis
  ASSERT_TRUE(s);
  EXPECT_EQ(s->parent, "a:b");
  for (const char* bad : {"x", ":(1)2", "x:(1)", "x:()2", "x:(1)2a", "x:(a)2", "x:(1234567890123)2", "x(1)2"})
    EXPECT_EQ(parse_sub_axis_name(bad), std::nullopt) << bad;
  EXPECT_EQ(parse_sub_axis_name(std::string(50000, ':') + "(1)"), std::nullopt);
}

// Every error is one line: user text is cut, and a list of problems keeps its first with a count of the rest.
TEST(ErrorText, OneLineOfBoundedLength) {
  EXPECT_EQ(first_line("a\n(op_type:Add): b\n\n(op_type:Mul): c\n"), "a (and 2 more)");
  EXPECT_EQ(first_line("\n  \nonly\r\n"), "only");
  EXPECT_EQ(first_line(""), "");
  EXPECT_EQ(cut_text(std::string(100, 'x'), 10), "xxxxxxx...");
  EXPECT_EQ(cut_text("short", 10), "short");
}

// The depth is counted over the brackets outside strings: 64 levels parse, 65 do not, and brackets (or an escaped
// quote followed by brackets) inside a string are text.
TEST(JsonBounded, SixtyFourLevelsParseAndSixtyFiveDoNot) {
  auto nested = [](int levels, const std::string& inner) {
    std::string t;
    for (int k = 0; k < levels; ++k) t += k % 2 ? "[" : "{\"a\":";
    t += inner;
    for (int k = levels - 1; k >= 0; --k) t += k % 2 ? "]" : "}";
    return t;
  };
  EXPECT_EQ(parse_json_bounded(nested(64, "1"), "f.json").flatten().size(), 1u);
  try {
    parse_json_bounded(nested(65, "1"), "f.json");
    FAIL() << "65 levels parsed";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "f.json: JSON nested deeper than 64 levels");
  }
  EXPECT_EQ(parse_json_bounded(nested(64, R"("\"[[[[{{{{")"), "f.json").flatten().begin()->get<std::string>(),
            "\"[[[[{{{{");
  // 100 brackets inside a string, in malformed text (no closing bracket): the parser's error, not the depth's
  EXPECT_THROW(parse_json_bounded("[\"" + std::string(100, '[') + "\"", "f.json"), nlohmann::json::parse_error);
}

}  // namespace
}  // namespace gspmd
