// core/partition: the partitioner's private header, shared by its driver and its handlers. Not for use outside
// core/partition (the public entry point is partition() in spmd.h).
//
// Files (docs/architecture.md, "Where knowledge lives"):
// - partition.cc: the driver: values, resharding (the planner's steps as collectives) and the generic lowering of
//   one node from its factor rule (choose factor shardings, decide what stays unreduced, reshard operands, emit the
//   local op and its results);
// - constraints.cc: annotations as constraints (an annotated value is resharded to its annotation after its
//   producer; a whole value annotated partial becomes partial locally);
// - handlers.cc: the op handler registry (the only place that names op types) and the small local rewrites;
// - windowed.cc: Conv/pool dims split over devices: halo exchange (GSPMD §3.4);
// - split_reduction.cc: Softmax/LogSoftmax and LayerNormalization over split dims (two passes of all-reduce);
// - gather.cc: the masked (vocab-parallel) lookup of a Gather whose table is split on the looked-up axis;
// - pipeline_shift.cc: the pipeline's stage shift (a collective-permute between stages).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/partition/reshard.h"
#include "core/partition/spmd.h"
#include "core/rules/factor_projection.h"
#include "core/rules/rule.h"

namespace gspmd::partition_internal {

class Partitioner;

/// How a windowed op (factors of kind kWindowed) reads its window: ONNX Conv, MaxPool, AveragePool, LpPool specs.
struct WindowSemantics {
  float pad_value = 0.f;             // what positions outside the input read as: 0, or -inf for MaxPool
  bool average = false;              // divides by a count of positions (AveragePool): exact only for some paddings
  bool kernel_from_weights = false;  // kernel_shape may be omitted: the kernel is operand 1's dims 2.. (Conv)
};

/// What the partitioner does differently for one op type. The driver's generic path lowers every op from its rule;
/// a handler adds to it. XLA's SPMD partitioner has one Handle* per opcode in the same spirit.
struct OpHandler {
  /// Lowers the whole node before the generic path (Softmax or LayerNormalization whose operand is split on the
  /// reduced dims). Returns false when the instance is not its case; the generic path then lowers it.
  bool (Partitioner::*lower)(int n) = nullptr;
  /// Lowers the node instead of the generic path once a reduction factor is split (Gather: the masked lookup).
  void (Partitioner::*lower_split_reduction)(int n, const OpShardingRule& rule, const FactorSharding& F) = nullptr;
  /// Adjusts the local node the generic path built (Reshape's allowzero, Squeeze's implicit axes); `global` is the
  /// node of the unpartitioned graph.
  void (Partitioner::*rewrite_local)(Node& local, const Node& global) = nullptr;
  WindowSemantics window;
};

/// The handler of `node`'s (domain, op type), or nullptr when the generic path does everything. O(1).
const OpHandler* find_handler(const Node& node);

/// ceil(a / b) for a >= 0, b > 0.
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Whether `v` holds `x`.
inline bool contains(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

/// The identity of reduction `k` (0 for sum, 1 for prod, -inf for max, +inf for min): what padding and non-first
/// tiles hold so that they do not change the reduced value.
float reduction_identity(ReductionKind k);

/// "{x, y}": the names of mesh axes `axes`, for collective reasons and warnings.
std::string axes_str(const DeviceMesh& mesh, const std::vector<int>& axes);

/// The SPMD partitioner (GSPMD §3.4) of one graph: lowers every node to local computation on shards, in node order,
/// inserting reshards where an operand's sharding differs from what the node's factor shardings need. One instance
/// per partition() call; run() once.
class Partitioner {
 public:
  /// `g`, `plan` (one sharding per value of g), `mesh` and `rules` (built for g) must outlive the partitioner;
  /// `target` prices the reshard plans.
  Partitioner(const Graph& g, const ShardingPlan& plan, const DeviceMesh& mesh, const Target& target,
              const RuleTable& rules, const MemoryRoles* roles = nullptr);

  /// Lowers the whole graph. Throws UnsupportedError for an op that can be neither partitioned nor replicated.
  SpmdProgram run();

  // ---- shared with the handlers: values and emission (partition.cc) -------------------------------------------

  Graph& P() { return out_.program; }
  /// A new program value named after `hint` (made unique), of type t[s].
  int new_value(const std::string& hint, DType t, const Shape& s) { return P().add_value_unique(hint, t, s); }
  /// A new program initializer holding `t`.
  int new_constant(const std::string& hint, Tensor t);
  /// A new int64 initializer holding `v` (a scalar if `scalar`).
  int int64_const(const std::string& hint, const std::vector<int64_t>& v, bool scalar = false);
  /// A new int64 [n] initializer holding `e` at the hints, with `e` as its elements over the dim symbols
  /// (docs/shapes.md).
  int int64_const(const std::string& hint, const std::vector<DimExpr>& e, const std::vector<int64_t>& v);
  /// A float tensor [1] of dtype `dt` holding `e` (a size over the dim symbols), computed on the device from the
  /// run's sizes: an int64 constant over the symbols, cast (docs/shapes.md). What a mean over a split symbolic dim
  /// divides by.
  int runtime_size(const std::string& hint, const DimExpr& e, DType dt);
  /// An int64 scalar holding `e` (a size over the dim symbols): a literal when `e` is constant, else the [1] constant
  /// over the symbols reshaped to a scalar, computed on the device from the run's sizes (a vocab-parallel lookup's
  /// vocabulary and shard size over a symbolic table).
  int int64_scalar(const std::string& hint, const DimExpr& e);
  /// `v` (a [1] value) reshaped to a scalar.
  int to_scalar(int v);
  /// Global value gv's dim d over the dim symbols (its size when static).
  DimExpr global_dim(int gv, size_t d) const;
  /// True when global value gv's dim d split over `axes` may leave padding to mask: it does not divide, at the hints
  /// or (over the dim symbols) at some size (`past + seq` over 2, even at the hints 23 + 19).
  bool may_pad(int gv, size_t d, const std::vector<int>& axes) const {
    return !exact_div(global_dim(gv, d), mesh_.axes_size(axes));
  }
  /// global_dim(gv, d) split over `axes`: its local (padded) size ceil(dim / shards).
  DimExpr local_dim(int gv, size_t d, const std::vector<int>& axes) const;
  /// Records attribute `attr` of the node emitted last as the expression `e` (when `e` reads a symbol, or always
  /// with `even_constant`: a size on a symbolic dim that happens to be constant, such as a halo window's step 0).
  void symbolic_attr(const std::string& attr, const DimExpr& e, bool even_constant = false);
  /// Records that program value `lv` holds global value `gv` with sharding `s` (the first one recorded is gv's
  /// primary representation and its final sharding).
  void bind(int gv, const TensorSharding& s, int lv);
  /// Records another program copy `lv` of `gv` (sharding `s`; a reshard or another param slice) and its origin.
  void add_copy(int gv, const TensorSharding& s, int lv);
  /// The sharding global value gv has now (its primary representation), or the plan's for unmaterialised
  /// initializers (never unreduced).
  TensorSharding current(int gv) const;
  /// current(gv)'s dims without a copy (its unreduced axes are those of the available local value, if any).
  const TensorSharding& current_dims(int gv) const {
    return avail_[gv].empty() ? plan_.shardings[gv] : avail_[gv].front().sharding;
  }
  /// Appends `n` (op type, domain and attributes set) reading `inputs`, with one new output value of type t[s];
  /// returns the output's id.
  int emit(Node n, std::vector<int> inputs, const std::string& out_hint, DType t, Shape s);
  /// Appends a standard ONNX node (domain "") `op` with `attrs`.
  int emit(const std::string& op, std::vector<int> inputs, const std::string& out_hint, DType t, Shape s,
           std::map<std::string, AttrValue> attrs = {});
  /// Appends the collective `a` on local value `x` (its result has `out_shape`) and records it, for global value
  /// `gv` needed by `for_node`, in SpmdProgram::collectives (bytes: the larger of operand and result).
  int collective(const CollectiveAttrs& a, int x, Shape out_shape, const std::string& for_node, int gv,
                 const std::string& reason);
  /// Local id of global value gv with sharding `want`, inserting collectives and local slices as needed (memoised
  /// per sharding). Initializers are sliced when loaded, so any sharding of one is free. Throws InternalError
  /// when gv is not computed yet or `want` is unreduced over axes gv is not. `why` gives the collectives' reason; it
  /// is called only when one is needed.
  int get(int gv, TensorSharding want, const std::string& for_node, const std::function<std::string()>& why);
  int get(int gv, TensorSharding want, const std::string& for_node, const std::string& why) {
    return get(gv, std::move(want), for_node, [&] { return why; });
  }

  // ---- handlers (windowed.cc, split_reduction.cc, gather.cc, handlers.cc) -------------------------------------

  /// Softmax / LogSoftmax (opset >= 13) whose operand is split on the softmax axis: local max -> all-reduce max ->
  /// exp -> local sum -> all-reduce sum -> divide, the padding of uneven shards masked to -inf before the max and
  /// to 0 before the sum. The result keeps the operand's sharding. False when the node is not such a case.
  bool lower_split_softmax(int n);
  bool lower_split_log_softmax(int n);
  /// LayerNormalization (opset 17) whose operand splits any of the normalized dims [axis, rank): two all-reduced
  /// sums (mean, then variance), Scale/B sliced like the normalized dims. False when the node is not such a case.
  bool lower_split_layer_norm(int n);
  /// Gather whose table is split on the looked-up axis by F (a split reduction factor in its rule): the masked
  /// lookup, result unreduced (sum) over the table's split axes.
  void lower_gather(int n, const OpShardingRule& rule, const FactorSharding& F);
  /// The pipeline's stage shift (gspmd.pipeline Shift, core/ir/shift_op.h): with its stage dim split one row per
  /// device, a collective-permute over the stage axes plus the enter row's input chosen by the partition id, and
  /// `out` a partial sum over those axes (the exit stage's row, zeros elsewhere); otherwise gathered and local.
  /// Always lowers the node (true).
  bool lower_pipeline_shift(int n);
  /// Shape and Size (handlers.cc): the global shape is static, so the result is a constant on every device; the
  /// operand, however it is split, is not moved.
  bool lower_shape_of(int n);
  /// Reshape: the local shape operand is literal, so `allowzero` is set when it holds a 0 (opset 14+).
  void rewrite_reshape(Node& local, const Node& global);
  /// Squeeze without axes squeezes every size-1 dim; a shard may have more of them, so the global ones are named.
  void rewrite_squeeze(Node& local, const Node& global);

  /// How one split spatial dim of a Conv/pool is computed. Device t (tile over `axes`, n tiles) holds input rows
  /// [t*h_loc, (t+1)*h_loc) and computes output rows [t*o_loc, (t+1)*o_loc), which read input rows
  /// [t*o_loc*stride - pad_begin, ... + window). It receives `left` rows from tile t-1 and `right` rows from tile
  /// t+1 (collective-permute), then takes its window at offset base + t*step of [left | local | right].
  /// Over a symbolic dim (docs/shapes.md) the sizes are those at the hints, `symbolic` is set, and full_e, step_e,
  /// window_e and mask_step_e are the expressions of full, step, window and o_loc * stride; left and right are the
  /// widest halos at any size (they are static), and base = left - pad_begin.
  struct Window {
    int dim = 0;  // tensor dim of X and Y
    std::vector<int> axes;
    int64_t full = 0, n = 1, h_loc = 0, o_loc = 0, stride = 1, pad_begin = 0, window = 0;
    int64_t left = 0, right = 0, base = 0, step = 0;
    float pad_value = 0.f;  // what rows outside [0, full) read as (WindowSemantics::pad_value)
    bool symbolic = false;
    DimExpr full_e, step_e, window_e, mask_step_e;
  };
  /// Plans the halo exchange of every split windowed factor of F; a split it cannot do exactly (halo wider than a
  /// neighbour's shard, an average whose count would change) is dropped from F with a warning, so that dim is
  /// gathered instead. Over a symbolic dim the plan holds at every size from the smallest whose shards are as wide
  /// as the halos; a larger smallest size is a guard of the program (SpmdProgram::dim_guards). Throws
  /// UnsupportedError for SAME padding that changes with a symbolic dim's size.
  std::vector<Window> plan_windows(const Node& node, const OpShardingRule& rule, FactorSharding& F);
  /// Builds each device's input window of local value `x` (operand 0 of `node`): halos from both neighbours, the
  /// window at the device's offset, rows outside the global input masked with the op's padding value.
  int exchange_halos(const Node& node, int x, const std::vector<Window>& windows);
  /// The local op reads exactly its window: no padding on the split dims, the global pads (auto_pad resolved) on
  /// the others.
  void set_window_attrs(Node& local, const Node& global, const std::vector<Window>& windows) const;

 private:
  struct Local {
    TensorSharding sharding;
    int id;
    int fence = -1;  // a gathered copy made in phase `fence` of a step: reused in that phase only (spmd.h)
  };
  /// The node's present operands (their current shardings) and results (their planned shardings) projected onto
  /// the factors of its rule; `operands` and `results` hold their tensor indices in the projection.
  struct NodeProjection {
    FactorProjection proj;
    std::vector<int> operands, results;
  };
  /// What the generic path decided about a node's partial (unreduced) operands.
  struct Partials {
    std::vector<int> operands;        // operand indices that are unreduced now
    std::vector<int> keep_unreduced;  // mesh axes they stay unreduced over through the op (empty: reduce them)
  };

  // partition.cc
  /// True when global value gv carries a constraint: an annotation that is not wholly open (Origin::constrained).
  bool constrained(int gv) const;
  /// The sharding a constrained value must have: its planned sharding (the annotation, extended on open dims).
  TensorSharding constraint(int gv) const;
  /// After node n is lowered: every constrained result whose computed sharding differs from its constraint is
  /// resharded to it, and that representation becomes the value's primary one (its consumers reshard from it).
  /// Throws InputError "SOURCE: 'v' cannot have its annotated sharding [...]: why" when no reshard reaches it (a
  /// partial annotation on a value the program computes whole).
  void constrain_results(int n);
  int reshard(int gv, int x, const TensorSharding& cur, const TensorSharding& want, const std::string& for_node,
              const std::string& why);
  void lower(int n);
  void lower_replicated(int n, const std::string& why);
  void sanitize(const OpShardingRule& rule, FactorSharding& F) const;
  NodeProjection project(const Node& node, const OpShardingRule& rule) const;
  FactorSharding choose_factors(const OpShardingRule& rule, const NodeProjection& p, bool results_first,
                                std::vector<char>& used);
  /// choose_strategy's case for an additive op on partial sums: F without their unreduced axes (partition.cc).
  void sum_partials_first(const Node& node, const OpShardingRule& rule, FactorSharding& F,
                          std::vector<char>& used) const;
  FactorSharding choose_strategy(const Node& node, const OpShardingRule& rule, std::vector<char>& used);
  double reshard_seconds(const Node& node, const OpShardingRule& rule, const FactorSharding& F);
  Partials decide_partials(const Node& node, const OpShardingRule& rule, const FactorSharding& F,
                           std::vector<char>& used) const;
  /// Whether every consumer of global value `gv` is linear in it (its rule's linear_operands at each position it
  /// reads gv; read once unless the op is additive): only then does deferring gv's reduction through a consumer
  /// not cost a second reduction for another consumer that needs gv whole.
  bool linear_in_all_consumers(int gv) const;
  std::vector<int> plan_bias_operands(const Node& node, const OpShardingRule& rule, FactorSharding& F) const;
  std::vector<int> reshard_operands(const Node& node, const OpShardingRule& rule, const FactorSharding& F,
                                    const Partials& partials, const std::vector<int>& bias_ops);
  int keep_on_first_tile(int x, const OpShardingRule& rule, const FactorSharding& F, const std::string& name);
  /// Keeps local value `x` on the devices at tile 0 of mesh `axes` and sets it to `identity` on the others (MaskPad
  /// along dim 0; a scalar is masked as a [1]): a whole value becomes a partial one over `axes`.
  int first_tile_only(int x, const std::vector<int>& axes, float identity, const std::string& name);
  /// Makes global value gv (local `x`, sharding `cur`) unreduced over `extra` as well, with want.reduction: first
  /// gathers `extra` out of the dims they split, then first_tile_only for sum/prod (a max/min of copies is the
  /// value). `partial` receives the resulting sharding. Throws InternalError when `cur` is unreduced with another
  /// reduction kind.
  int make_partial(int gv, int x, const TensorSharding& cur, const TensorSharding& want, const std::vector<int>& extra,
                   const std::string& for_node, const std::string& why, TensorSharding& partial);
  void emit_local(const Node& node, const OpShardingRule& rule, const FactorSharding& F, const Partials& partials,
                  std::vector<int> inputs, const std::vector<Window>& windows, const OpHandler* handler);

  // split_reduction.cc
  bool lower_softmax(int n, bool log);

  // windowed.cc
  /// Kernel extent, stride and paddings of one spatial dim, auto_pad resolved against the global output size (at
  /// the program's sizes, or at `x` input and `y` output rows).
  struct SpatialParams {
    int64_t extent, stride, pad_begin, pad_end;
    bool operator==(const SpatialParams&) const = default;
  };
  SpatialParams spatial_params(const Node& node, int sd) const;
  SpatialParams spatial_params(const Node& node, int sd, int64_t x, int64_t y) const;
  /// Output rows of spatial dim sd for `x` input rows (ONNX Conv / pool output-size formulas, floor mode: the
  /// symbolic rules refuse ceil_mode over a symbolic dim).
  int64_t spatial_output(const Node& node, int sd, int64_t x) const;
  /// The window of dim d split over `axes` at `full` input and `out` output rows; `problem` says why an average
  /// cannot be split exactly (empty when it can; the halos' width is the caller's to check).
  Window window_at(const Node& node, size_t d, const std::vector<int>& axes, int64_t full, int64_t out,
                   std::string& problem) const;
  /// Makes `w` (planned at the hints) hold at every size of its symbolic dim: the widest halos over one period of
  /// sizes, the expressions, and the guard. Returns the problem that makes the dim gathered instead ("" if none).
  std::string symbolic_window(const Node& node, Window& w);
  /// Throws UnsupportedError: node's SAME padding of symbolic dim d of its input changes with the dim's size.
  [[noreturn]] void throw_padding_varies(const Node& node, size_t d) const;

  const Graph& g_;
  const ShardingPlan& plan_;
  const DeviceMesh& mesh_;
  const RuleTable& rules_;
  SpmdProgram out_;
  ReshardPlanner planner_;
  std::vector<std::vector<Local>> avail_;    // per global value: its local representations, first = primary
  std::vector<std::vector<int>> consumers_;  // per global value: the nodes reading it (Graph::consumers)
  std::vector<char> is_output_;              // per global value: a graph output
  const MemoryRoles* roles_;                 // a training step's roles (partition() in spmd.h), or null
  int phase_ = -1;  // a training step's phase of node_ (MemoryRoles::phase; the last at the outputs), -1: none
  int node_ = -1;   // the global node being lowered (-1: inputs, nodes.size(): outputs)
  int counter_ = 0;
};

}  // namespace gspmd::partition_internal
