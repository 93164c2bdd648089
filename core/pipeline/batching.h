// core/pipeline (private to the module): the batching rules by which BlockStacker (vectorize.h) stacks one node of a
// layer block over the leading stage dim, one rule per op, as JAX's vmap has a batching rule per primitive. A rule
// rewrites the node's operands and attributes for the stage-stacked values (axes shifted past the stage dim, lower-rank
// operands widened, constants rebuilt) and names the result's batch dim; with microbatches it refuses what mixes the
// batch dim with others (vectorize.h's BlockStacker gives the contract).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/pipeline/vectorize.h"

namespace gspmd {

/// One node of block 0 being stacked by its op's batching rule. The rule sets `ids` (the operands in `out`), `attrs`
/// and `bd` / `inner` (the result's batch dim), or emits and binds the outputs itself (bind).
class Batching {
 public:
  using Bound = BlockStacker::Bound;
  /// A batching rule: a member that rewrites the node (see the class comment).
  using Rule = void (Batching::*)();
  /// The batching rule of ONNX op `op` at `opset`, or nullptr when it has none.
  static Rule find(const std::string& op, int64_t opset);

  /// Node `n` of `s`'s graph, its operands bound to `in` (at least one stacked); `tag` is appended to emitted names.
  Batching(BlockStacker& s, const Node& n, const std::string& tag, std::vector<Bound> in);
  /// Runs `rule`, then emits the rewritten node and binds its outputs (stage-stacked) unless the rule bound them.
  /// Throws InputError ("--pipeline: node 'n' (Op): ...") when the rule refuses the node.
  void run(Rule rule);

 private:
  void broadcasting(bool matmul);
  void elementwise() { broadcasting(false); }
  void matmul() { broadcasting(true); }
  void transpose();
  void reshape();
  void slice();
  void reduce(bool axes_input);
  void reduce_sum() { reduce(g_.opset >= 13); }    // axes an input from opset 13
  void reduce_other() { reduce(g_.opset >= 18); }  // ReduceMean / Max / Min: from opset 18
  void gemm();
  void softmax();
  void concat();
  void layer_norm();
  void split();
  void unsqueeze();
  void arg_reduce();
  void cumsum();
  void one_hot();
  void einsum();

  /// "--pipeline: node 'n' (Op): why".
  InputError fail(const std::string& why) const;
  /// Throws fail(what + ...) when microbatching: an op may not mix the batch dim with others.
  void refuse(const std::string& what) const;
  /// The rank of operand `m` in g (without the stage dim).
  int64_t orig_rank(const Bound& m) const;
  /// Operand i's constant values (Slice's starts, Reduce's axes), or nullptr.
  const Tensor* constant_of(size_t i) const;
  static int64_t norm(int64_t axis, int64_t rank) { return axis < 0 ? axis + rank : axis; }
  static int64_t shifted(int64_t axis) { return axis < 0 ? axis : axis + 1; }
  std::vector<int> emit(const std::string& op, const std::vector<int>& inputs, std::map<std::string, AttrValue> attrs,
                        size_t outputs, const std::string& name);
  int constant(const std::string& name, Tensor t);
  int widen(int id, size_t rank);
  /// Binds the node's outputs to `ids`, stage-stacked, with batch dim bd and inner.
  void bind(const std::vector<int>& ids);

  BlockStacker& s_;
  const Graph& g_;
  Graph& out_;
  const int64_t stages_, batch_, microbatch_;
  const Node& n;
  const std::string& op;  // n.op_type
  const std::string& tag_;
  const std::vector<Bound> in;
  std::vector<int> ids;
  std::map<std::string, AttrValue> attrs;
  const std::string name;  // n's name with the tag
  const bool micro;        // microbatching: the batch dim is the microbatch's
  int bd = -1;             // the result's batch dim
  int64_t inner = 1;       // and how many elements of that dim one batch index spans (Bound::batch_inner)
  bool bound_ = false;
};

}  // namespace gspmd
