// Checking a case (random_graph.h): partitioned against single-device, the failure signature; dumping a case.
#include "tests/difftest/generator.h"

namespace gspmd::difftest {
namespace {

/// An attribute value as dump() writes it.
std::string attr_str(const AttrValue& a) {
  std::ostringstream os;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, float>)
          os << x;
        else if constexpr (std::is_same_v<T, std::string>)
          os << '"' << x << '"';
        else if constexpr (std::is_same_v<T, std::vector<int64_t>> || std::is_same_v<T, std::vector<float>>) {
          os << "[";
          for (size_t i = 0; i < x.size(); ++i) os << (i ? "," : "") << x[i];
          os << "]";
        } else
          os << "<...>";
      },
      a);
  return os.str();
}

}  // namespace

CheckResult check_case(const Graph& g, const Annotations& user_ann, const std::vector<Tensor>& inputs) {
  CheckResult r;
  std::vector<Tensor> ref;
  r.stage = "reference";
  try {
    ref = run_single(g, inputs).outputs;
    r.stage = "propagate";
    const Annotations ann = refine_for_reshapes(g, user_ann);  // sub-axes for reshapes, as the CLI does
    if (ann.mesh.is_refined()) r.sharded.push_back("refined-mesh");
    ShardingPlan plan = propagate(g, ann);
    r.stage = "invariant";
    for (size_t v = 0; v < g.values.size(); ++v)
      plan.shardings.at(v).verify(ann.mesh, static_cast<int>(g.values[v].shape.size()));
    for (const auto& [v, a] : ann.by_value)
      if (!(plan.shardings.at(static_cast<size_t>(v)) == a.sharding))
        throw std::runtime_error("annotated value '" + g.values[static_cast<size_t>(v)].name + "' propagated to " +
                                 plan.shardings[static_cast<size_t>(v)].to_partition_spec(ann.mesh) + ", annotation " +
                                 a.sharding.to_partition_spec(ann.mesh));
    r.stage = "partition";
    SpmdProgram p = partition(g, plan, ann.mesh);
    r.collectives = static_cast<int>(p.collectives.size());
    for (const Node& n : g.nodes) {
      bool any = false;
      for (const auto* l : {&n.inputs, &n.outputs})
        for (int v : *l)
          if (v >= 0) {
            const TensorSharding& t = p.final_shardings.at(static_cast<size_t>(v));
            any = any || t.is_tiled() || !t.unreduced.empty();
          }
      if (any) r.sharded.push_back("sharded:" + n.op_type);
      if ((n.op_type == "Conv" || n.op_type == "MaxPool" || n.op_type == "AveragePool") &&
          p.final_shardings.at(static_cast<size_t>(n.inputs[0])).rank() == 4) {
        const TensorSharding& t = p.final_shardings.at(static_cast<size_t>(n.inputs[0]));
        if (!t.dims[2].empty() || !t.dims[3].empty()) r.sharded.push_back("split-spatial:" + n.op_type);
      }
    }
    r.stage = "run_spmd";
    PodRun got = run_spmd(p, g, inputs);
    r.stage = "compare";
    if (got.outputs.size() != ref.size()) {
      r.status = CheckResult::kFail;
      r.why = "wrong number of outputs";
      return r;
    }
    for (size_t o = 0; o < ref.size(); ++o) {
      std::string d = testing::compare_tensors(got.outputs[o], ref[o]);
      if (!d.empty()) {
        const int v = g.outputs[o];
        r.why += (r.why.empty() ? "" : "; ") + std::string("output ") + g.values[static_cast<size_t>(v)].name + " (" +
                 plan.shardings[static_cast<size_t>(v)].to_partition_spec(ann.mesh) + " -> final " +
                 p.final_shardings[static_cast<size_t>(v)].to_partition_spec(ann.mesh) + "): " + d;
      }
    }
    if (!r.why.empty()) r.status = CheckResult::kFail;
  } catch (const UnsupportedError& e) {
    r.status = CheckResult::kUnsupported;
    r.why = e.what();
  } catch (const std::exception& e) {
    r.status = CheckResult::kFail;
    r.why = std::string("exception in ") + r.stage + ": " + e.what();
  }
  return r;
}
std::string failure_signature(const CheckResult& r) {
  std::string s = r.stage + ":";
  if (r.stage == "compare") return s;
  bool quote = false;
  for (char ch : r.why) {
    if (ch == '\'') {
      quote = !quote;
      continue;
    }
    if (quote || std::isdigit(static_cast<unsigned char>(ch))) continue;
    s += ch;
    if (s.size() > 80) break;
  }
  return s;
}
std::string dump(const Graph& g, const Annotations& ann) {
  std::ostringstream os;
  auto vd = [&](int v) {
    const Value& x = g.values[static_cast<size_t>(v)];
    return x.name + ": " + std::string(dtype_name(x.dtype)) + shape_str(x.shape);
  };
  auto annot = [&](int v) -> std::string {
    auto it = ann.by_value.find(v);
    if (it == ann.by_value.end()) return "";
    const TensorSharding& t = it->second.sharding;
    std::string r = "   @ " + t.to_partition_spec(ann.mesh);
    if (t.unreduced.empty() && t.reduction != ReductionKind::kSum)
      r += " reduction=" + std::string(reduction_name(t.reduction)) + " (nothing unreduced)";
    if (it->second.priority) r += " priority=" + std::to_string(it->second.priority);
    return r;
  };
  os << "  mesh " << ann.mesh.str() << " (" << ann.mesh.num_devices() << " devices), opset " << g.opset << "\n";
  for (int v : g.inputs) os << "  input  " << vd(v) << annot(v) << "\n";
  for (int v = 0; v < static_cast<int>(g.values.size()); ++v) {
    const Value& x = g.values[static_cast<size_t>(v)];
    if (!x.is_initializer) continue;
    os << "  init   " << vd(v);
    if (x.data && x.dtype == DType::kInt64) {
      os << " = {";
      auto d = x.data->as_int64s();
      for (size_t i = 0; i < d.size(); ++i) os << (i ? "," : "") << d[i];
      os << "}";
    } else if (x.data && x.dtype == DType::kFloat32 && x.data->numel() == 1) {
      os << " = " << x.data->data<float>()[0];
    }
    os << annot(v) << "\n";
  }
  for (const Node& n : g.nodes) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) os << (i ? ", " : "") << vd(n.outputs[i]);
    os << " = " << n.op_type << "(";
    for (size_t i = 0; i < n.inputs.size(); ++i)
      os << (i ? ", " : "")
         << (n.inputs[i] < 0 ? std::string("<none>") : g.values[static_cast<size_t>(n.inputs[i])].name);
    os << ")";
    if (!n.attrs.empty()) {
      os << " {";
      bool first = true;
      for (const auto& [k, a] : n.attrs) os << (first ? "" : ", ") << k << "=" << attr_str(a), first = false;
      os << "}";
    }
    for (int o : n.outputs) os << annot(o);
    os << "\n";
  }
  os << "  outputs:";
  for (int v : g.outputs) os << " " << g.values[static_cast<size_t>(v)].name;
  os << "\n  annotations:";
  if (ann.by_value.empty()) os << " none";
  for (const auto& [v, a] : ann.by_value)
    os << " " << g.values[static_cast<size_t>(v)].name << "=" << a.sharding.to_partition_spec(ann.mesh);
  os << "\n";
  return os.str();
}
std::vector<std::string> coverage_keys(const RandomCase& c) {
  std::set<std::string> ops;
  for (const Node& n : c.g.nodes) ops.insert(n.op_type);
  std::vector<std::string> keys;
  for (const Node& n : c.g.nodes) keys.push_back(n.op_type);
  for (const std::string& t : c.tags) {
    auto colon = t.find(':');
    if (colon == std::string::npos) continue;  // plain op tags are counted from the graph
    std::string head = t.substr(0, colon);
    if (head == "mesh" || head == "ann" || ops.count(head) || head == "Sqrt") keys.push_back(t);
  }
  return keys;
}

}  // namespace gspmd::difftest
