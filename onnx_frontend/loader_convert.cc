// The loader's conversion of an ONNX graph to the IR (loader_impl.h): nodes, attributes, typed values, bodies.
#include "onnx_frontend/loader_impl.h"

namespace gspmd::loader_internal {

AttrValue Loader::convert_attr(const onnx::NodeProto& n, const std::string& node_name, const onnx::AttributeProto& a,
                               Bodies& bodies) {
  using AP = onnx::AttributeProto;
  auto type = a.type();
  if (type == AP::UNDEFINED) {  // very old models: infer from the field that is set
    if (a.has_f())
      type = AP::FLOAT;
    else if (a.has_i())
      type = AP::INT;
    else if (a.has_s())
      type = AP::STRING;
    else if (a.has_t())
      type = AP::TENSOR;
    else if (a.has_g() || a.graphs_size())
      type = AP::GRAPH;
    else if (a.floats_size())
      type = AP::FLOATS;
    else if (a.strings_size())
      type = AP::STRINGS;
    else
      type = AP::INTS;
  }
  switch (type) {
    case AP::FLOAT: return a.f();
    case AP::INT: return static_cast<int64_t>(a.i());
    case AP::STRING: return a.s();
    case AP::FLOATS: return std::vector<float>(a.floats().begin(), a.floats().end());
    case AP::INTS: return std::vector<int64_t>(a.ints().begin(), a.ints().end());
    case AP::STRINGS: return std::vector<std::string>(a.strings().begin(), a.strings().end());
    case AP::TENSOR:
      return tensor_from_proto(a.t(), external, fmt::format("{}: node '{}' attribute '{}'", path, node_name, a.name()));
    case AP::GRAPH:
      bodies.graphs.push_back(convert_body(a.g(), bodies.captures));
      return std::shared_ptr<const Graph>(bodies.graphs.back());
    case AP::TYPE_PROTO: {  // Optional's `type`: [1 for a sequence else 0, element type] (sequences.cc)
      const onnx::TypeProto* t = &a.tp();
      const bool sequence = t->has_sequence_type();
      if (sequence) t = &t->sequence_type().elem_type();
      return std::vector<int64_t>{sequence ? 1 : 0, t->has_tensor_type() ? t->tensor_type().elem_type() : 0};
    }
    case AP::GRAPHS:
      fail(fmt::format("node '{}' ({}): attribute '{}' holds a list of graphs, which is not supported", node_name,
                       n.op_type(), a.name()));
    default:
      fail(fmt::format("node '{}' ({}): attribute '{}' has an unsupported type", node_name, n.op_type(), a.name()));
  }
}

Loader::TypeMap Loader::type_map(const onnx::GraphProto& pg) {
  TypeMap types;
  for (const auto& vi : pg.value_info()) types[vi.name()] = &vi.type();
  for (const auto& vi : pg.output()) types[vi.name()] = &vi.type();
  for (const auto& vi : pg.input()) types[vi.name()] = &vi.type();
  return types;
}

Value Loader::typed_value(const std::string& name, const TypeMap& types, std::unordered_set<std::string>* unknown) {
  Value v;
  v.name = name;
  auto it = types.find(name);
  bool known = false;
  if (it != types.end() && it->second->has_tensor_type()) {
    const auto& tt = it->second->tensor_type();
    if (tt.elem_type() != 0) v.dtype = frontend::proto_dtype(tt.elem_type(), fmt::format("{}: value '{}'", path, name));
    if (tt.has_shape() && v.dtype != DType::kUndefined) {
      known = true;
      for (const auto& d : tt.shape().dim()) {
        if (!d.has_dim_value() || d.dim_value() < 0)
          known = false;
        else
          v.shape.push_back(d.dim_value());
      }
    }
  }
  if (it != types.end() && !it->second->has_tensor_type() &&
      it->second->value_case() != onnx::TypeProto::VALUE_NOT_SET) {
    const onnx::TypeProto* element = nullptr;
    if (it->second->has_sequence_type()) {
      v.kind = ValueKind::kSequence;
      element = &it->second->sequence_type().elem_type();
    } else if (it->second->has_optional_type()) {
      v.kind = ValueKind::kOptional;
      element = &it->second->optional_type().elem_type();
      if (element->has_sequence_type()) element = &element->sequence_type().elem_type();
    } else {
      non_tensor[name] = it->second->has_map_type() ? "map" : "non-tensor value";
    }
    if (element && element->has_tensor_type() && element->tensor_type().elem_type() != 0)
      v.dtype = frontend::proto_dtype(element->tensor_type().elem_type(), fmt::format("{}: value '{}'", path, name));
    if (v.kind != ValueKind::kTensor) {  // a sequence or optional: fold.cc lowers it (docs/sequences.md)
      if (unknown) unknown->insert(name);
      return v;
    }
  }
  if (!known) {
    if (unknown)
      unknown->insert(name);
    else
      v.dtype = DType::kUndefined;
    v.shape.clear();
  }
  return v;
}

void Loader::convert_attrs(const onnx::NodeProto& pn, Node& n, const std::function<int(const std::string&)>& resolve) {
  Bodies bodies;
  for (const auto& a : pn.attribute()) n.attrs.emplace(a.name(), convert_attr(pn, n.name, a, bodies));
  // Before opset 19 ONNX's reference Cast truncates float32 to bfloat16 (onnx 1.12's test data); the model's own
  // Casts keep that, every other rounding to bfloat16 (kernels' outputs, the Casts --precision, the partitioner and
  // the step builder insert) is to nearest even, as TPUs and torch round (backend/kernels: cast_tensor).
  if (opset < 19 && (pn.domain().empty() || pn.domain() == "ai.onnx") &&
      (pn.op_type() == "Cast" || pn.op_type() == "CastLike"))
    n.attrs["gspmd_truncate_bf16"] = int64_t{1};
  const std::vector<std::string>& captures = bodies.captures;
  if (captures.empty()) return;
  for (const std::shared_ptr<Graph>& b : bodies.graphs)
    for (const std::string& name : captures) {
      int id = b->find(name);
      if (id < 0) id = b->add_value(untyped(name));
      b->inputs.push_back(id);
    }
  for (const std::string& name : captures) n.inputs.push_back(resolve(name));
  n.attrs["gspmd_captures"] = static_cast<int64_t>(captures.size());
}

Node Loader::node_of(const onnx::NodeProto& pn, const std::string& name,
                     const std::function<int(const std::string&)>& resolve) {
  Node n;
  n.name = name;
  n.op_type = pn.op_type();
  n.domain = pn.domain() == "ai.onnx" ? "" : pn.domain();
  for (const auto& in : pn.input()) n.inputs.push_back(in.empty() ? -1 : resolve(in));
  return n;
}

std::vector<std::string> Loader::output_names(const onnx::NodeProto& pn, const std::string& node_name, const Graph& g) {
  std::vector<std::string> out;
  int last = pn.output_size() - 1;
  while (last >= 0 && pn.output(last).empty()) --last;
  for (int k = 0; k <= last; ++k) {
    std::string name = pn.output(k);
    if (name.empty()) {
      name = fmt::format("{}:unused_output_{}", node_name, k);
      while (g.find(name) >= 0) name += "_";
    }
    out.push_back(std::move(name));
  }
  return out;
}

std::shared_ptr<Graph> Loader::convert_body(const onnx::GraphProto& pg, std::vector<std::string>& captures) {
  auto b = std::make_shared<Graph>();
  b->name = pg.name();
  b->opset = opset;
  const TypeMap types = type_map(pg);
  auto define = [&](Value v) {
    if (b->find(v.name) >= 0) fail(fmt::format("body '{}': value '{}' is defined twice", b->name, v.name));
    return b->add_value(std::move(v));
  };
  for (const auto& in : pg.input()) b->inputs.push_back(define(typed_value(in.name(), types, nullptr)));
  for (const auto& t : pg.initializer()) define(initializer_value(t));
  auto resolve = [&](const std::string& name) {
    int id = b->find(name);
    if (id >= 0) return id;
    if (std::find(captures.begin(), captures.end(), name) == captures.end()) captures.push_back(name);
    return b->add_value(untyped(name));
  };
  const std::vector<std::string> names = unique_node_names(pg.node());
  for (int ni = 0; ni < pg.node_size(); ++ni) {
    const auto& pn = pg.node(ni);
    if (pn.op_type() == "Constant" && (pn.domain().empty() || pn.domain() == "ai.onnx") && pn.output_size() == 1) {
      define(constant_value(pn));
      continue;
    }
    Node n = node_of(pn, names[ni], resolve);
    convert_attrs(pn, n, resolve);
    for (const std::string& name : output_names(pn, n.name, *b))
      n.outputs.push_back(define(typed_value(name, types, nullptr)));
    b->add_node(std::move(n));
  }
  for (const auto& out : pg.output()) b->outputs.push_back(resolve(out.name()));
  return b;
}

Graph Loader::convert(std::unordered_set<std::string>& unknown) {
  const auto& pg = m.graph();
  Graph g;
  g.name = pg.name();
  g.opset = opset;
  const TypeMap types = type_map(pg);
  auto make_value = [&](const std::string& name) { return typed_value(name, types, &unknown); };
  for (const Value& c : consts) g.add_value(c);
  for (const auto& name : input_names) {
    if (g.find(name) >= 0) fail(fmt::format("graph input '{}' is defined twice", name));
    g.inputs.push_back(g.add_value(make_value(name)));
    if (auto s = symbolic_inputs.find(name); s != symbolic_inputs.end()) {
      Value& v = g.values[static_cast<size_t>(g.inputs.back())];
      std::vector<DimExpr> dims = s->second;
      for (size_t i = 0; i < dims.size() && i < v.shape.size(); ++i)  // the static dims
        if (dims[i] == DimExpr()) dims[i] = v.shape[i];
      v.sym = std::make_shared<const SymbolicValue>(SymbolicValue{std::move(dims), std::nullopt});
    }
  }
  g.dim_hints = hints;
  const std::vector<std::string> names = unique_node_names(pg.node());
  for (int ni = 0; ni < pg.node_size(); ++ni) {
    const auto& pn = pg.node(ni);
    Node n = node_of(pn, names[ni], [&](const std::string& in) {
      int id = g.find(in);
      if (id < 0)
        fail(
            fmt::format("node '{}' ({}) reads '{}' before it is defined (missing value or graph not "
                        "topologically sorted)",
                        names[ni], pn.op_type(), in));
      return id;
    });
    for (const std::string& name : output_names(pn, n.name, g)) {
      if (g.find(name) >= 0) fail(fmt::format("value '{}' is defined twice (node '{}')", name, n.name));
      n.outputs.push_back(g.add_value(make_value(name)));
    }
    convert_attrs(pn, n, [&](const std::string& name) {
      int id = g.find(name);
      if (id < 0)
        fail(fmt::format("node '{}' ({}): its body reads '{}', which is not defined before it", n.name, n.op_type,
                         name));
      return id;
    });
    g.add_node(std::move(n));
  }
  for (const auto& out : pg.output()) {
    int id = g.find(out.name());
    if (id < 0) fail(fmt::format("graph output '{}' is not produced by any node, input or initializer", out.name()));
    g.outputs.push_back(id);
  }
  return g;
}

}  // namespace gspmd::loader_internal
