// core/pipeline: the repeated layer blocks of a forward graph, which pipeline parallelism (issue 18,
// docs/training.md's successor docs/pipeline.md) stacks into stages: GSPMD §3.3 runs the stages as one vectorized
// layer whose weights are stacked along a leading stage dim sharded over the pipeline axis. This part finds the
// blocks and proves them alike; the stacking and the schedule build on it.
//
// A block is what one layer index owns: the weights whose names carry that index in the same place (h.3.attn.q.weight
// -> layer 3, tied to h.0.attn.q.weight by layer_key, core/ir/name_pattern.h) and the nodes between two cut values of
// the residual stream (values after which nothing else computed from the layer weights is still read; the same sweep as
// --remat full's segments). Nodes before the first block (the embedding) are the prefix, after the last (the final
// norm, the head) the suffix. Every block must be the same computation as block 0 on its own weights: the same ops
// and attributes in the same order, wired the same way, reading the same side inputs (a mask) and equal constants.
#pragma once

#include <string>
#include <vector>

#include "core/ir/ir.h"
#include "core/ir/name_pattern.h"

namespace gspmd {

/// The layer blocks of a graph (find_layer_blocks). Node and value ids are the graph's.
struct LayerBlocks {
  struct Block {
    int64_t layer = 0;         // the layer index in its weights' names (the first of its layers)
    size_t layers = 1;         // how many consecutive layers it holds (the period of a model whose layers alternate)
    std::vector<int> nodes;    // its nodes, in graph order (same count and order as block 0's)
    int input = -1;            // the residual-stream value entering it (the previous block's output)
    int output = -1;           // the value leaving it
    std::vector<int> weights;  // its layer weights, in the order block 0 first reads them
  };
  std::vector<int> prefix;       // nodes before the first block
  std::vector<Block> blocks;     // in layer order; at least two
  std::vector<int> suffix;       // nodes after the last block
  std::vector<int> side_inputs;  // values every block reads that neither a block nor the stream computes (masks,
                                 // shared constants), in the order block 0 first reads them
};

/// Finds the repeated layer blocks of `g`. `layers` (optional, `--layers REGEX`): a regex over initializer names
/// whose first capture group is the layer index (e.g. `^h\.(\d+)\.`); by default a layer weight is a float
/// initializer of more than one element whose name has a whole numeric component, tied to its copies by
/// layer_key (core/ir/name_pattern.h), when its key is on at least two of the layer indices that most keys share.
/// O(nodes + edges), plus the consumers of the values shared across blocks (times the periods tried, when layers
/// alternate). When layer 1 differs from layer 0 but the layers' weight keys repeat with a period P (GShard's dense and
/// MoE layers alternate: P = 2), each block holds P consecutive layers, if that makes the blocks alike. `variables`:
/// float graph inputs are weights too (a step that takes its parameters as arguments; --auto's layer costing), not only
/// initializers. Throws InputError (one line, naming the nodes or values) when the graph has fewer than two layer
/// blocks, when a segment of it reads the weights of two layers, when a block has more than one stream input or output,
/// or when a block differs from block 0.
LayerBlocks find_layer_blocks(const Graph& g, const std::string& layers = "", bool variables = false);

/// True when `g`'s layer weights are graph inputs, not initializers (a step that takes its parameters as arguments,
/// as the GSPMD paper's models do): no initializer is a layer weight (by `layers`, or by name as find_layer_blocks
/// finds them) and some graph input is. --pipeline then finds the blocks with `variables` and stacks the inputs.
bool layer_weights_are_inputs(const Graph& g, const std::string& layers = "");

/// `g` cut down to its first `k` layer blocks of `b` (1 <= k <= b.blocks.size(); b = find_layer_blocks(g, ...)): the
/// prefix, blocks 0 .. k-1 and the suffix, which reads block k-1's output where it read the last block's. The later
/// blocks' nodes, and the values and graph inputs only they read, are dropped; every kept value keeps its name. The
/// model --auto costs a repeated layer on (docs/auto.md, "Scale"). Throws std::invalid_argument for k out of range.
Graph keep_first_layers(const Graph& g, const LayerBlocks& b, size_t k);

}  // namespace gspmd
