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

/// Appends `n` (name, op, inputs and attributes set; no outputs) to `g` with one output per `outputs` entry, named
/// after it (made unique) and typed by node_types; returns the output ids. Throws what node_types throws.
std::vector<int> add_typed_node(Graph& g, Node n, const std::vector<std::string>& outputs, const ShapeFunction& shapes);

/// Adds an initializer named after `name` (made unique) holding `t`; returns its id.
int add_constant(Graph& g, const std::string& name, Tensor t);

}  // namespace gspmd
