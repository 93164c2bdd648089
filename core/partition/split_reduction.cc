// The partitioner's split-reduction handlers: Softmax/LogSoftmax and LayerNormalization whose operand is split on
// the dims they reduce over. Instead of gathering those dims, each device reduces its shard and an all-reduce
// combines the partial statistics (docs/architecture.md, "Factor rules"), so the result keeps the operand's sharding.
// ONNX Softmax (opset 13+) and LayerNormalization (opset 17) specs.
#include <algorithm>
#include <limits>
#include <map>

#include <fmt/format.h>

#include "core/partition/partitioner.h"

namespace gspmd::partition_internal {

bool Partitioner::lower_split_softmax(int n) { return lower_softmax(n, /*log=*/false); }
bool Partitioner::lower_split_log_softmax(int n) { return lower_softmax(n, /*log=*/true); }

// The two passes of lower_split_softmax (log = false) and lower_split_log_softmax (log = true).
bool Partitioner::lower_softmax(int n, bool log) {
  const Node& node = g_.nodes[n];
  if (g_.opset < 13) return false;
  const int gx = node.inputs[0];
  const Value& xv = g_.values[gx];
  const int rank = static_cast<int>(xv.shape.size());
  int64_t axis = node.i("axis", -1);
  if (axis < 0) axis += rank;
  TensorSharding s = current(gx);
  if (axis < 0 || axis >= rank || s.dims[axis].empty() || xv.dtype != DType::kFloat32) return false;
  s.unreduced.clear();
  s.reduction = ReductionKind::kSum;
  const std::vector<int> A = s.dims[axis];
  const std::string& on = g_.values[node.outputs[0]].name;
  int x = get(gx, s, node.name, fmt::format("{} ({}) needs its operand reduced", node.name, node.op_type));
  const Shape ls = P().values[x].shape;
  Shape red = ls;
  red[axis] = 1;
  const bool uneven = may_pad(gx, static_cast<size_t>(axis), A);
  auto mask = [&](int v, float value) {
    if (!uneven) return v;
    const int masked =
        emit(gspmd_node(MaskPadAttrs{.axis = axis, .mesh_axes = A, .full_size = xv.shape[axis], .value = value}), {v},
             on + "/masked", DType::kFloat32, ls);
    symbolic_attr("full_size", global_dim(gx, static_cast<size_t>(axis)));
    return masked;
  };
  // ReduceSum reads its axes from an input since opset 13 (axes_input); ReduceMax from an attribute until opset 18.
  auto reduce = [&](const std::string& op, bool axes_input, int v, ReductionKind reduction) {
    const std::string kind(reduction_name(reduction));
    std::vector<int> ins{v};
    std::map<std::string, AttrValue> attrs{{"keepdims", int64_t{1}}};
    if (axes_input)
      ins.push_back(int64_const("axes", {axis}));
    else
      attrs["axes"] = std::vector<int64_t>{axis};
    int local = emit(op, ins, on + "/" + kind, DType::kFloat32, red, attrs);
    return collective({.kind = Collective::kAllReduce, .mesh_axes = A, .reduction = reduction}, local, red, node.name,
                      gx,
                      fmt::format("{} ({}) over dim {} split over {}: global {}", node.name, node.op_type, axis,
                                  axes_str(mesh_, A), kind));
  };
  int m = reduce("ReduceMax", false, mask(x, -std::numeric_limits<float>::infinity()), ReductionKind::kMax);
  int shifted = emit("Sub", {x, m}, on + "/shifted", DType::kFloat32, ls);
  int e = emit("Exp", {shifted}, on + "/exp", DType::kFloat32, ls);
  int sum = reduce("ReduceSum", true, mask(e, 0.f), ReductionKind::kSum);
  int y =
      log ? emit("Sub", {shifted, emit("Log", {sum}, on + "/log_sum", DType::kFloat32, red)}, on, DType::kFloat32, ls)
          : emit("Div", {e, sum}, on, DType::kFloat32, ls);
  bind(node.outputs[0], s, y);
  return true;
}

/// LayerNormalization (opset 17) whose normalized dims [axis, rank) the operand splits (any of them, over any
/// axes): local sum -> all-reduce -> mean; local sum of squared deviations -> all-reduce -> variance; then
/// normalise, scale and shift with Scale/B sliced like the normalized dims. Padding of uneven split dims is masked
/// to 0 before both sums. The Mean and InvStdDev outputs (shape [..., 1, ..., 1]) keep the leading dims' splits.
bool Partitioner::lower_split_layer_norm(int n) {
  const Node& node = g_.nodes[n];
  if (node.outputs.size() > 3) return false;
  const int gx = node.inputs[0];
  const Value& xv = g_.values[gx];
  const int rank = static_cast<int>(xv.shape.size());
  int64_t axis = node.i("axis", -1);
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank || xv.dtype != DType::kFloat32) return false;
  TensorSharding s = current(gx);
  std::vector<int64_t> norm_dims;
  std::vector<int> A;  // mesh axes splitting the normalized dims
  DimExpr count = 1;   // the elements normalized together
  for (int64_t d = axis; d < rank; ++d) {
    norm_dims.push_back(d);
    A.insert(A.end(), s.dims[d].begin(), s.dims[d].end());
    count = count * global_dim(gx, static_cast<size_t>(d));
  }
  if (A.empty()) return false;
  const Shape norm_shape(xv.shape.begin() + axis, xv.shape.end());
  for (size_t i = 1; i < node.inputs.size(); ++i)
    if (node.inputs[i] >= 0 && g_.values[node.inputs[i]].shape != norm_shape) return false;
  for (size_t i = 1; i < node.outputs.size(); ++i)
    if (node.outputs[i] >= 0 && g_.values[node.outputs[i]].dtype != DType::kFloat32) return false;
  std::sort(A.begin(), A.end());
  s.unreduced.clear();
  s.reduction = ReductionKind::kSum;
  const std::string& on = g_.values[node.outputs[0]].name;
  const std::string why =
      fmt::format("{} (LayerNormalization) normalizes dims {}.. split over {}", node.name, axis, axes_str(mesh_, A));
  int x = get(gx, s, node.name, why);
  const Shape ls = P().values[x].shape;
  Shape red = ls;
  for (int64_t d : norm_dims) red[d] = 1;
  auto scalar = [&](const std::string& hint, float v) { return new_constant(hint, Tensor::from_floats({}, {v})); };
  // the count: a literal, or over the dim symbols computed from the run's sizes
  const int divisor = count.is_constant() ? scalar("count", static_cast<float>(*count.constant()))
                                          : runtime_size(on + "/count", count, DType::kFloat32);
  auto global_mean = [&](int v, const std::string& what) {
    for (int64_t d : norm_dims) {
      const std::vector<int>& ax = s.dims[d];
      if (ax.empty() || !may_pad(gx, static_cast<size_t>(d), ax)) continue;
      v = emit(gspmd_node(MaskPadAttrs{.axis = d, .mesh_axes = ax, .full_size = xv.shape[d], .value = 0.f}), {v},
               on + "/masked", DType::kFloat32, ls);
      symbolic_attr("full_size", global_dim(gx, static_cast<size_t>(d)));
    }
    int local = emit("ReduceSum", {v, int64_const("axes", norm_dims)}, on + "/" + what, DType::kFloat32, red,
                     {{"keepdims", int64_t{1}}});
    int sum = collective({.kind = Collective::kAllReduce, .mesh_axes = A, .reduction = ReductionKind::kSum}, local, red,
                         node.name, gx, why + ": global " + what);
    return emit("Div", {sum, divisor}, on + "/" + what, DType::kFloat32, red);
  };
  int mean = global_mean(x, "mean");
  int d = emit("Sub", {x, mean}, on + "/centered", DType::kFloat32, ls);
  int var = global_mean(emit("Mul", {d, d}, on + "/squared", DType::kFloat32, ls), "variance");
  int sd = emit(
      "Sqrt", {emit("Add", {var, scalar("epsilon", node.f("epsilon", 1e-5f))}, on + "/var_eps", DType::kFloat32, red)},
      on + "/std", DType::kFloat32, red);
  int y = emit("Div", {d, sd}, on + "/normalized", DType::kFloat32, ls);
  TensorSharding param;
  param.dims.assign(s.dims.begin() + axis, s.dims.end());
  if (node.inputs.size() > 1 && node.inputs[1] >= 0)
    y = emit("Mul", {y, get(node.inputs[1], param, node.name, why)}, on + "/scaled", DType::kFloat32, ls);
  if (node.inputs.size() > 2 && node.inputs[2] >= 0)
    y = emit("Add", {y, get(node.inputs[2], param, node.name, why)}, on, DType::kFloat32, ls);
  bind(node.outputs[0], s, y);
  TensorSharding stat = s;  // [..., 1, ..., 1]: the normalized dims are whole
  for (int64_t nd : norm_dims) stat.dims[nd].clear();
  if (node.outputs.size() > 1 && node.outputs[1] >= 0) bind(node.outputs[1], stat, mean);
  if (node.outputs.size() > 2 && node.outputs[2] >= 0)
    bind(node.outputs[2], stat, emit("Reciprocal", {sd}, g_.values[node.outputs[2]].name, DType::kFloat32, red));
  return true;
}

}  // namespace gspmd::partition_internal
