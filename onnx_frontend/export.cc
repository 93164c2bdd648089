// export_device: the SPMD program specialised for one device, as a standalone ONNX model (docs/collectives.md). The
// Exporter: export_impl.h.
#include "onnx_frontend/export_impl.h"

namespace gspmd {
namespace export_internal {

Tensor filled(DType t, const Shape& shape, double v) {
  Tensor out(t, shape);
  const int64_t n = out.numel();
  auto fill = [&](auto x) {
    using X = decltype(x);
    X* d = out.data<X>();
    for (int64_t i = 0; i < n; ++i) d[i] = x;
  };
  switch (t) {
    case DType::kFloat32: fill(static_cast<float>(v)); break;
    case DType::kFloat64: fill(v); break;
    case DType::kInt64: fill(clamp_to<int64_t>(v)); break;
    case DType::kInt32: fill(clamp_to<int32_t>(v)); break;
    case DType::kInt16: fill(clamp_to<int16_t>(v)); break;
    case DType::kInt8: fill(clamp_to<int8_t>(v)); break;
    case DType::kUInt64: fill(clamp_to<uint64_t>(v)); break;
    case DType::kUInt32: fill(clamp_to<uint32_t>(v)); break;
    case DType::kUInt16: fill(clamp_to<uint16_t>(v)); break;
    case DType::kUInt8: fill(clamp_to<uint8_t>(v)); break;
    case DType::kBool: fill(static_cast<uint8_t>(v != 0)); break;
    case DType::kFloat16: fill(float_to_half(static_cast<float>(v))); break;
    case DType::kBFloat16: {
      float f = static_cast<float>(v);
      uint32_t x;
      std::memcpy(&x, &f, 4);
      if (!std::isnan(f)) x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
      fill(static_cast<uint16_t>(x >> 16));
      break;
    }
    default: throw InternalError(fmt::format("export: cannot make a {} constant", dtype_name(t)));
  }
  return out;
}

void set_value_info(onnx::ValueInfoProto* vi, const Value& v) {
  vi->set_name(v.name);
  auto* tt = vi->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int32_t>(v.dtype));
  auto* s = tt->mutable_shape();
  for (size_t d = 0; d < v.shape.size(); ++d) {
    if (v.sym && !v.sym->dims[d].is_constant())
      s->add_dim()->set_dim_param(v.sym->dims[d].str());
    else
      s->add_dim()->set_dim_value(v.shape[d]);
  }
}

void set_attr(onnx::AttributeProto* a, const std::string& name, const AttrValue& v,
              const std::vector<std::string>& captured) {
  using AP = onnx::AttributeProto;
  a->set_name(name);
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, int64_t>) {
          a->set_type(AP::INT);
          a->set_i(x);
        } else if constexpr (std::is_same_v<X, float>) {
          a->set_type(AP::FLOAT);
          a->set_f(x);
        } else if constexpr (std::is_same_v<X, std::string>) {
          a->set_type(AP::STRING);
          a->set_s(x);
        } else if constexpr (std::is_same_v<X, std::vector<int64_t>>) {
          a->set_type(AP::INTS);
          for (auto e : x) a->add_ints(e);
        } else if constexpr (std::is_same_v<X, std::vector<float>>) {
          a->set_type(AP::FLOATS);
          for (auto e : x) a->add_floats(e);
        } else if constexpr (std::is_same_v<X, std::vector<std::string>>) {
          a->set_type(AP::STRINGS);
          for (const auto& e : x) a->add_strings(e);
        } else if constexpr (std::is_same_v<X, Tensor>) {
          a->set_type(AP::TENSOR);
          frontend::tensor_to_proto(x, a->mutable_t());
        } else {
          a->set_type(AP::GRAPH);
          write_body(*x, a->mutable_g(), captured);
        }
      },
      v);
}

void write_node(const Node& n, onnx::NodeProto* pn, const std::vector<std::string>& name) {
  pn->set_name(n.name);
  pn->set_op_type(n.op_type);
  if (!n.domain.empty()) pn->set_domain(n.domain);
  const size_t own = n.inputs.size() - static_cast<size_t>(n.captures());
  std::vector<std::string> captured;
  for (size_t k = 0; k < n.inputs.size(); ++k) {
    const std::string in = n.inputs[k] >= 0 ? name.at(static_cast<size_t>(n.inputs[k])) : "";
    if (k < own)
      pn->add_input(in);
    else
      captured.push_back(in);
  }
  for (int o : n.outputs) pn->add_output(name.at(static_cast<size_t>(o)));
  for (const auto& [k, v] : n.attrs)
    if (k != "gspmd_captures" && k != "gspmd_truncate_bf16") set_attr(pn->add_attribute(), k, v, captured);
}

std::vector<std::string> value_names(const Graph& g) {
  std::vector<std::string> name;
  for (const Value& v : g.values) name.push_back(v.name);
  return name;
}

void write_body(const Graph& b, onnx::GraphProto* gp, const std::vector<std::string>& captured) {
  const size_t formal = b.inputs.size() - captured.size();
  std::vector<std::string> name = value_names(b);
  for (size_t j = 0; j < captured.size(); ++j) name[static_cast<size_t>(b.inputs[formal + j])] = captured[j];
  auto info = [&](onnx::ValueInfoProto* vi, int v) {
    if (b.values[v].dtype == DType::kUndefined)
      vi->set_name(name[static_cast<size_t>(v)]);
    else
      set_value_info(vi, b.values[v]);
  };
  gp->set_name(b.name);
  for (size_t k = 0; k < formal; ++k) info(gp->add_input(), b.inputs[k]);
  for (int v : b.outputs) info(gp->add_output(), v);
  for (const Value& v : b.values)
    if (v.producer < 0 && v.is_initializer && v.data) {
      auto* init = gp->add_initializer();
      init->set_name(v.name);
      frontend::tensor_to_proto(*v.data, init);
    }
  for (const Node& n : b.nodes) write_node(n, gp->add_node(), name);
}

std::string Exporter::fresh(const std::string& hint) {
  std::string n = hint;
  for (int k = 1; names.count(n); ++k) n = fmt::format("{}_{}", hint, k);
  names.insert(n);
  return n;
}

std::string Exporter::add_const(const std::string& hint, const Tensor& t) {
  std::string name = fresh(hint);
  auto* init = pg->add_initializer();
  init->set_name(name);
  frontend::tensor_to_proto(t, init);
  return name;
}

onnx::NodeProto* Exporter::add_node(const std::string& name, const std::string& op, std::vector<std::string> ins,
                                    std::vector<std::string> outs) {
  auto* n = pg->add_node();
  n->set_name(name);
  n->set_op_type(op);
  for (auto& i : ins) n->add_input(i);
  for (auto& o : outs) n->add_output(o);
  return n;
}

void Exporter::opset_form(const Node& n, onnx::NodeProto* pn) {
  if (!n.domain.empty() && n.domain != "ai.onnx") return;
  struct Form {
    const char* op;
    int64_t since;                        // the opset from which the operands are inputs
    std::vector<const char*> attributes;  // per input from 1: the attribute it was before (nullptr: must be ones)
  };
  static const Form kForms[] = {
      {"Slice", 10, {"starts", "ends", "axes", nullptr}},
      {"Unsqueeze", 13, {"axes"}},
      {"Squeeze", 13, {"axes"}},
      {"Split", 13, {"split"}},
      {"ReduceSum", 13, {"axes"}},
      {"ReduceMax", 18, {"axes"}},
      {"ReduceMin", 18, {"axes"}},
      {"ReduceMean", 18, {"axes"}},
      {"ReduceProd", 18, {"axes"}},
      {"ReduceSumSquare", 18, {"axes"}},
      {"ReduceL1", 18, {"axes"}},
      {"ReduceL2", 18, {"axes"}},
      {"ReduceLogSum", 18, {"axes"}},
      {"ReduceLogSumExp", 18, {"axes"}},
  };
  const Form* f = nullptr;
  for (const Form& x : kForms)
    if (n.op_type == x.op) f = &x;
  if (!f || opset >= f->since || pn->input_size() < 2) return;
  for (int k = 1; k < pn->input_size(); ++k) {
    const int v = n.inputs.at(static_cast<size_t>(k));
    if (v < 0) continue;  // an absent optional input
    const Value& c = G.values.at(static_cast<size_t>(v));
    if (!c.data || static_cast<size_t>(k - 1) >= f->attributes.size())
      throw InternalError(
          fmt::format("export: node '{}' ({}) at opset {}: input {} is not a constant it can "
                      "take as an attribute",
                      n.name, n.op_type, opset, k));
    const std::vector<int64_t> values = c.data->as_int64s();
    if (const char* name = f->attributes[static_cast<size_t>(k - 1)]) {
      set_attr(pn->add_attribute(), name, values);
    } else if (std::any_of(values.begin(), values.end(), [](int64_t x) { return x != 1; })) {
      throw InternalError(fmt::format("export: node '{}' (Slice) at opset {} has steps other than 1", n.name, opset));
    }
  }
  pn->mutable_input()->DeleteSubrange(1, pn->input_size() - 1);
}

void Exporter::copy_node(const Node& n) {
  auto* pn = pg->add_node();
  write_node(n, pn, value_names_);
  opset_form(n, pn);
  if (!n.domain.empty()) domains.insert(n.domain);
  if (is_collective(n)) {
    const CollectiveAttrs a = collective_attrs(n);
    const std::vector<int>& axes = checked(n, a.mesh_axes);
    const auto groups = p.mesh.replica_groups(axes);
    std::vector<int64_t> flat;
    for (const auto& grp : groups) flat.insert(flat.end(), grp.begin(), grp.end());
    set_attr(pn->add_attribute(), "replica_groups", flat);
    set_attr(pn->add_attribute(), "group_size", p.mesh.axes_size(axes));
    if (a.kind == Collective::kCollectivePermute) {
      const std::vector<int64_t> src = permute_sources(p.mesh, axes, a.shift, a.target_axes, a.wrap);
      std::vector<int64_t> pairs;
      for (const auto& grp : groups) {
        for (size_t t = 0; t < grp.size(); ++t) {
          if (src[t] < 0) continue;
          pairs.push_back(grp[static_cast<size_t>(src[t])]);
          pairs.push_back(grp[t]);
        }
      }
      set_attr(pn->add_attribute(), "source_target_pairs", pairs);
    }
  }
}

void Exporter::run(const std::string& path) {
  if (device < 0 || device >= p.mesh.num_devices())
    throw std::invalid_argument(
        fmt::format("export_device: device {} out of range (mesh has {})", device, p.mesh.num_devices()));
  m.set_ir_version(8);
  m.set_producer_name("gspmd-onnx");
  m.set_model_version(1);
  pg = m.mutable_graph();
  pg->set_name(fmt::format("{}_device_{}", G.name.empty() ? global.name : G.name, device));
  write_metadata();
  const std::unordered_set<int> io = write_interface();
  write_initializers();
  write_nodes(io);
  write_opsets();
  save(path);
}

void Exporter::write_metadata() {
  auto meta = [&](const std::string& k, const std::string& v) {
    auto* e = m.add_metadata_props();
    e->set_key(k);
    e->set_value(v);
  };
  meta("gspmd.device", std::to_string(device));
  meta("gspmd.num_devices", std::to_string(p.mesh.num_devices()));
  frontend::set_mesh_metadata(m, p.mesh);
  meta("gspmd.program_fingerprint", fmt::format("{:016x}", program_fingerprint(p)));
  if (!G.dim_hints.empty()) {  // a device file over the dim symbols (docs/shapes.md): the hints it was made at
    meta("gspmd.dim_hints", bindings_str(G.dim_hints, ","));
    std::string guards;  // what the model assumes of the dims (Graph::dim_guards): its ops check them at run time
    for (const auto& [a, b] : G.dim_guards)
      guards += fmt::format("{}{} == {}", guards.empty() ? "" : "; ", a.str(), b.str());
    if (!guards.empty()) meta("gspmd.dim_guards", guards);
  }
  {
    auto coords = p.mesh.coords(device);
    std::string c;
    for (size_t i = 0; i < coords.size(); ++i) c += (i ? "," : "") + std::to_string(coords[i]);
    meta("gspmd.device_coords", c);
  }
}

std::unordered_set<int> Exporter::write_interface() {
  for (const Value& v : G.values) names.insert(v.name);
  for (const Node& n : G.nodes) names.insert(n.name);
  value_names_ = value_names(G);

  std::unordered_set<int> io;
  for (int v : G.inputs) {
    set_value_info(pg->add_input(), G.values.at(v));
    io.insert(v);
  }
  // A training step's donated params (its weights and optimizer state) are inputs too, after the data inputs;
  // their initializers are the default values (ONNX IR >= 4). The updated values are outputs.
  for (const ProgramBinding& b : p.params)
    if (b.donated) set_value_info(pg->add_input(), G.values.at(b.local));
  for (int v : G.outputs) {
    set_value_info(pg->add_output(), G.values.at(v));
    io.insert(v);
  }
  return io;
}

void Exporter::write_initializers() {
  std::unordered_map<int, const ProgramBinding*> params;
  for (const auto& b : p.params) params[b.local] = &b;
  for (int v = 0; v < static_cast<int>(G.values.size()); ++v) {
    const Value& val = G.values[v];
    if (val.producer >= 0 || !val.is_initializer) continue;
    if (val.sym && val.sym->elems && val.sym->has_symbols()) {
      if (std::any_of(val.sym->elems->begin(), val.sym->elems->end(),
                      [&](const DimExpr& e) { return reads_runtime_dim(G, e); })) {
        pending_constants_.push_back(v);  // after the node that computes its size (after_node)
        continue;
      }
      emit_symbolic_constant(val);
      set_value_info(pg->add_value_info(), val);
      continue;
    }
    auto* init = pg->add_initializer();
    init->set_name(val.name);
    auto it = params.find(v);
    if (it != params.end()) {
      const ProgramBinding& b = *it->second;
      const Value& gv = global.values.at(b.global);
      if (!gv.data)
        throw InternalError(
            fmt::format("export: initializer '{}' has no data (the model was loaded without its weights)", gv.name));
      Tensor t = shard_tensor(*gv.data, b.sharding, p.mesh, device);
      if (t.shape != val.shape || t.dtype != val.dtype)
        throw InternalError(fmt::format("export: slice of '{}' for device {} is {} {} but the program expects {} {}",
                                        gv.name, device, dtype_name(t.dtype), shape_str(t.shape), dtype_name(val.dtype),
                                        shape_str(val.shape)));
      frontend::tensor_to_proto(t, init);
    } else {
      if (!val.data) throw InternalError(fmt::format("export: initializer '{}' has no data", val.name));
      frontend::tensor_to_proto(*val.data, init);
    }
  }
}

void Exporter::write_nodes(const std::unordered_set<int>& io) {
  for (const Node& n : G.nodes) {
    const std::optional<GspmdOp> op = gspmd_op(n);
    if (!op && n.domain == kGspmdDomain)
      throw InternalError(fmt::format("export: node '{}': unknown gspmd op '{}'", n.name, n.op_type));
    if (op && !is_collective(*op))
      specialise(n, *op);
    else if (op && options.collectives == CollectiveFormat::kOrt)
      lower_ort(n);
    else
      copy_node(n);
    for (int o : n.outputs)
      if (!io.count(o)) set_value_info(pg->add_value_info(), G.values.at(o));
    after_node(n);
  }
  if (!pending_constants_.empty())
    throw InternalError(fmt::format("export: constant '{}' reads a data-dependent dim no node computes",
                                    G.values[static_cast<size_t>(pending_constants_[0])].name));
}

void Exporter::write_opsets() {
  auto* os = m.add_opset_import();
  os->set_domain("");
  os->set_version(opset);
  if (options.collectives == CollectiveFormat::kGspmd || domains.count(kGspmdDomain)) {
    auto* og = m.add_opset_import();
    og->set_domain(kGspmdDomain);
    og->set_version(1);
  }
  if (ort_used) domains.insert(kOrtDomain);
  for (const auto& d : domains) {
    if (d == kGspmdDomain || d == "ai.onnx") continue;
    auto* o = m.add_opset_import();
    o->set_domain(d);
    o->set_version(1);
  }
}

void Exporter::save(const std::string& path) {
  // What another ONNX tool would check: the checker and strict shape inference, the collectives by their gspmd
  // schemas (gspmd_schemas.h). A failure is a bug of the exporter or the partitioner, not bad input.
  try {
    frontend::validate_model(m, path);
  } catch (const InputError& e) {
    throw InternalError(fmt::format("export: the device model fails ONNX validation: {}", e.what()));
  }
  const size_t size = m.ByteSizeLong();
  if (size > static_cast<size_t>(std::numeric_limits<int>::max()))
    throw UnsupportedError(fmt::format("{}: the device model is {} bytes, over protobuf's 2 GiB limit", path, size));
  std::string bytes;
  if (!m.SerializeToString(&bytes)) throw InternalError(fmt::format("{}: cannot serialize the model", path));
  m.Clear();
  frontend::write_file_atomic(path, bytes);
}

}  // namespace export_internal

using export_internal::Exporter;

void export_device(const SpmdProgram& p, const Graph& global, int64_t device, const std::string& path,
                   const ExportOptions& options) {
  Exporter e{p,       p.program, global,  device, global.opset > 0 ? global.opset : p.program.opset,
             options, {},        nullptr, {},     {},
             {},      {},        {},      {}};
  e.run(path);
}

}  // namespace gspmd
