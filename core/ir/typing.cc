// Typing one node with the injected shape functions (core/ir/typing.h).
#include "core/ir/typing.h"

#include <fmt/format.h>

namespace gspmd {

std::vector<TensorType> node_types(const Graph& g, const Node& n, const ShapeFunction& shapes) {
  std::vector<const TensorType*> types;
  std::vector<TensorType> storage(n.inputs.size());
  std::vector<const Tensor*> values;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const int v = n.inputs[k];
    if (v < 0) {
      types.push_back(nullptr);
      values.push_back(nullptr);
      continue;
    }
    const Value& val = g.values.at(static_cast<size_t>(v));
    storage[k] = {val.dtype, val.shape};
    types.push_back(&storage[k]);
    values.push_back(val.is_initializer ? val.data.get() : nullptr);
  }
  return shapes(n, types, values, g.opset);
}

std::vector<int> add_typed_node(Graph& g, Node n, const std::vector<std::string>& outputs,
                                const ShapeFunction& shapes) {
  const std::vector<TensorType> t = node_types(g, n, shapes);
  if (t.size() < outputs.size())
    throw InternalError(
        fmt::format("node '{}' ({}): {} outputs typed, {} wanted", n.name, n.op_type, t.size(), outputs.size()));
  for (size_t k = 0; k < outputs.size(); ++k)
    n.outputs.push_back(g.add_value_unique(outputs[k], t[k].dtype, t[k].shape));
  std::vector<int> ids = n.outputs;
  g.add_node(std::move(n));
  return ids;
}

int add_constant(Graph& g, const std::string& name, Tensor t) {
  const int id = g.add_value_unique(name, t.dtype, t.shape);
  g.values[static_cast<size_t>(id)].is_initializer = true;
  g.values[static_cast<size_t>(id)].data = std::make_shared<const Tensor>(std::move(t));
  return id;
}

}  // namespace gspmd
