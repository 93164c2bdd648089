// core/pipeline: layer blocks vectorized over a leading stage dim, GSPMD §3.3's form of a pipeline stage: S
// consecutive layers run as one layer whose weights are stacked along a new leading dim, which the pipeline axis
// shards so that each device computes its own stage. Built on find_layer_blocks (blocks.h).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/ir/ir.h"
#include "core/pipeline/blocks.h"

namespace gspmd {

/// Emits block 0 of `b` (found in `g`) vectorized over a leading stage dim into another graph `out`, once per call of
/// apply: GSPMD §3.3's stage computation, S layers side by side. Each node of block 0 becomes the same op on the
/// stage-stacked values (its batching rule: axes shifted past the stage dim, stacked operands of lower rank given
/// unit dims so that broadcasting still lines up, LayerNormalization's stacked scale and bias applied after it).
/// Nodes that read only shared values (side inputs, constants) are emitted once and reused by every application.
/// With microbatches (`microbatch` < `batch`), values computed from the stream or a microbatched side input carry the
/// microbatch in their batch dim (dim 0 of the stream; a Transpose moves it, as torch's sequence-first attention
/// does, and a Reshape may merge it with others: Bound::batch_inner): a Reshape's target is the model's output shape
/// with the dim holding the batch scaled to the microbatch, and an op that splits the batch dim, contracts,
/// normalizes, reduces, slices or concatenates over it is refused. The layer's output must lead with the batch
/// again. Batching rules: elementwise ops, MatMul, Gemm (as a batched MatMul), Transpose, Reshape, Slice, ReduceMean /
/// Sum / Max / Min, Softmax, LogSoftmax, Concat, LayerNormalization.
/// Throws InputError ("--pipeline: node 'n' (Op): ...") for an op without a batching rule.
class BlockStacker {
 public:
  /// A value of `out` that a value of `g` maps to: whether it carries the stage dim, and its batch dim (in g's rank;
  /// -1: not computed from the microbatch).
  struct Bound {
    int id = -1;
    bool stacked = false;
    int batch = -1;
    int64_t batch_inner = 1;  // the batch dim is outer x batch x batch_inner elements (a reshape merged it)
  };
  /// `g`, `b`, `out` and `shapes` must outlive the stacker. `batch` 0 = no microbatching.
  BlockStacker(const Graph& g, const LayerBlocks& b, Graph& out, int64_t stages, const ShapeFunction& shapes,
               int64_t batch = 0, int64_t microbatch = 0);
  /// Value `v` of g (a side input, a constant) is `id` of out, read unstacked by every stage.
  void share(int v, int id);
  /// Emits block 0 once, reading `bound` (block 0's input and weights, and any other value of g, to stage-stacked
  /// values of out); node names get `tag` appended. Returns the id of the block's output in out. `instances` (if
  /// given) receives, per value block 0 computes, its copy in out: stage-stacked (one dim more) when it depends on a
  /// stacked value, else the one copy every stage reads (a value computed from constants).
  int apply(const std::map<int, Bound>& bound, const std::string& tag, std::map<int, int>* instances = nullptr);

 private:
  friend class Batching;  // the batching rules (batching.h) emit and bind through the stacker
  Bound lookup(int v);
  std::vector<int> emit(const Node& like, const std::string& op, const std::vector<int>& inputs,
                        std::map<std::string, AttrValue> attrs, size_t outputs, const std::string& name);
  int constant(const std::string& name, Tensor t);
  int widen(const Node& like, int id, size_t rank, const std::string& tag);
  void stack(const Node& n, const std::string& tag);
  void bind(const Node& n, const std::vector<int>& ids, bool stacked, int batch, int64_t inner);

  const Graph& g_;
  const LayerBlocks& b_;
  Graph& out_;
  const int64_t stages_, batch_, microbatch_;
  const ShapeFunction& shapes_;
  std::map<int, Bound> shared_;     // g's values read by every application
  std::map<int, Bound> local_;      // this application's
  std::map<int, int> unit_scales_;  // LayerNormalization Scale value of g -> its unit-scale constant
};

/// The blocks `blocks` of `b` (found in `g`; stage s runs blocks[s]) as one graph that runs them side by side: input
/// "state" ([stages] + the stream's shape, stages = blocks.size(): stage s holds its block's input), then the computed
/// side inputs; output "state_out" (stage s: its block's output); each of block 0's weights stacked over the blocks
/// (stack_weights), named after block 0's weight with its layer number as '#'. `shapes` types the nodes. Throws
/// InputError as BlockStacker, std::out_of_range for no block or blocks outside `b`.
Graph stack_blocks(const Graph& g, const LayerBlocks& b, const std::vector<size_t>& blocks,
                   const ShapeFunction& shapes);

/// Adds to `out` an initializer `name` (made unique) of shape `lead` + the members' shape that holds the weights
/// `members` of g in row-major order over `lead` (with data when every member has data), or, when the members are
/// graph inputs (a step's parameters), a graph input of `out` that the caller feeds stacked; returns its id. Throws
/// std::invalid_argument when the member count is not the product of `lead`.
int stack_weights(const Graph& g, Graph& out, const std::vector<int>& members, const Shape& lead,
                  const std::string& name);

}  // namespace gspmd
