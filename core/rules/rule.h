// core/rules: factor-based sharding rules (Shardy's OpShardingRule, openxla/shardy
// shardy/dialect/sdy/transforms/propagation/op_sharding_rule_registry.cc; ARCHITECTURE.md "Factor rules").
//
// A rule names an op's factors (independent index spaces), their sizes and kinds, and for every operand/result dim
// the factors it indexes, major to minor (a reshape's merged dim indexes several factors). Propagation, reshard
// insertion and cost all read the rule; no op-type switch elsewhere.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/ir/ir.h"
#include "core/sharding/sharding.h"

namespace gspmd {

enum class FactorKind {
  kPassThrough,      // appears in results: splitting it splits the computation (batch, M, N of a matmul)
  kReduction,        // appears only in operands and is summed/maxed over: split => result unreduced
  kNeedReplication,  // must not be split (e.g. Softmax axis in the basic rule, Slice on a cut dim)
  kPermutation,      // operand and result index it differently (Concat/Pad/Slice dims): split => data movement
};

/// dims[d] = factor ids indexed by dim d, major to minor; empty = the dim has no factor (size-1 broadcast,
/// or a shape operand such as Reshape's `shape` input: such operands are kept replicated).
using DimFactors = std::vector<std::vector<int>>;

/// The sharding rule of one node.
struct OpShardingRule {
  std::vector<int64_t> factor_sizes;
  std::vector<FactorKind> factor_kinds;
  std::vector<DimFactors> operands;  // one per node input (absent optional inputs get an empty DimFactors)
  std::vector<DimFactors> results;   // one per node output
  /// How partial results combine when a reduction factor is split (sum for MatMul/ReduceSum, max for ReduceMax).
  ReductionKind reduction = ReductionKind::kSum;
  /// Ops linear in their operands (Add/Sub/Transpose/Reshape/MatMul on one side...) may keep unreduced values
  /// unreduced; see core/partition. linear_operands[i] = true if the result is linear in operand i.
  std::vector<bool> linear_operands;

  int num_factors() const { return static_cast<int>(factor_sizes.size()); }
  /// Human-readable form for explain and tests: "([i,j],[j,k])->([i,k]) {i=8, j=16, k=32} reduction={j}".
  std::string str() const;
};

/// Builds a node's rule from the graph (shapes, attributes, constant operands). Returns nullopt when the op has no
/// rule or the instance cannot be expressed (the partitioner then falls back to replication, loudly).
using RuleBuilder = std::function<std::optional<OpShardingRule>(const Graph&, const Node&)>;

/// The rule of `node`, or nullopt. Looks up the registry by (domain, op_type).
std::optional<OpShardingRule> get_rule(const Graph& g, const Node& node);
/// True if (domain, op_type) has a registered rule builder.
bool has_rule(const std::string& domain, const std::string& op_type);
/// Registers (or replaces) a builder; used by the per-family .cc files' static tables.
void register_rule(const std::string& domain, const std::string& op_type, RuleBuilder b);

/// Factor-level sharding: the mesh axes assigned to each factor of a rule (major to minor).
using FactorSharding = std::vector<std::vector<int>>;

/// Projects a tensor sharding onto the factors of dims `df` (Shardy's "project"): for a dim indexing several
/// factors, its axes go to the major factor while their product divides that factor's size, then to the next.
/// Returns false (and leaves `out` unchanged for the failing dim) when the split cannot be expressed on factors.
bool project_to_factors(const TensorSharding& s, const DimFactors& df, const OpShardingRule& rule,
                        const DeviceMesh& mesh, FactorSharding& out);
/// The tensor sharding implied by factor shardings for dims `df` (axes of the dim's factors, concatenated).
TensorSharding sharding_from_factors(const FactorSharding& fs, const DimFactors& df);

}  // namespace gspmd
