// core/propagation: infers a TensorSharding for every value from a few annotations (GSPMD paper §3.5; Shardy's
// layered basic -> aggressive -> op-priority -> user-priority propagation).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/ir/ir.h"
#include "core/sharding/sharding.h"

namespace gspmd {

class RuleTable;  // core/rules/rule.h

/// A user annotation on one value (from the sharding file): a sharding constraint, as JAX's
/// with_sharding_constraint and Shardy's sharding_constraint are. The value has exactly this sharding in the
/// program (the partitioner reshards where a consumer needs another; docs/partitioning.md, "Annotations are
/// constraints"), except where the annotation is open (Shardy's open dims): an open dim may receive more axes from
/// propagation, after its annotated ones; a wholly open annotation is only a starting point that propagation and
/// the partitioner may change.
struct Annotation {
  TensorSharding sharding;
  int priority = 0;                  // lower runs earlier (Shardy p0, p1, ...)
  std::string source;                // e.g. "gpt.sharding.json: tensors.\"h.0.mlp.fc_in.weight\"" for explain
  bool open = false;                 // the whole annotation is open: a hint, not a constraint
  std::vector<char> open_dims = {};  // per tensor dim, 1 = open (empty: every dim closed)
  /// True when tensor dim d may receive more axes from propagation.
  bool dim_open(int d) const { return open || (d < static_cast<int>(open_dims.size()) && open_dims[d]); }
};

/// Mesh + annotations keyed by value id.
struct Annotations {
  DeviceMesh mesh;
  std::map<int, Annotation> by_value;
};

/// Where a value's sharding came from, for explain (docs/architecture.md, invariant 5).
struct Origin {
  enum Kind { kDefault, kAnnotation, kPropagated } kind = kDefault;  // default = replicated, nothing reached it
  int node = -1;        // kPropagated: the node whose rule carried the sharding
  int from_value = -1;  // kPropagated: the value it came from (walk from_value's origin for the chain)
  bool forward = true;  // kPropagated: operand->result (true) or result->operand
  std::string source;   // kAnnotation: Annotation::source
  bool open = false;    // kAnnotation: Annotation::open (a hint, not a constraint)
  /// An annotation that is not wholly open: the value must have its planned sharding in the program.
  bool constrained() const { return kind == kAnnotation && !open; }
};

/// Result of propagation: one sharding and origin per value id of the graph.
struct ShardingPlan {
  std::vector<TensorSharding> shardings;
  std::vector<Origin> origins;
  std::vector<int> nodes_without_rule;  // node ids that had no rule (did not propagate), for explain
  /// Per value, per mesh axis: the annotated value whose annotation gave the value that axis (-1: the value does
  /// not use the axis, or no annotation gave it), as Shardy's origin tracking does per axis (explain).
  std::vector<std::vector<int>> axis_origins;
};

/// "data from annotation x (FILE: tensors."x"), model from annotation w (FILE: rules[0] ("weight$"))": which annotation
/// gave value v each mesh axis it uses; "" when none did.
std::string axis_origins_str(const Graph& g, const ShardingPlan& plan, const std::map<int, Annotation>& annotations,
                             const DeviceMesh& mesh, int v);

/// Propagates annotations to every value, to a fixpoint.
/// - Annotated values keep exactly their sharding (user wins).
/// - For each node with a rule, operand and result shardings are projected to factors, merged (an axis is
///   assigned to at most one factor; conflicts go to the factor of the larger tensor, ties to the earlier one:
///   FactorProjection::merge_largest_first, core/rules/factor_projection.h),
///   and projected back onto tensors that do not yet use those axes. Reduction factors never make a result tiled;
///   values are never made unreduced by propagation (the partitioner decides that).
/// - Order: annotation priorities ascending (Shardy user priorities); within a priority, op priorities (Shardy's
///   op-priority strategy), each stage run to its fixpoint and any change restarting at stage 0:
///     0. pass-through ops (all factors pass-through/permutation: elementwise, shape, data movement);
///     1. the pass-through and windowed factors of every op (windowed: between operand 0 and the result);
///     2. everything, including reduction factors (operand to operand) and
///   broadcasts forward last: before stage 2, a broadcast operand of a pass-through op (its factors all in the
///   result, fewer elements: a bias, Expand's input) receives shardings but does not give any. Forward and backward.
/// - Nodes without a rule do not propagate (their values stay as they are) and are listed for explain.
/// - `rules`: the graph's rule table (RuleTable(g)); built here when null. Throws std::invalid_argument when it was
///   built for another graph.
/// Cost: O(rounds * edges * mesh rank), independent of the device count.
ShardingPlan propagate(const Graph& g, const Annotations& ann, const RuleTable* rules = nullptr);

/// Sub-axes that reshapes need (Shardy's "x:(1)2"): for every Reshape / Flatten dim that merges or splits factors
/// f1 x f2 x ... (major to minor; the op's factor rule), and every user mesh axis of size n dividing the dim, the
/// cut points f1, f1*f2, ... that lie strictly between 1 and n and divide n. With them, [8] split over x=4 reshaped
/// to [2,4] stays split, as [x:(1)2, x:(2)2]. Returns cuts per user axis (DeviceMesh::refine); all empty when no
/// reshape needs one. `rules`: the graph's rule table, or null (the reshapes' rules are then built here).
/// O(nodes * rank * mesh rank).
std::vector<std::vector<int64_t>> reshape_cuts(const Graph& g, const DeviceMesh& mesh,
                                               const RuleTable* rules = nullptr);

/// `ann` on its mesh refined by reshape_cuts (every annotation remapped; unchanged when nothing needs cutting).
Annotations refine_for_reshapes(const Graph& g, const Annotations& ann, const RuleTable* rules = nullptr);

/// The chain of (node, value) hops from an annotation to value `v`, for explain: "annotation x -> MatMul_3 -> v".
std::string origin_chain(const Graph& g, const ShardingPlan& plan, int v);

}  // namespace gspmd
