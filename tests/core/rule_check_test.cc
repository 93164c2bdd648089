// Checked rules: get_rule's outcomes (RuleResult), check(), RuleMaker and RuleTable, and how a builder error reaches
// the partitioner's warnings.
#include <gtest/gtest.h>

#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"
#include "tests/test_util/graph_builder.h"
#include "tests/test_util/rule_literal.h"

namespace gspmd {
namespace {

using testing::GraphBuilder;
using testing::make_rule;
constexpr FactorKind kPass = FactorKind::kPassThrough;
constexpr const char* kDomain = "rule_check_test";

/// Registers `op` in kDomain with builder `b`; returns a node of it over `in` with result shape `out`.
int custom_node(GraphBuilder& gb, const std::string& op, RuleBuilder b, std::vector<int> in, Shape out) {
  register_rule(kDomain, op, std::move(b));
  const int n = gb.node(op, std::move(in), std::move(out));
  gb.g.nodes[n].domain = kDomain;
  return n;
}

TEST(RuleResult, DistinguishesTheOutcomes) {
  GraphBuilder b;
  const int x = b.input("x", {2, 6, 16}), a = b.input("a", {2, 1, 4, 8});
  const int unknown = b.node("NoSuchOp", {x}, {2});
  const int bad_shapes = b.node("MatMul", {x, a}, {2, 6, 5});
  const int ok = b.node("Relu", {x}, {2, 6, 16});
  const int throws = custom_node(
      b, "Throws", [](const Graph&, const Node&) -> RuleResult { throw std::runtime_error("oops"); }, {x}, {2, 6, 16});

  const RuleResult r0 = get_rule(b.g, b.g.nodes[unknown]);
  EXPECT_EQ(r0.status, RuleResult::kNoRule);
  EXPECT_FALSE(r0.has_value());
  EXPECT_EQ(r0.describe(), "has no sharding rule");

  const RuleResult r1 = get_rule(b.g, b.g.nodes[bad_shapes]);
  EXPECT_EQ(r1.status, RuleResult::kNotExpressible);
  EXPECT_FALSE(r1);
  EXPECT_FALSE(r1.reason.empty());
  EXPECT_EQ(r1.describe(), "has no sharding rule for this instance: " + r1.reason);

  const RuleResult r2 = get_rule(b.g, b.g.nodes[ok]);
  EXPECT_EQ(r2.status, RuleResult::kOk);
  EXPECT_EQ(r2->str(), "([i,j,k])->([i,j,k]) {i=2, j=6, k=16}");
  EXPECT_EQ(r2.describe(), "");

  const RuleResult r3 = get_rule(b.g, b.g.nodes[throws]);
  EXPECT_EQ(r3.status, RuleResult::kBuilderError);
  EXPECT_EQ(r3.describe(), "has no sharding rule: rule builder error (a bug): oops");
}

TEST(RuleResult, ABuiltRuleThatFailsCheckIsABuilderError) {
  GraphBuilder b;
  const int x = b.input("x", {4, 8});
  const int n = custom_node(b, "WrongRank",
                            [](const Graph&, const Node&) -> RuleResult {
                              return make_rule({4}, {kPass}, {{{0}}}, {{{0}}});  // x has two dims
                            },
                            {x}, {4, 8});
  const RuleResult r = get_rule(b.g, b.g.nodes[n]);
  EXPECT_EQ(r.status, RuleResult::kBuilderError);
  EXPECT_EQ(r.reason, "operand 0 ('x') has rank 2 but 1 dims of factors");
  // A builder returning nullopt (no reason) is "not expressible".
  const int m =
      custom_node(b, "Nullopt", [](const Graph&, const Node&) -> std::optional<OpShardingRule> { return std::nullopt; },
                  {x}, {4, 8});
  EXPECT_EQ(get_rule(b.g, b.g.nodes[m]).status, RuleResult::kNotExpressible);
  EXPECT_EQ(get_rule(b.g, b.g.nodes[m]).describe(), "has no sharding rule for this instance");
}

TEST(RuleCheck, CatchesMalformedRules) {
  GraphBuilder b;
  const int x = b.input("x", {4, 8}), w = b.input("w", {8, 3});
  const Node& n = b.g.nodes[b.node("MatMul", {x, w}, {4, 3})];
  const auto err = [&](const OpShardingRule& r) -> std::string {
    try {
      check(b.g, n, r);
    } catch (const RuleError& e) {
      return e.what();
    }
    return "";
  };
  const FactorKind kRed = FactorKind::kReduction;
  // The real rule passes.
  EXPECT_EQ(err(make_rule({4, 3, 8}, {kPass, kPass, kRed}, {{{0}, {2}}, {{2}, {1}}}, {{{0}, {1}}})), "");
  EXPECT_EQ(err(make_rule({4, 3, 8}, {kPass, kPass, kRed}, {{{0}, {2}}}, {{{0}, {1}}})),
            "the rule has 1 operands and 1 results, the node 2 inputs and 1 outputs");
  EXPECT_EQ(err(make_rule({4, 3, 8}, {kPass, kPass}, {{{0}, {2}}, {{2}, {1}}}, {{{0}, {1}}})),
            "3 factor sizes but 2 factor kinds");
  EXPECT_EQ(err(make_rule({4, 3, 8}, {kPass, kPass, kRed}, {{{0}, {5}}, {{2}, {1}}}, {{{0}, {1}}})),
            "operand 0 ('x') dim 1: factor id 5 out of range (the rule has 3 factors)");
  EXPECT_EQ(err(make_rule({4, 3, 8}, {kPass, kPass, kRed}, {{{0}, {0}}, {{2}, {1}}}, {{{0}, {1}}})),
            "operand 0 ('x') indexes factor i twice");
  EXPECT_EQ(err(make_rule({4, 3, 7}, {kPass, kPass, kRed}, {{{0}, {2}}, {{2}, {1}}}, {{{0}, {1}}})),
            "operand 0 ('x') dim 1 has size 8 but its factors [k] multiply to 7");
  EXPECT_EQ(err(make_rule({4, 3, 8, 2}, {kPass, kPass, kRed, kPass}, {{{0}, {2}}, {{2}, {1}}}, {{{0}, {1}}})),
            "factor l indexes no dim");
  // Dims without factors are always allowed (kept replicated).
  EXPECT_EQ(err(make_rule({4, 3}, {kPass, kPass}, {{{0}, {}}, {{}, {1}}}, {{{0}, {1}}})), "");
  // A merged dim: 8 = 2 x 4.
  EXPECT_EQ(err(make_rule({4, 3, 2, 4}, {kPass, kPass, kRed, kRed}, {{{0}, {2, 3}}, {{2, 3}, {1}}}, {{{0}, {1}}})), "");
  // A permutation (or windowed, or need-replication) factor may be sized by another dim it indexes, not by none.
  const FactorKind kPerm = FactorKind::kPermutation;
  EXPECT_EQ(err(make_rule({4, 3, 8}, {kPass, kPerm, kRed}, {{{0}, {2}}, {{2}, {1}}}, {{{0}, {1}}})), "");
  EXPECT_EQ(err(make_rule({4, 5, 8}, {kPass, kPerm, kRed}, {{{0}, {2}}, {{2}, {1}}}, {{{0}, {1}}})),
            "factor j (size 5) matches the size of no dim it indexes");
  EXPECT_EQ(err(make_rule({4, 3, 8}, {kPass, FactorKind::kWindowed, kRed}, {{{0}, {2}}, {{2}, {1}}}, {{{0}, {1}}})),
            "windowed factor j does not index operand 0");
}

TEST(RuleMaker, BuildsAndChecksAsItGoes) {
  GraphBuilder b;
  const int x = b.input("x", {4, 8}), w = b.input("w", {8, 3});
  const Node& n = b.g.nodes[b.node("MatMul", {x, w}, {4, 3})];
  {
    RuleMaker m(b.g, n);
    const int fm = m.factor(4, kPass), fn = m.factor(3, kPass), fk = m.factor(8, FactorKind::kReduction);
    m.operand(0, {{fm}, {fk}}).operand(1, {{fk}, {fn}}).result(0, {{fm}, {fn}}).all_linear();
    EXPECT_EQ(m.build().str(), get_rule(b.g, n)->str());
  }
  const auto err = [&](const std::function<void(RuleMaker&)>& f) -> std::string {
    try {
      RuleMaker m(b.g, n);
      f(m);
    } catch (const RuleError& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(err([](RuleMaker& m) { m.operand(2, {}); }), "operand 2 set, but the node has 2 operands");
  EXPECT_EQ(err([](RuleMaker& m) { m.operand(0, {{}, {}}).operand(0, {{}, {}}); }), "operand 0 set twice");
  EXPECT_EQ(err([](RuleMaker& m) {
              m.operand(0, {{m.factor(5, kPass)}, {}});
            }),
            "operand 0 ('x') dim 0 has size 4 but its factors [i] multiply to 5");
  EXPECT_EQ(err([](RuleMaker& m) { m.factorless_operands().build(); }), "result 0 has no dims of factors");
  EXPECT_EQ(err([](RuleMaker& m) { m.in(2); }), "operand 2 is absent");
  EXPECT_EQ(err([](RuleMaker& m) { m.linear(3); }), "operand 3 marked linear, but the node has 2 inputs");
  EXPECT_EQ(one_factor_each({2, -1, 0}), (DimFactors{{2}, {}, {0}}));
}

// What the partitioner's driver needs from an op is a field of its rule (docs/architecture.md, "Adding an op").
TEST(RuleFields, BuildersSetBiasShapeAdditiveAndGroups) {
  GraphBuilder b;
  const int a = b.input("a", {4, 8}), w = b.weight("w", {8, 6}), c = b.weight("c", {6}), s = b.weight("s", {});
  const int x = b.input("x", {2, 4, 9, 9}), k = b.weight("k", {8, 2, 3, 3}), kb = b.weight("kb", {8});
  const int shape = b.ints("shape", {8, 4}), eshape = b.ints("eshape", {3, 4, 8});
  const auto rule = [&](int n) { return *get_rule(b.g, b.g.nodes[n]); };
  const OpShardingRule gemm = rule(b.node("Gemm", {a, w, c}, {4, 6}));
  EXPECT_EQ(gemm.bias_operands, (std::vector<int>{2}));
  EXPECT_TRUE(rule(b.node("Gemm", {a, w, s}, {4, 6})).bias_operands.empty());  // a scalar C has no tile to keep
  const OpShardingRule conv = rule(b.node("Conv", {x, k, kb}, {2, 8, 7, 7}, {{"group", int64_t{2}}}));
  EXPECT_EQ(conv.bias_operands, (std::vector<int>{2}));
  ASSERT_GE(conv.group_factor, 0);
  EXPECT_EQ(conv.factor_sizes[conv.group_factor], 2);
  EXPECT_EQ(conv.operands[0][1].front(), conv.group_factor);  // major in X's channel dim
  EXPECT_EQ(rule(b.node("Conv", {x, b.weight("k1", {8, 4, 3, 3})}, {2, 8, 7, 7})).group_factor, -1);
  EXPECT_EQ(rule(b.node("Reshape", {a, shape}, {8, 4})).shape_operand, 1);
  EXPECT_EQ(rule(b.node("Expand", {a, eshape}, {3, 4, 8})).shape_operand, 1);
  EXPECT_EQ(rule(b.node("Unsqueeze", {a, b.ints("axes", {0})}, {1, 4, 8})).shape_operand, -1);
  EXPECT_TRUE(rule(b.node("Add", {a, a}, {4, 8})).additive);
  EXPECT_TRUE(rule(b.node("Sum", {a, a, a}, {4, 8})).additive);
  EXPECT_TRUE(rule(b.node("Concat", {a, a}, {8, 8}, {{"axis", int64_t{0}}})).additive);
  EXPECT_FALSE(rule(b.node("Mul", {a, a}, {4, 8})).additive);
  EXPECT_FALSE(rule(b.node("MatMul", {a, w}, {4, 6})).additive);
}

TEST(RuleFields, CheckRejectsFieldsThatDoNotFitTheNode) {
  GraphBuilder b;
  const int x = b.input("x", {4, 8}), w = b.input("w", {8, 3});
  const Node& n = b.g.nodes[b.node("MatMul", {x, w}, {4, 3})];
  OpShardingRule r = *get_rule(b.g, n);
  const auto err = [&](const std::function<void(OpShardingRule&)>& edit) -> std::string {
    OpShardingRule e = r;
    edit(e);
    try {
      check(b.g, n, e);
    } catch (const RuleError& ex) {
      return ex.what();
    }
    return "";
  };
  EXPECT_EQ(err([](OpShardingRule& e) { e.bias_operands = {2}; }), "bias operand 2 is not a present input");
  EXPECT_EQ(err([](OpShardingRule& e) { e.shape_operand = 1; }), "shape operand 1 indexes factors");
  EXPECT_EQ(err([](OpShardingRule& e) { e.shape_operand = 5; }), "shape operand 5 is not a present input");
  EXPECT_EQ(err([](OpShardingRule& e) { e.group_factor = 3; }), "group factor 3 out of range (the rule has 3 factors)");
  RuleMaker m(b.g, n);
  EXPECT_THROW(m.bias(2), RuleError);
  EXPECT_THROW(m.group_factor(0), RuleError);  // no factor yet
}

TEST(RuleTable, OneResultPerNodeAndItsGraph) {
  GraphBuilder b;
  const int x = b.input("x", {4});
  b.node("Relu", {x}, {4});
  b.node("NoSuchOp", {x}, {4});
  custom_node(b, "Bad", [](const Graph&, const Node&) -> RuleResult { return make_rule({4}, {kPass}, {{}}, {{{0}}}); },
              {x}, {4});
  const RuleTable t(b.g);
  ASSERT_EQ(t.size(), 3);
  EXPECT_NE(t.rule(0), nullptr);
  EXPECT_EQ(t.rule(1), nullptr);
  EXPECT_EQ(t[1].status, RuleResult::kNoRule);
  EXPECT_EQ(t.builder_errors(), (std::vector<int>{2}));
  EXPECT_THROW(t[3], std::out_of_range);
  GraphBuilder other;
  other.input("y", {4});
  EXPECT_THROW(t.check_graph(other.g), std::invalid_argument);
  Annotations ann;
  ann.mesh = testing::mesh_of({2});
  EXPECT_THROW(propagate(other.g, ann, &t), std::invalid_argument);
}

TEST(RuleTable, BuilderErrorsReachThePartitionersWarnings) {
  GraphBuilder b;
  const int x = b.input("x", {4});
  const int n = custom_node(b, "Broken",
                            [](const Graph&, const Node&) -> RuleResult {
                              return make_rule({4}, {kPass}, {{{0}, {0}}}, {{{0}}});
                            },
                            {x}, {4});
  b.g.outputs.push_back(b.g.nodes[n].outputs[0]);
  Annotations ann;
  ann.mesh = testing::mesh_of({2});
  ann.by_value[x] = Annotation{TensorSharding{{{0}}, {}}, 0, "test"};
  const RuleTable rules(b.g);
  const ShardingPlan plan = propagate(b.g, ann, &rules);
  EXPECT_EQ(plan.nodes_without_rule, (std::vector<int>{n}));
  const SpmdProgram p = partition(b.g, plan, ann.mesh, Target::load("tpu-v3"), &rules);
  ASSERT_EQ(p.warnings.size(), 1u);
  EXPECT_EQ(p.warnings[0],
            "node 'Broken_0' (Broken) has no sharding rule: rule builder error (a bug): operand 0 ('x') has rank 1 "
            "but 2 dims of factors: computed replicated on every device (all-gather of its operands)");
}

}  // namespace
}  // namespace gspmd
