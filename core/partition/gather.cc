// The partitioner's gather handler: a Gather whose table is split on the looked-up axis (Megatron's vocab-parallel
// embedding). Each device looks up only the rows it holds and zeroes the rest, so the result is a partial sum over
// the table's split axes, reduced where a consumer needs it. ONNX Gather spec (negative ids count from the end).
#include <algorithm>

#include <fmt/format.h>

#include "core/partition/partitioner.h"

namespace gspmd::partition_internal {

/// Vocab-parallel lookup (Megatron): each device looks up only the rows it holds, zeroes the rest; the
/// result is unreduced (sum) over the table's split axes.
void Partitioner::lower_gather(int n, const OpShardingRule& rule, const FactorSharding& F) {
  const Node& node = g_.nodes[n];
  const int gtable = node.inputs[0], gids = node.inputs[1];
  const Value& tv = g_.values[gtable];
  const int64_t axis_attr = node.i("axis", 0);
  const int rank = static_cast<int>(tv.shape.size());
  const int axis = static_cast<int>(axis_attr < 0 ? axis_attr + rank : axis_attr);
  int vf = -1;
  for (int f : rule.operands[0][axis]) vf = f;
  const std::vector<int>& A = F[vf];
  std::string why = fmt::format("{} (Gather) looks up a table split over {}", node.name, axes_str(mesh_, A));
  int table = get(gtable, sharding_from_factors(F, rule.operands[0]), node.name, why);
  int ids = get(gids, sharding_from_factors(F, rule.operands[1]), node.name, why);
  const std::string& on = g_.values[node.outputs[0]].name;
  const Shape ids_shape = P().values[ids].shape;
  if (P().values[ids].dtype != DType::kInt64)
    ids = emit("Cast", {ids}, on + "/ids", DType::kInt64, ids_shape, {{"to", int64_t(DType::kInt64)}});
  // Over a symbolic vocabulary (docs/shapes.md) the sizes below are expressions computed on the device from the run's
  // sizes: the vocabulary, the shard size (ceil(vocab / k)), each device's offset and the range check's table.
  const DimExpr vocab = global_dim(gtable, static_cast<size_t>(axis));
  const DimExpr shard = local_dim(gtable, static_cast<size_t>(axis), A);
  // The ids' range, checked as the model's own Gather checks them: a lookup of the global ids in a zero-width table
  // of the whole vocabulary (no data moves), under the node's name. The masked lookup below would otherwise turn an
  // id the unpartitioned run refuses into zeros (issue 28).
  if (tv.shape.size() >= 2) {
    Shape none = tv.shape;
    none[static_cast<size_t>(axis == 0 ? 1 : 0)] = 0;
    int empty = -1;
    if (vocab.is_constant()) {
      empty = new_constant(on + "/range_check_table", Tensor(tv.dtype, none));
    } else {  // ConstantOfShape of the table's dims over the symbols, one of them 0
      std::vector<DimExpr> dims;
      for (size_t d = 0; d < none.size(); ++d) dims.push_back(none[d] == 0 ? DimExpr(0) : global_dim(gtable, d));
      Node fill;
      fill.op_type = "ConstantOfShape";
      fill.attrs["value"] = Tensor(tv.dtype, {1});
      empty = emit(std::move(fill), {int64_const(on + "/range_check_shape", dims, none)}, on + "/range_check_table",
                   tv.dtype, none);
    }
    Node check;
    check.op_type = "Gather";
    check.attrs["axis"] = int64_t{axis};
    Shape out(none.begin(), none.begin() + axis);  // Gather's result: table dims, ids dims, table dims
    out.insert(out.end(), ids_shape.begin(), ids_shape.end());
    out.insert(out.end(), none.begin() + axis + 1, none.end());
    emit(std::move(check), {empty, ids}, on + "/range_check", tv.dtype, out);
    P().nodes.back().name = node.name;
  }
  int off = emit(gspmd_node(PartitionOffsetAttrs{.mesh_axes = A, .shard_size = shard.eval(g_.dim_hints)}), {},
                 on + "/offset", DType::kInt64, {});
  symbolic_attr("shard_size", shard, false);
  // Negative ids count from the end of the table (ONNX Gather): make them positive first.
  const int zero_id = int64_const("zero", {0}, true);
  int neg = emit("Less", {ids, zero_id}, on + "/negative", DType::kBool, ids_shape);
  int wrapped = emit("Add", {ids, int64_scalar("vocab", vocab)}, on + "/wrapped", DType::kInt64, ids_shape);
  ids = emit("Where", {neg, wrapped, ids}, on + "/ids", DType::kInt64, ids_shape);
  int li = emit("Sub", {ids, off}, on + "/local_ids", DType::kInt64, ids_shape);
  // li >= 0 as Not(li < 0): GreaterOrEqual is opset 12+, and the device files keep the model's opset (11 and up)
  int below = emit("Less", {li, zero_id}, on + "/below", DType::kBool, ids_shape);
  int ge = emit("Not", {below}, on + "/ge", DType::kBool, ids_shape);
  int lt = emit("Less", {li, int64_scalar("shard", shard)}, on + "/lt", DType::kBool, ids_shape);
  int valid = emit("And", {ge, lt}, on + "/valid", DType::kBool, ids_shape);
  int safe = emit("Where", {valid, li, zero_id}, on + "/safe_ids", DType::kInt64, ids_shape);
  TensorSharding rs = sharding_from_factors(F, rule.results[0]);
  const Value& ov = g_.values[node.outputs[0]];
  Shape ls = rs.local_shape(ov.shape, mesh_);
  Node local = node;
  local.inputs = {table, safe};
  int looked = new_value(on + "/lookup", ov.dtype, ls);
  local.outputs = {looked};
  P().add_node(std::move(local));
  // valid [ids...] -> broadcastable to [data[:axis], ids..., data[axis+1:]]
  std::vector<int64_t> unsq;
  for (int d = 0; d < axis; ++d) unsq.push_back(d);
  const int q = static_cast<int>(ids_shape.size());
  for (int d = axis + q; d < static_cast<int>(ls.size()); ++d) unsq.push_back(d);
  int mask = valid;
  if (!unsq.empty()) {
    Shape ms(ls.size(), 1);
    for (int d = 0; d < q; ++d) ms[axis + d] = ids_shape[d];
    mask = emit("Unsqueeze", {valid, int64_const("axes", unsq)}, on + "/mask", DType::kBool, ms);
  }
  Tensor zero(ov.dtype, {});
  int out = emit("Where", {mask, looked, new_constant("zero", std::move(zero))}, on, ov.dtype, ls);
  rs.unreduced = A;
  std::sort(rs.unreduced.begin(), rs.unreduced.end());
  rs.reduction = ReductionKind::kSum;
  bind(node.outputs[0], rs, out);
}

}  // namespace gspmd::partition_internal
