// core/pipeline: layer blocks vectorized over a leading stage dim, GSPMD §3.3's form of a pipeline stage: S
// consecutive layers run as one layer whose weights are stacked along a new leading dim, which the pipeline axis
// shards so that each device computes its own stage. Built on find_layer_blocks (blocks.h).
#pragma once

#include <cstdint>

#include "core/ir/ir.h"
#include "core/pipeline/blocks.h"

namespace gspmd {

/// Blocks [first, first + stages) of `b` (found in `g`) as one graph that runs them side by side: input "state"
/// ([stages] + the stream's shape: stage s holds block first + s's input), output "state_out" (stage s: its output),
/// and each of block 0's weights stacked over the blocks, an initializer [stages] + the weight's shape (with data
/// when every block's weight has data) named after block 0's weight with its layer number as '#'. Side inputs and
/// constants are copied once and read by every stage. Each node of block 0 becomes the same op on the stage-stacked
/// values (its batching rule: axes shifted past the stage dim, stacked operands of lower rank given unit dims so that
/// broadcasting still lines up, LayerNormalization's stacked scale and bias applied after it). `shapes` types the
/// nodes. Throws InputError ("--pipeline: node 'n' (Op): ...") for an op without a batching rule, and
/// std::out_of_range for blocks outside `b`.
Graph stack_blocks(const Graph& g, const LayerBlocks& b, size_t first, int64_t stages, const ShapeFunction& shapes);

}  // namespace gspmd
