// core/ir: typing one node with the injected shape functions (ShapeFunction, ir.h), for the builders that add nodes
// to a graph (the training step, the stacked pipeline stages).
#pragma once

#include <vector>

#include "core/ir/ir.h"

namespace gspmd {

/// The output types of node `n`, whose inputs are values of `g` (-1: absent), by `shapes`: the inputs' types, and the
/// data of those that are initializers with data (constant operands such as Reshape's shape). Throws what `shapes`
/// throws when it rejects the node.
std::vector<TensorType> node_types(const Graph& g, const Node& n, const ShapeFunction& shapes);

}  // namespace gspmd
