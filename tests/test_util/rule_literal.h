// A sharding rule written out by hand (no graph needed), for the core tests of rules and factor projections.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/rules/rule.h"

namespace gspmd::testing {

/// The rule with these factor sizes and kinds and these operand / result dims (factor ids per dim, major to minor).
inline OpShardingRule make_rule(std::vector<int64_t> sizes, std::vector<FactorKind> kinds,
                                std::vector<DimFactors> operands, std::vector<DimFactors> results) {
  OpShardingRule r;
  r.factor_sizes = std::move(sizes);
  r.factor_kinds = std::move(kinds);
  r.operands = std::move(operands);
  r.results = std::move(results);
  return r;
}

}  // namespace gspmd::testing
