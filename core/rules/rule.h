// core/rules: factor-based sharding rules (Shardy's OpShardingRule, openxla/shardy
// shardy/dialect/sdy/transforms/propagation/op_sharding_rule_registry.cc; docs/architecture.md, "Factor rules").
//
// A rule names an op's factors (independent index spaces), their sizes and kinds, and for every operand/result dim
// the factors it indexes, major to minor (a reshape's merged dim indexes several factors). Propagation, reshard
// insertion and cost all read the rule; no op-type switch elsewhere.
#pragma once

#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "core/ir/ir.h"
#include "core/sharding/sharding.h"

namespace gspmd {

enum class FactorKind {
  kPassThrough,      // appears in results: splitting it splits the computation (batch, M, N of a matmul)
  kReduction,        // appears only in operands and is summed/maxed over: split => result unreduced
  kNeedReplication,  // must not be split (e.g. Softmax axis in the basic rule, Slice on a cut dim)
  kPermutation,      // operand and result index it differently (Concat/Pad/Slice dims): split => data movement
  kWindowed,         // a spatial dim of Conv/pooling: output element i reads a window of input elements around
                     // i*stride; split => halo exchange (core/partition's windowed handler, GSPMD §3.4 "halo").
                     // Its size is the input's dim size (the output dim differs); propagation treats it as
                     // pass-through between the windowed input (operand 0) and the result.
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
  /// The result is a MEAN over the reduction factors (ReduceMean, GlobalAveragePool), not a sum; `reduction` is
  /// kSum. When a reduction factor is split, the local op computes a mean over its shard: local_sum / local_count,
  /// where local_count is the product of the *padded* local sizes (ceil(dim/n)) of the split reduced dims (the
  /// padding is masked to 0 before the op, so it adds nothing to the sum). The partitioner must turn that into a
  /// partial SUM of the global mean by multiplying the local result by local_count / global_count (global_count =
  /// product of the global sizes of those dims; unsplit reduced dims cancel out), then mark it unreduced (sum) as
  /// for any split reduction factor. Equivalently: run a local ReduceSum and divide by global_count.
  bool mean = false;
  /// The result is jointly linear in all its operands (Add, Sub, Sum, Concat): a partial (unreduced) value passes
  /// through only when every tensor operand is partial over the same axes. An op that is only linear_operands in
  /// several operands (Mul) passes one partial operand.
  bool additive = false;
  /// Operands added to the result that do not index the reduction factors (Gemm's C, Conv's B). With a split
  /// reduction factor every device computes a partial sum, so the partitioner keeps such an operand on the first
  /// tile of the reduction axes and zero elsewhere; any other operand that does not index a split reduction factor
  /// makes the partitioner leave that factor unsplit. Only meaningful with `reduction` kSum.
  std::vector<int> bias_operands;
  /// The operand that holds the result's shape (Reshape's and Expand's `shape`, Resize's `sizes`), or -1. It has no
  /// factors; the partitioner gives the local op the local result shape in its place.
  int shape_operand = -1;
  /// Grouped convolution: the factor of the groups (the major factor of X's channel dim, size `group`), or -1.
  /// Splitting it over n devices divides the local op's `group` attribute by n (the partitioner leaves it unsplit
  /// when n does not divide `group`).
  int group_factor = -1;

  int num_factors() const { return static_cast<int>(factor_sizes.size()); }
  /// Human-readable form for explain and tests: "([i,j],[j,k])->([i,k]) {i=8, j=16, k=32} reduction={j}".
  /// Windowed factors are listed as " windowed={..}" and a mean as " mean".
  std::string str() const;
};

/// A builder's answer for an instance its op's rule cannot express ("not expressible, because `reason`"): e.g. a
/// MatMul whose contracting dims differ, an Einsum with a diagonal. The partitioner replicates the node and says why.
struct NotExpressible {
  std::string reason;
};

/// The outcome of building one node's rule (get_rule, RuleTable). Reads like std::optional<OpShardingRule>
/// (has_value, bool, *, ->), so code that only needs the rule ignores why there is none. Rule builders return it
/// too: an OpShardingRule, a NotExpressible, or std::nullopt (not expressible, no reason given) convert to it.
struct RuleResult {
  enum Status {
    kOk,              // `rule` is the node's rule and passed check()
    kNoRule,          // no builder is registered for the node's (domain, op_type)
    kNotExpressible,  // the builder said the instance cannot be expressed with factors; `reason` says why
    kBuilderError,    // the builder threw, or built a rule that fails check(): a bug; `reason` is the error
  };
  std::optional<OpShardingRule> rule;
  Status status = kNoRule;
  std::string reason;

  RuleResult() = default;
  RuleResult(OpShardingRule r) : rule(std::move(r)), status(kOk) {}
  RuleResult(NotExpressible n) : status(kNotExpressible), reason(std::move(n.reason)) {}
  RuleResult(std::nullopt_t) : status(kNotExpressible) {}
  RuleResult(std::optional<OpShardingRule> r) : rule(std::move(r)), status(rule ? kOk : kNotExpressible) {}
  static RuleResult builder_error(std::string what) {
    RuleResult r;
    r.status = kBuilderError;
    r.reason = std::move(what);
    return r;
  }

  bool has_value() const { return rule.has_value(); }
  explicit operator bool() const { return rule.has_value(); }
  const OpShardingRule& operator*() const { return *rule; }
  const OpShardingRule* operator->() const { return &*rule; }
  /// Why the node is computed replicated, worded to follow "node 'n' (Op) ": "has no sharding rule" (kNoRule),
  /// "has no sharding rule for this instance: <reason>" (kNotExpressible), "has no sharding rule: rule builder error
  /// (a bug): <reason>" (kBuilderError); "" for kOk.
  std::string describe() const;
};

/// Builds a node's rule from the graph (shapes, attributes, constant operands): an OpShardingRule, or
/// NotExpressible{reason} when the instance cannot be expressed (the partitioner then falls back to replication,
/// loudly). Throwing, or returning a rule that fails check(), is a bug in the builder (RuleResult::kBuilderError).
/// core/rules/rule_maker.h builds rules with these checks as it goes.
using RuleBuilder = std::function<RuleResult(const Graph&, const Node&)>;

/// A rule that does not fit its node: thrown by check() and RuleMaker (a bug in the builder, not in the model).
struct RuleError : std::logic_error {
  using std::logic_error::logic_error;
};

/// Checks `rule` against `node` of `g` (Shardy's OpShardingRuleAttr verifier, in our terms). Throws RuleError
/// naming the first problem:
/// - factor_sizes and factor_kinds have the same length; every factor size is >= 0 and indexes some dim;
/// - one DimFactors per node input and per output; an absent optional (-1) has none ({}), a present value one
///   entry per dim of its shape;
/// - factor ids are valid and a tensor indexes a factor at most once;
/// - a dim's factor product equals the dim's size. Exceptions: a dim with no factor (a size-1 broadcast dim, a
///   shape operand or any operand kept replicated); a dim with one factor that is kWindowed (sized by the windowed
///   input), kPermutation (sized by one side: Concat's result, Slice's input) or kNeedReplication (never split, so
///   its size on the other side is irrelevant: ConvTranspose's spatial dims), whose size equals the size of some
///   dim the factor indexes;
/// - a kWindowed factor indexes operand 0 (propagation and the halo exchange read it there);
/// - linear_operands has at most one entry per input.
void check(const Graph& g, const Node& node, const OpShardingRule& rule);

/// The rule of `node`: looks up the registry by (domain, op_type), runs the builder and check(), and fills
/// linear_operands up to the node's inputs. Never throws: a builder error is returned as kBuilderError.
RuleResult get_rule(const Graph& g, const Node& node);

/// The rule of every node of one graph, built once (get_rule per node) and shared by propagation, partition, the
/// reshape cuts and the auto search, which would otherwise rebuild them per call. Holds no reference to the graph;
/// it is valid for the graph it was built from while that graph's nodes and shapes do not change.
class RuleTable {
 public:
  RuleTable() = default;
  /// get_rule of every node of `g`, in node order. A rule is built once per distinct node instance: nodes with the
  /// same op, attributes, operand and result types and constant operand values (the repeated layers of a model)
  /// share the first one's rule, since a builder reads nothing else. O(nodes) plus one build per distinct instance.
  explicit RuleTable(const Graph& g);
  /// Node n's result. Throws std::out_of_range for a node id outside the table.
  const RuleResult& operator[](int n) const { return results_.at(index_.at(static_cast<size_t>(n))); }
  /// Node n's rule, or nullptr when it has none.
  const OpShardingRule* rule(int n) const { return (*this)[n] ? &*(*this)[n] : nullptr; }
  int size() const { return static_cast<int>(index_.size()); }
  /// Node ids whose builder failed (kBuilderError), in node order: empty unless a rule builder has a bug.
  std::vector<int> builder_errors() const;
  /// Throws std::invalid_argument unless the table has one entry per node of `g` (it was built for another graph).
  void check_graph(const Graph& g) const;

 private:
  std::vector<RuleResult> results_;  // the distinct results
  std::vector<size_t> index_;        // per node: its result in results_
};

/// `rules` when given (after check_graph), else a table built into `storage` for `g`: how the entry points that take
/// an optional `const RuleTable*` obtain one.
const RuleTable& rules_for(const Graph& g, const RuleTable* rules, std::optional<RuleTable>& storage);

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
/// Like the above, but keeps only what a dim can really express: in a dim indexing several factors, a factor's axes
/// are used only if their product divides the factor size, and a minor factor only if every factor before it is
/// fully split (otherwise the dim gets the axes of the factors up to the first partially split one).
TensorSharding sharding_from_factors(const FactorSharding& fs, const DimFactors& df, const OpShardingRule& rule,
                                     const DeviceMesh& mesh);

class RuleMaker;  // core/rules/rule_maker.h

/// Helpers shared by the per-family rule files (core/rules/*.cc). Not for use outside core/rules.
namespace rules_internal {
/// Adds a builtin builder for (domain, op_type) (domain "" = ai.onnx) without triggering builtin registration (no
/// recursion).
void add_builtin(const std::string& op_type, RuleBuilder b, const std::string& domain = "");
void register_elementwise_rules();
void register_matmul_rules();
void register_shape_rules();
void register_reduce_norm_rules();
void register_gather_rules();
void register_conv_pool_rules();  // conv_pool.cc: Conv, ConvTranspose, pools, BatchNorm/LRN/InstanceNorm/MVN, D2S/S2D
void register_einsum_rules();     // einsum.cc
void register_index_rules();      // index_ops.cc: Pad, Tile, Resize, Range, TopK, CumSum, GatherElements/ND,
                                  // ScatterElements/ND, OneHot, NonZero, Compress
void register_misc_rules();       // misc_ops.cc: Trilu, Det, ReverseSequence, RNN/GRU/LSTM, (De)QuantizeLinear,
                                  // NegativeLogLikelihoodLoss, SoftmaxCrossEntropyLoss, GridSample, RoiAlign,
                                  // TfIdfVectorizer
void register_pipeline_rules();   // pipeline.cc: gspmd.pipeline Shift (core/ir/shift_op.h)
/// check()'s rules for one tensor: rule.operands[i] (or results[i], if `result`) against node input (output) i:
/// presence, rank, factor ids, a factor at most once, dim sizes. Throws RuleError.
void check_tensor_dims(const Graph& g, const Node& node, const OpShardingRule& rule, bool result, size_t i);
/// Initializer data of input i of `node`, or nullptr (absent input, not an initializer, or shapes-only load).
const Tensor* constant_input(const Graph& g, const Node& node, int i);
/// Normalises a possibly negative axis for rank r; nullopt when out of range.
std::optional<int> norm_axis(int64_t axis, int rank);
/// Maps `shape` right-aligned onto the factors of `out_factors` (numpy broadcasting): dim i of `shape` gets the
/// factor of the aligned output dim unless it is a size-1 dim broadcast to a larger one (then no factor).
DimFactors broadcast_dims(const Shape& shape, const Shape& out_shape, const std::vector<int>& out_factors);
/// Factor decomposition of a reshape in_shape -> out_shape (gcd walk; size-1 dims factorless; whatever cannot be
/// matched contiguously gets kNeedReplication factors). Adds the factors to `m` and returns {in dims, out dims}.
std::pair<DimFactors, DimFactors> reshape_factors(RuleMaker& m, const Shape& in_shape, const Shape& out_shape);
/// Shape of value `v` of `g`.
inline const Shape& shape_of(const Graph& g, int v) { return g.values.at(v).shape; }
/// Whether input i (or output i, if `output`) of `n` exists and is not an omitted optional (-1).
inline bool present(const Node& n, size_t i, bool output = false) {
  const auto& l = output ? n.outputs : n.inputs;
  return i < l.size() && l[i] >= 0;
}
}  // namespace rules_internal

}  // namespace gspmd
