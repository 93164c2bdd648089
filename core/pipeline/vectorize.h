// core/pipeline: layer blocks vectorized over a leading stage dim, GSPMD §3.3's form of a pipeline stage: S
// consecutive layers run as one layer whose weights are stacked along a new leading dim, which the pipeline axis
// shards so that each device computes its own stage. Built on find_layer_blocks (blocks.h).
#pragma once

#include <cstdint>

#include "core/ir/ir.h"
#include "core/pipeline/blocks.h"

namespace gspmd {

/// The blocks `blocks` of `b` (found in `g`; stage s runs blocks[s]) as one graph that runs them side by side: input
/// "state" ([stages] + the stream's shape, stages = blocks.size(): stage s holds its block's input), output
/// "state_out" (stage s: its block's output), and each of block 0's weights stacked over the blocks, an initializer
/// [stages] + the weight's shape (with data when every block's weight has data) named after block 0's weight with
/// its layer number as '#'. A circular schedule stacks consecutive blocks (stage s runs layer k·S + s in round k),
/// GPipe strided ones (stage s runs layers s·L/S .. (s+1)·L/S - 1, slot j of them together). Side inputs and
/// constants are copied once and read by every stage. Each node of block 0 becomes the same op on the stage-stacked
/// values (its batching rule: axes shifted past the stage dim, stacked operands of lower rank given unit dims so that
/// broadcasting still lines up, LayerNormalization's stacked scale and bias applied after it). `shapes` types the
/// nodes. Throws InputError ("--pipeline: node 'n' (Op): ...") for an op without a batching rule, and
/// std::out_of_range for no block or blocks outside `b`.
Graph stack_blocks(const Graph& g, const LayerBlocks& b, const std::vector<size_t>& blocks,
                   const ShapeFunction& shapes);

}  // namespace gspmd
