// Typing one node with the injected shape functions (core/ir/typing.h).
#include "core/ir/typing.h"

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

}  // namespace gspmd
