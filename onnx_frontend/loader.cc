// load_model: ONNX file -> core::Graph with static shapes (bind dims, shape inference, folding). The Loader:
// loader_impl.h.
#include "onnx_frontend/loader_impl.h"

namespace gspmd {
namespace loader_internal {

void Loader::parse() {
  frontend::parse_model_file(path, &m);
  check_utf8_names(m.graph());
  bool imports_onnx = false;
  for (const auto& op : m.opset_import())
    if (op.domain().empty() || op.domain() == "ai.onnx") {
      opset = op.version();
      imports_onnx = true;
    }
  if (!imports_onnx) {
    // IR 1-2 had no opset_import: the default domain at version 1. A model importing only other domains
    // (e.g. ai.onnx.preview.training) uses no ai.onnx op; its ops are reported by the executor.
    opset = m.opset_import_size() == 0 ? 1 : 17;
  }
  if (opset < 1 || opset > kNewestOpset)
    fail(fmt::format("opset {} of ai.onnx is not one of 1 .. {} (docs/loading.md)", opset, kNewestOpset));
  if (m.graph().output_size() == 0) fail("the graph has no outputs: nothing to compute");
  // The installed onnx knows the schemas up to its own newest opset (17 for onnx 1.12): a newer model's nodes are
  // checked against those newest schemas, but for the operators that ONNX changed or added since (opset 18's
  // ReduceMean takes its axes as an input), which are left to the shape functions and the executor.
  const auto& ranges = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  if (auto it = ranges.find(""); it != ranges.end())
    verify_nodes(m.graph(), std::min<int64_t>(opset, it->second.second), opset > it->second.second);
  check_function_calls();
}

std::shared_ptr<const Tensor> Loader::read_const(const onnx::TensorProto& t, const std::string& what) {
  DType dt = frontend::proto_dtype(t.data_type(), what);
  int64_t bytes = dt == DType::kString ? 0 : static_cast<int64_t>(dtype_size(dt));
  bool small = dt != DType::kString;
  for (auto d : t.dims())  // saturated: the dims come from the file (tensor_from_proto refuses what is too large)
    if (__builtin_mul_overflow(bytes, d, &bytes)) small = false;
  small = small && bytes <= static_cast<int64_t>(kInlineForInference);
  if (opts.load_data) return std::make_shared<const Tensor>(tensor_from_proto(t, external, what));
  if (is_external(t)) external.file(t, what);  // refused even when not read
  if (!small) return nullptr;
  try {
    return std::make_shared<const Tensor>(tensor_from_proto(t, external, what));
  } catch (const InputError&) {
    if (is_external(t)) return nullptr;  // external file absent: shapes only
    throw;
  }
}

void Loader::set_type(onnx::ValueInfoProto* vi, const std::string& name, DType dt, const Shape& s) {
  vi->set_name(name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(dt));
  auto* shape = tt->mutable_shape();
  shape->clear_dim();
  for (int64_t d : s) shape->add_dim()->set_dim_value(d);
}

void Loader::expose_const(const Value& v, std::unordered_set<std::string>& graph_input_names) {
  auto* g = m.mutable_graph();
  if (v.data && v.data->nbytes() <= kInlineForInference) {
    auto* t = g->add_initializer();
    t->set_name(v.name);
    tensor_to_proto(*v.data, t);
  } else if (graph_input_names.insert(v.name).second) {
    set_type(g->add_input(), v.name, v.dtype, v.shape);
  }
}

Value Loader::initializer_value(const onnx::TensorProto& t) {
  std::string what = fmt::format("{}: initializer '{}'", path, t.name());
  Value v;
  v.name = t.name();
  v.dtype = frontend::proto_dtype(t.data_type(), what);
  v.shape = frontend::proto_shape(t);
  v.is_initializer = true;
  v.data = read_const(t, what);
  return v;
}

Value Loader::constant_value(const onnx::NodeProto& n) {
  std::string what = fmt::format("{}: Constant node '{}'", path, n.name().empty() ? n.output(0) : n.name());
  if (n.attribute_size() != 1) fail(fmt::format("Constant node '{}' needs exactly one value attribute", n.output(0)));
  const auto& a = n.attribute(0);
  Value v;
  v.name = n.output(0);
  v.is_initializer = true;
  std::shared_ptr<const Tensor> data;
  if (a.name() == "value") {
    v.dtype = frontend::proto_dtype(a.t().data_type(), what);
    v.shape = frontend::proto_shape(a.t());
    data = read_const(a.t(), what);
  } else if (a.name() == "value_float") {
    data = std::make_shared<const Tensor>(Tensor::from_floats({}, {a.f()}));
  } else if (a.name() == "value_floats") {
    data = std::make_shared<const Tensor>(
        Tensor::from_floats({a.floats_size()}, std::vector<float>(a.floats().begin(), a.floats().end())));
  } else if (a.name() == "value_int") {
    data = std::make_shared<const Tensor>(Tensor::from_int64s({a.i()}, /*scalar=*/true));
  } else if (a.name() == "value_ints") {
    data = std::make_shared<const Tensor>(Tensor::from_int64s(std::vector<int64_t>(a.ints().begin(), a.ints().end())));
  } else {
    fail(fmt::format("Constant node '{}': attribute '{}' is not supported", v.name, a.name()));
  }
  if (data) {
    v.dtype = data->dtype;
    v.shape = data->shape;
  }
  v.data = std::move(data);
  return v;
}

void Loader::prepare() {
  auto* g = m.mutable_graph();
  std::unordered_set<std::string> init_names;
  for (const auto& t : g->initializer()) init_names.insert(t.name());
  std::unordered_set<std::string> graph_input_names;
  for (const auto& in : g->input()) {
    graph_input_names.insert(in.name());
    if (!init_names.count(in.name()) && !opts.frozen_inputs.count(in.name())) input_names.push_back(in.name());
  }
  // Initializers -> consts; the proto keeps only small ones (as raw_data), large ones become typed inputs.
  google::protobuf::RepeatedPtrField<onnx::TensorProto> inits;
  inits.Swap(g->mutable_initializer());
  for (auto& t : inits) {
    Value v = initializer_value(t);
    std::string().swap(*t.mutable_raw_data());  // free the proto's copy early
    expose_const(v, graph_input_names);
    add_const(std::move(v));
  }
  inits.Clear();
  // Frozen inputs -> consts.
  for (const auto& [name, data] : opts.frozen_inputs) {
    if (!graph_input_names.count(name) || init_names.count(name))
      fail(fmt::format("frozen input '{}' is not a graph input", name));
    Value v;
    v.name = name;
    v.dtype = data.dtype;
    v.shape = data.shape;
    v.is_initializer = true;
    v.data = std::make_shared<const Tensor>(data);
    // It leaves the proto's inputs (ONNX data propagation reads initializers that are not inputs) and comes back as
    // an initializer (or, when large, as an input typed with the frozen tensor's exact type).
    auto* ins = g->mutable_input();
    for (int i = 0; i < ins->size(); ++i)
      if (ins->Get(i).name() == name) {
        ins->DeleteSubrange(i, 1);
        break;
      }
    graph_input_names.erase(name);
    expose_const(v, graph_input_names);
    add_const(std::move(v));
  }
  // Constant nodes -> consts.
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  nodes.Swap(g->mutable_node());
  for (auto& n : nodes) {
    if (n.op_type() != "Constant" || !(n.domain().empty() || n.domain() == "ai.onnx") || n.output_size() != 1) {
      *g->add_node() = std::move(n);
      continue;
    }
    Value v = constant_value(n);
    expose_const(v, graph_input_names);
    add_const(std::move(v));
  }
}

void Loader::names_read(const onnx::NodeProto& n, std::vector<std::string>& out) {
  for (const auto& in : n.input())
    if (!in.empty()) out.push_back(in);
  for (const auto& a : n.attribute()) {
    if (a.has_g())
      for (const auto& b : a.g().node()) names_read(b, out);
    for (const auto& gr : a.graphs())
      for (const auto& b : gr.node()) names_read(b, out);
  }
}

void Loader::sort_nodes() {
  auto* g = m.mutable_graph();
  const int n = g->node_size();
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < n; ++i)
    for (const auto& o : g->node(i).output())
      if (!o.empty()) producer.emplace(o, i);
  std::vector<std::vector<int>> users(n);
  std::vector<int> pending(n, 0);
  bool sorted = true;
  std::vector<std::string> reads;
  for (int i = 0; i < n; ++i) {
    reads.clear();
    names_read(g->node(i), reads);
    std::sort(reads.begin(), reads.end());
    reads.erase(std::unique(reads.begin(), reads.end()), reads.end());
    for (const std::string& r : reads) {
      auto p = producer.find(r);
      if (p == producer.end() || p->second == i) continue;
      sorted = sorted && p->second < i;
      users[p->second].push_back(i);
      ++pending[i];
    }
  }
  if (sorted) return;
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;  // lowest index first: stable
  for (int i = 0; i < n; ++i)
    if (pending[i] == 0) ready.push(i);
  std::vector<int> order;
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int u : users[i])
      if (--pending[u] == 0) ready.push(u);
  }
  if (static_cast<int>(order.size()) != n) return;
  google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
  nodes.Swap(g->mutable_node());
  for (int i : order) *g->add_node() = std::move(nodes[i]);
}

void Loader::name_absent_outputs() {
  auto* g = m.mutable_graph();
  auto has_gap = [](const onnx::NodeProto& n) {  // an absent output before a present one
    int last = n.output_size() - 1;
    while (last >= 0 && n.output(last).empty()) --last;
    for (int k = 0; k < last; ++k)
      if (n.output(k).empty()) return true;
    return false;
  };
  if (std::none_of(g->node().begin(), g->node().end(), has_gap)) return;
  std::unordered_set<std::string> taken;
  for (const auto& n : g->node())
    for (const auto& o : n.output()) taken.insert(o);
  const auto names = unique_node_names(g->node());
  for (int ni = 0; ni < g->node_size(); ++ni) {
    auto* n = g->mutable_node(ni);
    int last = n->output_size() - 1;
    while (last >= 0 && n->output(last).empty()) --last;
    for (int k = 0; k < last; ++k) {
      if (!n->output(k).empty()) continue;
      std::string name = fmt::format("{}:unused_output_{}", names[ni], k);
      while (taken.count(name) || const_index.count(name)) name += "_";
      taken.insert(name);
      n->set_output(k, name);
    }
  }
}

void Loader::infer() {
  // Before IR 4, shape inference types only the initializers listed as graph inputs; the constants exposed here
  // (initializers, Constant outputs, folded values) are not, so the proto says IR 4 from here on.
  if (m.ir_version() < 4) m.set_ir_version(4);
  register_gspmd_schemas();  // a device model's collectives are typed (and checked) by their schemas
  const onnx::ShapeInferenceOptions options(true, 1, true);
  try {
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), options);
    return;
  } catch (const std::exception&) {
  }
  // Exporters sometimes leave stale value_info that contradicts inference: retry once from the inputs alone.
  try {
    m.mutable_graph()->clear_value_info();
    onnx::shape_inference::InferShapes(m, onnx::OpSchemaRegistry::Instance(), options);
  } catch (const std::exception& e) {
    fail(fmt::format("shape inference failed: {}", first_line(e.what())));
  }
}

}  // namespace loader_internal

using loader_internal::Loader;

Graph load_model(const std::string& path, const LoadOptions& opts, LoadReport* report) {
  Loader L(path, opts);
  L.parse();
  const bool annotated = frontend::has_sharding_annotations(L.m);
  L.prepare();
  L.sort_nodes();
  L.name_absent_outputs();
  L.bind_dims();
  LoadReport local;
  LoadReport& rep = report ? *report : local;
  rep = {};
  rep.sharding_annotations = annotated;
  L.check_reads_defined();
  L.check_conv_pool_ranks();
  L.check_constant_sizes();
  L.infer();
  std::unordered_set<std::string> unknown;
  Graph g = L.convert(unknown);
  frontend::simplify_for_inference(g, rep);
  g.prune();
  std::map<std::string, std::string> why;
  try {
    LoadOptions with_inputs;
    frontend::infer_and_fold(g, unknown, why, L.with_structured_inputs(with_inputs), rep);
  } catch (const InputError& e) {
    L.fail(e.what());
  }
  L.check_dim_names(g);
  {  // prune renumbers the values: the signature follows them by name
    std::vector<std::vector<std::string>> names;
    for (const auto* sig : {&rep.inputs, &rep.outputs})
      for (const FlatValue& f : *sig) {
        names.emplace_back();
        for (int v : f.values) names.back().push_back(g.values[static_cast<size_t>(v)].name);
      }
    g.prune();
    size_t k = 0;
    for (auto* sig : {&rep.inputs, &rep.outputs})
      for (FlatValue& f : *sig) {
        for (size_t e = 0; e < f.values.size(); ++e) f.values[e] = g.find(names[k][e]);
        ++k;
      }
  }
  for (const Value& v : g.values) {
    if (auto nt = L.non_tensor.find(v.name); nt != L.non_tensor.end())
      L.fail(fmt::format("value '{}' is a {}, which is not supported (only tensors, sequences and optionals are)",
                         v.name, nt->second));
    if (!unknown.count(v.name)) continue;
    std::string by = v.producer >= 0 ? fmt::format(" (output of node '{}' ({}))", g.nodes[v.producer].name,
                                                   g.nodes[v.producer].op_type)
                                     : "";
    auto w = why.find(v.name);
    L.fail(fmt::format("value '{}'{} {}", v.name, by,
                       w != why.end() ? w->second : "has no static shape after shape inference and constant folding"));
  }
  for (const Value& v : g.values)
    if (v.kind != ValueKind::kTensor)  // every node reading it was lowered (sequences.cc): a bug if not
      L.fail(fmt::format("value '{}' is a {} that is still read after lowering", v.name,
                         v.kind == ValueKind::kSequence ? "sequence" : "optional"));
  for (const Value& v : g.values) {
    if (v.dtype == DType::kString) L.fail(fmt::format("value '{}' is a string tensor, which is not supported", v.name));
    if (dtype_name(v.dtype) == "undefined") L.fail(fmt::format("value '{}' has no element type", v.name));
    // sizes the cost model and the executor multiply (a Tile to 2^65 elements overflowed them)
    int64_t bytes = static_cast<int64_t>(dtype_size(v.dtype));
    for (int64_t d : v.shape)
      if (d < 0 || __builtin_mul_overflow(bytes, d, &bytes) || bytes > Loader::kMaxValueBytes)
        L.fail(fmt::format("value '{}' has the shape {}: {}", cut_text(v.name), cut_text(shape_str(v.shape), 200),
                           d < 0 ? "a negative dim" : "more than 2^50 bytes (1 PiB), the limit of a value"));
  }
  try {
    g.verify();
  } catch (const std::exception& e) {
    L.fail(e.what());
  }
  return g;
}

}  // namespace gspmd
