// Symbolic dim sizes (core/ir/dim_expr.h): canonical forms, exact division, decidable comparisons, evaluation against
// brute force, the text form round trip, and hostile text.
#include "core/ir/dim_expr.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>

#include "core/ir/ir.h"

namespace gspmd {
namespace {

DimExpr S(const char* name) { return DimExpr::symbol(name); }

TEST(DimExpr, CanonicalFormMakesEqualPolynomialsEqual) {
  const DimExpr b = S("batch"), p = S("past_len");
  EXPECT_EQ(b + 1 - 1, b);
  EXPECT_EQ(2 * (b + p), b * 2 + p + p);
  EXPECT_EQ((b + 1) * (b - 1), b * b - 1);
  EXPECT_EQ(b - b, DimExpr(0));
  EXPECT_EQ((b + p).str(), "batch + past_len");
  EXPECT_EQ((p + b).str(), "batch + past_len");
  EXPECT_EQ((p + 1).str(), "past_len + 1");
  EXPECT_EQ((1 - 2 * b).str(), "-2*batch + 1");
  EXPECT_EQ((b * p * 3).str(), "3*batch*past_len");
  EXPECT_EQ(DimExpr(-7).str(), "-7");
  EXPECT_TRUE((b - b).is_constant());
  EXPECT_EQ((b * 0 + 5).constant(), 5);
  EXPECT_EQ((b + p * b).symbols(), (std::vector<std::string>{"batch", "past_len"}));
}

TEST(DimExpr, DivisionsTakeOutWhatDividesExactly) {
  const DimExpr b = S("b"), s = S("s");
  EXPECT_EQ(floor_div(2 * b + 3, 2), b + 1);
  EXPECT_EQ(ceil_div(2 * b + 3, 2), b + 2);
  EXPECT_EQ(ceil_div(4 * b, 2), 2 * b);
  EXPECT_EQ(ceil_div(b, 1), b);
  EXPECT_EQ(ceil_div(b, 2).str(), "ceil(b / 2)");
  EXPECT_EQ(floor_div(b + s, 4).str(), "floor((b + s) / 4)");
  EXPECT_EQ(ceil_div(3 * b + 1, 2), b + ceil_div(b + 1, 2));  // 3b + 1 = 2b + (b + 1)
  EXPECT_EQ(ceil_div(ceil_div(b, 2), 3), ceil_div(b, 6));
  EXPECT_EQ(floor_div(floor_div(b, 2), 2), floor_div(b, 4));
  EXPECT_EQ(mod(2 * b + 3, 2), DimExpr(1));
  EXPECT_EQ(mod(b, 2), b - 2 * floor_div(b, 2));
  EXPECT_EQ(floor_div(DimExpr(-3), 2), DimExpr(-2));
  EXPECT_EQ(ceil_div(DimExpr(-3), 2), DimExpr(-1));
  EXPECT_THROW(ceil_div(b, 0), std::invalid_argument);
}

// Reshape's -1: the quotient that multiplies back, or nothing.
TEST(DimExpr, ExactDivisionFindsTheQuotientThatMultipliesBack) {
  const DimExpr b = S("b"), s = S("s");
  EXPECT_EQ(exact_div(16 * b * s, 4 * b), std::optional<DimExpr>(4 * s));
  EXPECT_EQ(exact_div(2 * b + 2 * s, b + s), std::optional<DimExpr>(DimExpr(2)));
  EXPECT_EQ(exact_div(b * s * 64, b * s * 16), std::optional<DimExpr>(DimExpr(4)));
  EXPECT_EQ(exact_div(6 * b + 4, 2), std::optional<DimExpr>(3 * b + 2));
  EXPECT_EQ(exact_div(b * (s + 1), s + 1), std::optional<DimExpr>(b));
  EXPECT_EQ(exact_div(b * s, b * b), std::nullopt);
  EXPECT_EQ(exact_div(b + 1, 2), std::nullopt);  // 2 does not divide b + 1 for every b
  EXPECT_EQ(exact_div(b + s, b), std::nullopt);
  EXPECT_EQ(exact_div(b, 0), std::nullopt);
  EXPECT_EQ(exact_div(0, b), std::optional<DimExpr>(DimExpr(0)));
}

TEST(DimExpr, ComparisonsAreDecidedOnlyWhenTheyHoldForEveryValue) {
  const DimExpr b = S("b"), p = S("p");
  EXPECT_EQ(known_ge(b + 1, b), true);
  EXPECT_EQ(known_ge(b, b + 1), false);
  EXPECT_EQ(known_ge(b, 0), true);  // a dim is never negative
  EXPECT_EQ(known_ge(b + p, p), true);
  EXPECT_EQ(known_ge(b, p), std::nullopt);
  EXPECT_EQ(known_ge(b - p, 0), std::nullopt);
  EXPECT_EQ(known_ge(ceil_div(b, 2), 0), true);
  EXPECT_EQ(known_eq(b + 1, b), false);
  EXPECT_EQ(known_eq(b, p), std::nullopt);
  EXPECT_EQ(known_eq(2 * ceil_div(b, 2), b), std::nullopt);  // b = 3: 4 != 3; b = 2: equal
  EXPECT_EQ(max(b, b + 1), b + 1);
  EXPECT_EQ(min(b + p, p), p);
  EXPECT_EQ(max(b, p), max(p, b));
  EXPECT_EQ(max(b, p).str(), "max(b, p)");
}

TEST(DimExpr, EvalAndSubstAgreeWithIntegerArithmetic) {
  const DimExpr b = S("b"), p = S("p");
  const DimExpr local = ceil_div(b, 4);
  const DimExpr last = b - 3 * local;  // the last of 4 shards (may be negative when b < 4: padding only)
  const DimExpr e = max(local * 2 + mod(p + 1, 3), floor_div(b * p, 5)) - min(p, last);
  for (int64_t bv = 0; bv < 12; ++bv)
    for (int64_t pv = 0; pv < 9; ++pv) {
      const DimBindings bind{{"b", bv}, {"p", pv}};
      const int64_t loc = (bv + 3) / 4;
      const int64_t want = std::max(loc * 2 + (pv + 1) % 3, bv * pv / 5) - std::min(pv, bv - 3 * loc);
      ASSERT_EQ(e.eval(bind), want) << "b=" << bv << " p=" << pv;
      ASSERT_EQ(e.subst({{"b", bv}}).eval({{"p", pv}}), want);
      ASSERT_EQ(e.subst(bind).constant(), want);
    }
  try {
    e.eval({{"b", 1}});
    FAIL() << "an unbound symbol must throw";
  } catch (const InputError& err) {
    EXPECT_STREQ(err.what(), "dim 'p' is not bound (--dim p=N)");
  }
}

TEST(DimExpr, TextRoundTrips) {
  const DimExpr b = S("batch"), p = S("past_len"), odd = S("seq len");
  for (const DimExpr& e : {p + 1, ceil_div(b, 2), 2 * b * p - 7, floor_div(b + p, 3) * 2, max(b, p + 1) - min(b, 2),
                           odd * 2, S("max_len") + mod(b, 4), DimExpr(-3), DimExpr(0)}) {
    EXPECT_EQ(DimExpr::parse(e.str()), e) << e.str();
    EXPECT_EQ(DimExpr::parse(e.str()).str(), e.str());
  }
  EXPECT_EQ(odd.str(), "'seq len'");
  EXPECT_EQ(S("max").str(), "'max'");
  EXPECT_EQ(DimExpr::parse("past_len + 1"), p + 1);
  EXPECT_EQ(DimExpr::parse("ceil(batch / 2)"), ceil_div(b, 2));
  EXPECT_EQ(DimExpr::parse("batch // 2"), floor_div(b, 2));
  EXPECT_EQ(DimExpr::parse(" -(batch - 3) * 2 "), 6 - 2 * b);
  EXPECT_EQ(DimExpr::from_dim_param("batch size"), S("batch size"));  // not an expression: one symbol
  EXPECT_EQ(DimExpr::from_dim_param("unk__12"), S("unk__12"));
  EXPECT_EQ(DimExpr::from_dim_param("N"), S("N"));
}

TEST(DimExpr, BadAndHostileTextIsOneLine) {
  auto error_of = [](const std::string& text) {
    try {
      DimExpr::parse(text);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("batch +"), "dim expression 'batch +': unexpected end at column 8");
  EXPECT_EQ(error_of("ceil(batch / 0)"), "dim expression 'ceil(batch / 0)': division by 0 at column 15");
  EXPECT_EQ(error_of("batch / 2"), "dim expression 'batch / 2': unexpected '/' at column 7");
  EXPECT_EQ(error_of("99999999999999999999"), "dim expression overflows int64");
  EXPECT_EQ(error_of(std::string(100000, '(') + "b" + std::string(100000, ')')),
            "dim expression '" + std::string(37, '(') + "...': nested too deeply at column 33");
  // A product of 10 sums has 2^10 terms: refused, not expanded.
  std::string product;
  for (int i = 0; i < 10; ++i) product += (i ? "*" : "") + std::string("(a") + std::to_string(i) + " + b)";
  EXPECT_EQ(error_of(product), "dim expression has more than 64 terms");
  EXPECT_EQ(DimExpr::from_dim_param(product), S(product.c_str()));  // as a dim_param: one opaque symbol
  EXPECT_THROW(DimExpr::symbol(""), InputError);
}

}  // namespace
}  // namespace gspmd
