// onnx_frontend internal: the load-time pass that types every value and folds constants, on a core::Graph (no ONNX
// headers).
#pragma once

#include <map>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/ir/ir.h"
#include "onnx_frontend/frontend.h"

namespace gspmd::frontend {

/// Folding refuses to materialise a node whose outputs exceed this many bytes when they are also larger than its
/// inputs (an Expand / ConstantOfShape / Tile of a constant to a big tensor stays a node; weight transposes fold).
inline constexpr int64_t kMaxExpandingFoldBytes = int64_t{64} << 20;

/// Folding refuses to run a Loop or Scan whose body would write more than this many bytes over all its iterations (its
/// nodes' outputs, each counted as at least kFoldNodeBytes for its run's overhead; a Loop without a trip count as
/// kMaxLoopIterations iterations): a 350-byte model whose Loop expands 16 MiB 2^20 times loaded for an hour. It stays
/// a node, run with the model.
inline constexpr int64_t kMaxFoldBodyBytes = int64_t{256} << 20;
inline constexpr int64_t kFoldNodeBytes = 256;

/// Rewrites for inference, before typing: Dropout that is not in training mode (opset < 12, or training_mode absent
/// or a constant false) becomes Identity when its mask is unused; trailing outputs that no node reads and that are not
/// graph outputs are dropped from their node (they need no type). Each rewrite is noted in `report`.
void simplify_for_inference(Graph& g, LoadReport& report);

/// One pass in topological order. Sequence and optional values are lowered first (lower_structured below). For each
/// node:
/// - an If whose condition is a constant: replaced by its taken branch's nodes (renamed "<if>/<node>"), which the
///   pass then visits; noted in report.rewrites;
/// - a control-flow node with typed inputs: each body is typed (and folded) by this pass, its inputs typed as the
///   node binds them (core/ir/control_flow.h);
/// - every input a constant (and the node deterministic, and the outputs within kMaxExpandingFoldBytes): evaluated
///   once by `opts.evaluator`; its outputs become initializers and the node leaves the graph;
/// - Shape / Size of a value with a static shape: folded likewise;
/// - otherwise `opts.shape_function` types its outputs (the executor's own shape functions). Where ONNX inference
///   also typed an output, the two must agree: a disagreement is noted in report.shape_disagreements (and thrown as
///   InputError when opts.strict_shapes); a shape function that fails (the node breaks its op's spec: a Conv's
///   group that does not divide its channels) is an InputError even where ONNX typed the output, since the kernel
///   would fail on it. Ops without a shape function keep ONNX's types.
/// `unknown` holds the names of values without a static type; typed values leave it, and `why` maps each value left
/// unknown to the reason (a data-dependent shape, an untyped input, a shape-function error).
/// The model's graph: its sequence and optional inputs are bound first (flattened into element inputs, typed from
/// opts.structured_inputs), its sequence and optional outputs flattened last; report.inputs / report.outputs receive
/// the signature (frontend.h FlatValue). Throws InputError for an input whose structure is not given or does not
/// match its declared type.
void infer_and_fold(Graph& g, std::unordered_set<std::string>& unknown, std::map<std::string, std::string>& why,
                    const LoadOptions& opts, LoadReport& report);

/// The state of one infer_and_fold pass over one graph (the model's or a body), shared by fold.cc and the lowering of
/// sequences and optionals (sequences.cc).
struct Pass {
  Graph& g;
  std::unordered_set<std::string>& unknown;  // names of values without a static type
  std::map<std::string, std::string>& why;   // why a value stays untyped (the rest of the loader's error)
  const LoadOptions& opts;
  LoadReport& report;
  std::vector<char> dead;  // per node: folded or lowered away (removed at the end of the pass)
  /// The sequence and optional values lowered so far, by value id: their structure and their element tensors' value
  /// ids (docs/sequences.md). A value of kind kSequence / kOptional not listed here is not known yet (and is in
  /// `unknown`).
  std::unordered_map<int, FlatValue> structures;
  /// Loops being unrolled (their carried values are sequences or optionals), by node name: the next iteration and
  /// each scan output's per-iteration values so far.
  struct Unroll {
    int64_t next = 0;
    std::vector<std::vector<int>> scans;
  };
  std::unordered_map<std::string, Unroll> unrolling;
  bool body = false;  // typing a control-flow body (type_bodies), not the model's graph
  /// Typing an If's branch: its data-dependent dims get symbols of the branch (type_data_dependent), which the If's
  /// outputs then take fresh symbols of the model's graph for.
  bool branch = false;
  /// The data-dependent symbols concat_of_many gave, by the sum they stand for (its terms' text): Concats of the
  /// same counts (boxes and their labels) get one symbol.
  std::map<std::string, std::string> sums = {};

  /// Replaces node `ni` by `nodes` (the pass visits them next). The replaced node's outputs that no new node
  /// produces lose their producer.
  void splice(size_t ni, std::vector<Node> nodes);
  /// Nodes of body `b` for splicing into `g`: b's inputs read `bound` (one value id of `g` per body input), b's
  /// constants become constants of `g`, values b computes become fresh values "<prefix>/<name>" (or, for b's outputs
  /// with an entry >= 0 in `outputs`, that value of `g`), typed as in `b` when `keep_types` (one copy: an inlined
  /// If branch), else untyped (copies per iteration or element, whose types may differ). Node names get the prefix.
  /// Returns the nodes; `out_ids` receives the ids in `g` of b's outputs.
  std::vector<Node> clone_body(const Graph& b, const std::string& prefix, const std::vector<int>& bound,
                               const std::vector<int>& outputs, bool keep_types, std::vector<int>& out_ids);
  /// A constant of `g` named after `hint` (made unique).
  int add_constant(const std::string& hint, Tensor t);
  /// Marks value `v` typed (it leaves `unknown` and `why`).
  void typed(int v);
};

/// Why output values stay untyped, as the rest of "value 'v' (output of node 'n' (Op)) ...". `needed_input`: the
/// input whose values are needed (a data-dependent shape), -1 when not one input, -2 when not data-dependent.
std::string untyped_reason(const Graph& g, const Node& n, const std::string& error, int needed_input);

/// How lower_structured handled a node.
enum class Lowered {
  kNo,       // the node touches no sequence or optional: fold and type it as usual
  kDone,     // its outputs are structures or constants now: the node is dead
  kSpliced,  // it was replaced by other nodes: visit node `ni` again
  kFailed,   // its outputs stay untyped; `why` says why
};

/// Lowers node `ni` of the pass when it reads or makes a sequence or optional (docs/sequences.md): Sequence* ops,
/// SplitToSequence, ConcatFromSequence, Optional*, an Identity of one, SequenceMap (unrolled per element), a Loop
/// whose carried values or captures are sequences or optionals (unrolled while its trip count and condition are
/// constants). Sequences are static lists of tensor values: a position, a split or a condition must be constant.
Lowered lower_structured(Pass& p, size_t ni);

}  // namespace gspmd::frontend
