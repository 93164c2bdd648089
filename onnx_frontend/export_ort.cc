// The exporter's ONNX Runtime collectives (export_impl.h, --collectives ort; docs/collectives.md, "ONNX Runtime").
#include "onnx_frontend/export_impl.h"

namespace gspmd::export_internal {

DType Exporter::ort_wire_type(DType t) {
  switch (t) {
    case DType::kFloat16:
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kInt64:
    case DType::kBool: return t;
    case DType::kBFloat16: return DType::kFloat32;
    case DType::kInt8:
    case DType::kInt16:
    case DType::kInt32:
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32: return DType::kInt64;
    default: return DType::kUndefined;
  }
}

onnx::NodeProto* Exporter::add_ms_node(const std::string& node, const std::string& op, const std::string& x,
                                       const std::string& y) {
  ort_used = true;
  auto* n = add_node(fresh(node + "/" + op), op, {x}, {y});
  n->set_domain(kOrtDomain);
  return n;
}

std::string Exporter::add_dims_temp(const std::string& hint, DType t, const Dims& d) {
  Value v;
  v.name = fresh(hint);
  v.dtype = t;
  bool symbolic = false;
  for (const DimExpr& e : d) {
    v.shape.push_back(e.eval(G.dim_hints));
    symbolic = symbolic || !e.is_constant();
  }
  if (symbolic) v.sym = std::make_shared<const SymbolicValue>(SymbolicValue{d, std::nullopt});
  set_value_info(pg->add_value_info(), v);
  return v.name;
}

std::string Exporter::shape_operand(const Node& n, const Dims& d) {
  if (std::all_of(d.begin(), d.end(), [](const DimExpr& e) { return e.is_constant(); })) {
    std::vector<int64_t> v;
    for (const DimExpr& e : d) v.push_back(e.constant_part());
    return add_const(n.name + "/shape", Tensor::from_int64s(v));
  }
  std::vector<std::string> parts;
  for (const DimExpr& e : d) parts.push_back(expr_value(e));
  const std::string y = add_temp(n.name + "/shape", DType::kInt64, {static_cast<int64_t>(d.size())});
  set_attr(add_node(fresh(n.name + "/Concat"), "Concat", parts, {y})->add_attribute(), "axis", int64_t{0});
  return y;
}

std::string Exporter::cast(const Node& n, const std::string& x, DType from, DType to, const Dims& d,
                           const std::string& out) {
  if (from == to) return x;
  if (opset < 6) ort_refuse(n, fmt::format("casting {} needs ai.onnx opset >= 6", dtype_name(from)));
  std::string y = out.empty() ? add_dims_temp(n.name + "/cast", to, d) : out;
  auto* c = add_node(fresh(n.name + "/Cast"), "Cast", {x}, {y});
  set_attr(c->add_attribute(), "to", static_cast<int64_t>(to));
  return y;
}

std::string Exporter::reshape(const Node& n, const std::string& x, DType t, const Dims& to, const std::string& out) {
  std::string y = out.empty() ? add_dims_temp(n.name + "/reshaped", t, to) : out;
  if (opset >= 5) {
    add_node(fresh(n.name + "/Reshape"), "Reshape", {x, shape_operand(n, to)}, {y});
    return y;
  }
  std::vector<int64_t> shape;
  for (const DimExpr& e : to) {
    if (!e.is_constant()) ort_refuse(n, "a Reshape to dims over the symbols needs ai.onnx opset >= 5");
    shape.push_back(e.constant_part());
  }
  auto* r = add_node(fresh(n.name + "/Reshape"), "Reshape", {x}, {y});
  set_attr(r->add_attribute(), "shape", shape);
  return y;
}

std::string Exporter::transpose(const Node& n, const std::string& x, DType t, const Dims& d,
                                const std::vector<int64_t>& perm) {
  Dims to;
  for (int64_t a : perm) to.push_back(d[static_cast<size_t>(a)]);
  std::string y = add_dims_temp(n.name + "/transposed", t, to);
  auto* tr = add_node(fresh(n.name + "/Transpose"), "Transpose", {x}, {y});
  set_attr(tr->add_attribute(), "perm", perm);
  return y;
}

std::string Exporter::gather_rows(const Node& n, const Value& x, DType wire, const std::vector<int64_t>& members) {
  const int64_t N = p.mesh.num_devices();
  const Dims d = dims_of_value(x);
  Dims one = d, all = d, sel = d;
  one.insert(one.begin(), 1);
  all.insert(all.begin(), N);
  sel.insert(sel.begin(), static_cast<int64_t>(members.size()));
  const std::string x1 = reshape(n, cast(n, x.name, x.dtype, wire, d), wire, one);
  const std::string g = add_dims_temp(n.name + "/all", wire, all);
  auto* ag = add_ms_node(n.name, "AllGather", x1, g);
  set_attr(ag->add_attribute(), "axis", int64_t{0});
  set_attr(ag->add_attribute(), "group_size", N);
  bool identity = static_cast<int64_t>(members.size()) == N;
  for (size_t k = 0; identity && k < members.size(); ++k) identity = members[k] == static_cast<int64_t>(k);
  if (identity) return g;
  const std::string rows = add_dims_temp(n.name + "/members_x", wire, sel);
  auto* ga = add_node(fresh(n.name + "/Gather"), "Gather",
                      {g, add_const(n.name + "/members", Tensor::from_int64s(members))}, {rows});
  set_attr(ga->add_attribute(), "axis", int64_t{0});
  return rows;
}

std::string Exporter::reduce_rows(const Node& n, const std::string& rows, DType wire, const Dims& d, ReductionKind r,
                                  const std::string& out) {
  if (wire == DType::kBool) ort_refuse(n, "ONNX Runtime's collectives cannot reduce bool tensors");
  static const char* const kOps[] = {"ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"};
  const std::string op = kOps[static_cast<int>(r)];
  const std::string y = out.empty() ? add_dims_temp(n.name + "/reduced", wire, d) : out;
  onnx::NodeProto* red = nullptr;
  if (opset >= (r == ReductionKind::kSum ? 13 : 18)) {  // axes became an input (ReduceSum-13, the others 18)
    red = add_node(fresh(n.name + "/" + op), op, {rows, add_const(n.name + "/axes", Tensor::from_int64s({0}))}, {y});
  } else {
    red = add_node(fresh(n.name + "/" + op), op, {rows}, {y});
    set_attr(red->add_attribute(), "axes", std::vector<int64_t>{0});
  }
  set_attr(red->add_attribute(), "keepdims", int64_t{0});
  return y;
}

void Exporter::merge_rows(const Node& n, const std::string& rows, int64_t count, DType wire, const Dims& d,
                          int64_t axis, const std::string& out) {
  std::string x = rows;
  if (axis > 0) {
    Dims in = d;
    in.insert(in.begin(), count);
    std::vector<int64_t> perm;
    for (int64_t k = 1; k <= axis; ++k) perm.push_back(k);
    perm.push_back(0);
    for (int64_t k = axis + 1; k <= static_cast<int64_t>(d.size()); ++k) perm.push_back(k);
    x = transpose(n, rows, wire, in, perm);
  }
  Dims merged = d;
  merged[static_cast<size_t>(axis)] = merged[static_cast<size_t>(axis)] * count;
  reshape(n, x, wire, merged, out);
}

void Exporter::lower_ort(const Node& n) {
  const CollectiveAttrs a = collective_attrs(n);
  const std::vector<int>& axes = checked(n, a.mesh_axes);
  const Value& x = G.values.at(n.inputs.at(0));
  const Value& y = G.values.at(n.outputs.at(0));
  const Dims X = dims_of_value(x), Y = dims_of_value(y);
  const int64_t N = p.mesh.num_devices();
  std::vector<int64_t> members;
  for (auto& grp : p.mesh.replica_groups(axes))
    if (std::find(grp.begin(), grp.end(), device) != grp.end()) members = grp;
  const int64_t ng = static_cast<int64_t>(members.size()), tile = p.mesh.tile_index(device, axes);
  // ORT's world: every device (enough for the sums), in device order (for what concatenates in rank order)
  const bool world = ng == N;
  bool in_order = world;
  for (int64_t k = 0; in_order && k < ng; ++k) in_order = members[static_cast<size_t>(k)] == k;
  const DType wire = ort_wire_type(x.dtype);
  if (wire == DType::kUndefined)
    ort_refuse(n, fmt::format("ONNX Runtime's AllGather and AllToAll carry float16, float, double, int64 or bool "
                              "tensors, not {}",
                              dtype_name(x.dtype)));
  const bool floating = x.dtype == DType::kFloat16 || x.dtype == DType::kFloat32 || x.dtype == DType::kFloat64;
  const bool ort_sum = a.kind == Collective::kAllReduce && world && a.reduction == ReductionKind::kSum && floating;
  const size_t rank = x.shape.size();
  // The result in the wire type: y itself, or a temp cast to y at the end.
  const std::string out = wire == y.dtype ? y.name : add_dims_temp(n.name + "/result", wire, Y);
  switch (a.kind) {
    case Collective::kAllReduce:
      if (ort_sum) {
        add_ms_node(n.name, "AllReduce", x.name, y.name);
        return;
      }
      reduce_rows(n, gather_rows(n, x, wire, members), wire, X, a.reduction, out);
      break;
    case Collective::kAllGather: {
      const int64_t axis = norm_axis(n, a.axis, rank);
      if (in_order) {
        auto* ag = add_ms_node(n.name, "AllGather", cast(n, x.name, x.dtype, wire, X), out);
        set_attr(ag->add_attribute(), "axis", axis);
        set_attr(ag->add_attribute(), "group_size", N);
        break;
      }
      merge_rows(n, gather_rows(n, x, wire, members), ng, wire, X, axis, out);
      break;
    }
    case Collective::kReduceScatter: {
      const int64_t axis = norm_axis(n, a.axis, rank);
      std::string full;
      if (world && a.reduction == ReductionKind::kSum && floating) {
        full = add_dims_temp(n.name + "/reduced", x.dtype, X);
        add_ms_node(n.name, "AllReduce", x.name, full);
      } else {
        full = reduce_rows(n, gather_rows(n, x, wire, members), wire, X, a.reduction);
      }
      const int64_t c = ort_part(n, X, axis, ng);
      emit_slice(n.name, full, out, axis, tile * c, (tile + 1) * c);
      break;
    }
    case Collective::kAllToAll: ort_all_to_all(n, a, x, X, wire, members, tile, in_order, out); break;
    case Collective::kCollectivePermute: ort_permute(n, a, axes, x, X, wire, members, tile, out); break;
  }
  if (out != y.name) cast(n, out, wire, y.dtype, Y, y.name);
}

int64_t Exporter::ort_part(const Node& n, const Dims& d, int64_t axis, int64_t members) const {
  const DimExpr& e = d[static_cast<size_t>(axis)];
  if (!e.is_constant())
    throw InternalError(
        fmt::format("export: node '{}' ({}) splits the symbolic dim {} ({})", n.name, n.op_type, axis, e.str()));
  return e.constant_part() / members;
}

void Exporter::ort_all_to_all(const Node& n, const CollectiveAttrs& a, const Value& x, const Dims& X, DType wire,
                              const std::vector<int64_t>& members, int64_t tile, bool in_order,
                              const std::string& out) {
  const int64_t N = p.mesh.num_devices(), ng = static_cast<int64_t>(members.size());
  const size_t rank = x.shape.size();
  const int64_t sa = norm_axis(n, a.split_axis, rank), ca = norm_axis(n, a.concat_axis, rank);
  const int64_t c = ort_part(n, X, sa, ng);
  Dims chunk = X;  // one member's chunk
  chunk[static_cast<size_t>(sa)] = c;
  Dims rows_dims = chunk;
  rows_dims.insert(rows_dims.begin(), ng);
  std::string rows;
  if (in_order) {
    std::string xi = cast(n, x.name, x.dtype, wire, X);
    if (sa == 0 && ca == 0) {
      auto* aa = add_ms_node(n.name, "AllToAll", xi, out);
      set_attr(aa->add_attribute(), "group_size", N);
      return;
    }
    // x as [N, ...chunk]: split_axis cut into [N, c] and N moved to the front; AllToAll swaps the N chunks.
    Dims cut = X;
    cut[static_cast<size_t>(sa)] = c;
    cut.insert(cut.begin() + sa, N);
    std::string front = reshape(n, xi, wire, cut);
    if (sa > 0) {
      std::vector<int64_t> perm{sa};
      for (int64_t k = 0; k <= static_cast<int64_t>(rank); ++k)
        if (k != sa) perm.push_back(k);
      front = transpose(n, front, wire, cut, perm);
    }
    rows = add_dims_temp(n.name + "/exchanged", wire, rows_dims);
    auto* aa = add_ms_node(n.name, "AllToAll", front, rows);
    set_attr(aa->add_attribute(), "group_size", N);
  } else {
    // every member's x, then each one's chunk `tile` along split_axis
    rows = add_dims_temp(n.name + "/chunks", wire, rows_dims);
    emit_slice(n.name, gather_rows(n, x, wire, members), rows, sa + 1, tile * c, (tile + 1) * c);
  }
  merge_rows(n, rows, ng, wire, chunk, ca, out);
}

void Exporter::ort_permute(const Node& n, const CollectiveAttrs& a, const std::vector<int>& axes, const Value& x,
                           const Dims& X, DType wire, const std::vector<int64_t>& members, int64_t tile,
                           const std::string& out) {
  const int64_t src = permute_sources(p.mesh, axes, a.shift, a.target_axes, a.wrap).at(static_cast<size_t>(tile));
  Dims one = X;
  one.insert(one.begin(), 1);
  if (src >= 0) {
    reshape(n, gather_rows(n, x, wire, {members[static_cast<size_t>(src)]}), wire, X, out);
    return;
  }
  // No source: zeros, computed from the gathered rows so that this device still takes part in the AllGather.
  const std::string own = gather_rows(n, x, wire, {device});
  Dims none = one;
  none[0] = 0;
  const std::string empty = add_dims_temp(n.name + "/empty", wire, none);
  emit_slice(n.name, own, empty, 0, 0, 0);
  const std::string zeros = add_dims_temp(n.name + "/zeros", wire, one);
  emit_pad(n.name, empty, zeros, wire, one.size(), 0, 0, 1, 0.0);
  reshape(n, zeros, wire, X, out);
}

}  // namespace gspmd::export_internal
