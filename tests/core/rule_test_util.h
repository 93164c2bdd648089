// Shared by the factor-rule tests: a GraphBuilder that also returns a node's OpShardingRule.
#pragma once

#include <stdexcept>

#include "core/rules/rule.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd::testing {

/// GraphBuilder plus the rule of node n (std::runtime_error "no rule for NAME" when it has none).
struct RuleBuilder : GraphBuilder {
  OpShardingRule rule(int n) {
    auto r = get_rule(g, g.nodes.at(n));
    if (!r) throw std::runtime_error("no rule for " + g.nodes.at(n).name);
    return *r;
  }
  bool has(int n) { return get_rule(g, g.nodes.at(n)).has_value(); }
};

}  // namespace gspmd::testing
