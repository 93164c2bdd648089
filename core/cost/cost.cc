// core/cost: FLOPs/bytes per op, the alpha-beta collective model, simulated step time (the targets: target.cc).
// Formulas and the sources of every preset number: docs/cost-model.md.
#include "core/cost/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace gspmd {

// ---------------------------------------------------------------------------------------------------------------
// FLOPs and bytes
// ---------------------------------------------------------------------------------------------------------------
namespace {

const std::unordered_set<std::string>& elementwise_ops() {
  static const std::unordered_set<std::string> s = {
      "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Neg", "Abs", "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu",
      "Tanh", "Sigmoid", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "Exp", "Log", "Sqrt", "Reciprocal",
      "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Floor", "Ceil", "Round", "Sign", "Max",
      "Min", "Sum", "Mean", "Clip", "Where", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And",
      "Or", "Xor", "IsNaN", "IsInf", "BitShift", "Gelu", "Mish", "ThresholdedRelu", "QuickGelu"};
  return s;
}
const std::unordered_set<std::string>& normalization_ops() {
  static const std::unordered_set<std::string> s = {"Softmax", "LogSoftmax", "LayerNormalization", "Hardmax",
                                                    "InstanceNormalization", "GroupNormalization",
                                                    "SimplifiedLayerNormalization", "SkipLayerNormalization"};
  return s;
}
const std::unordered_set<std::string>& reduction_ops() {
  static const std::unordered_set<std::string> s = {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                                    "ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum",
                                                    "ReduceLogSumExp", "ArgMax", "ArgMin", "GlobalAveragePool",
                                                    "GlobalMaxPool", "CumSum"};
  return s;
}

const Value* val(const Graph& g, int id) {
  if (id < 0 || id >= static_cast<int>(g.values.size())) return nullptr;
  return &g.values[id];
}
double numel_of(const Graph& g, int id) {
  const Value* v = val(g, id);
  return v ? static_cast<double>(num_elements(v->shape)) : 0.0;
}
double bytes_of(const Graph& g, int id) {
  const Value* v = val(g, id);
  if (!v) return 0;
  size_t es = 0;
  try {
    es = dtype_size(v->dtype);
  } catch (const std::exception&) {
    es = 0;
  }
  return static_cast<double>(num_elements(v->shape)) * static_cast<double>(es);
}

}  // namespace

double node_flops(const Graph& g, const Node& n) {
  if (n.domain == kGspmdDomain) return 0;
  if (n.has_body()) return 0;  // control flow (If, Loop, Scan): not modelled (its trip count is data)
  const std::string& op = n.op_type;
  auto out_numel = [&]() { return n.outputs.empty() ? 0.0 : numel_of(g, n.outputs[0]); };
  auto in_numel = [&](size_t i) { return i < n.inputs.size() ? numel_of(g, n.inputs[i]) : 0.0; };
  if (op == "MatMul" || op == "MatMulInteger" || op == "FusedMatMul") {
    // out[..., M, N] = A[..., M, K] x B[..., K, N]: 2*K FLOPs per output element. 1-D A: K = A.shape[0].
    const Value* a = n.inputs.empty() ? nullptr : val(g, n.inputs[0]);
    if (!a || a->shape.empty()) return 0;
    double k = static_cast<double>(a->shape.back());
    return 2.0 * out_numel() * k;
  }
  if (op == "Gemm") {
    const Value* a = n.inputs.empty() ? nullptr : val(g, n.inputs[0]);
    if (!a || a->shape.size() != 2) return 0;
    double k = static_cast<double>(n.i("transA", 0) ? a->shape[0] : a->shape[1]);
    return 2.0 * out_numel() * k;  // the bias add (M*N) is not counted, as usual for 2*M*N*K
  }
  if (op == "Conv" || op == "ConvTranspose") {
    // 2 * (C/group * prod(kernel)) per output element; W = [O, C/group, k...] for Conv.
    const Value* w = n.inputs.size() > 1 ? val(g, n.inputs[1]) : nullptr;
    if (!w || w->shape.size() < 2) return 0;
    double per = 1;
    for (size_t i = 1; i < w->shape.size(); ++i) per *= static_cast<double>(w->shape[i]);
    if (op == "ConvTranspose") {
      // W = [C, O/group, k...]: each input element contributes O/group * prod(k) MACs.
      return 2.0 * in_numel(0) * per;
    }
    return 2.0 * out_numel() * per;
  }
  if (op == "Einsum") return 0;  // not modelled
  if (elementwise_ops().count(op)) {
    // n-ary Sum/Max/Min/Mean: (inputs - 1) operations per element; others 1.
    if ((op == "Sum" || op == "Max" || op == "Min" || op == "Mean") && n.inputs.size() > 2)
      return out_numel() * static_cast<double>(n.inputs.size() - 1);
    return out_numel();
  }
  if (normalization_ops().count(op)) return 5.0 * out_numel();
  if (op == "BatchNormalization") return 2.0 * out_numel();
  if (reduction_ops().count(op)) return in_numel(0);
  if (op == "MaxPool" || op == "AveragePool") {
    std::vector<int64_t> k = n.ints("kernel_shape");
    double per = 1;
    for (int64_t v : k) per *= static_cast<double>(v);
    return out_numel() * per;
  }
  return 0;  // data movement (Reshape, Transpose, Gather, Concat, Slice, Cast, ...) and unknown ops
}

double graph_flops(const Graph& g) {
  double s = 0;
  for (const Node& n : g.nodes) s += node_flops(g, n);
  return s;
}

double node_bytes(const Graph& g, const Node& n) {
  double s = 0;
  for (int v : n.inputs) s += bytes_of(g, v);
  for (int v : n.outputs) s += bytes_of(g, v);
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Collectives
// ---------------------------------------------------------------------------------------------------------------
namespace {

struct AxisLink {
  double n = 1;    // group size along this axis
  double bw = 0;   // ring bandwidth per device (bytes/s)
};

// Ring of mesh axis `a`: its size and bandwidth from the target's placement of the axis (Target::placement).
AxisLink axis_link(int a, const DeviceMesh& mesh, const Target& t) {
  return AxisLink{static_cast<double>(mesh.shape.at(static_cast<size_t>(a))), t.placement(a, mesh).ring_bandwidth};
}

// All-gather of a result of S bytes per device over the axes in the given order (first axis gathered first).
double gather_stages(double S, const std::vector<AxisLink>& order, double lat) {
  // Before stage i the per-device size is S / prod(n_j for j >= i).
  double time = 0;
  double rest = 1;
  for (const auto& l : order) rest *= l.n;
  double cur = S / rest;
  for (const auto& l : order) {
    double out = cur * l.n;
    time += (l.n - 1) / l.n * out / l.bw + (l.n - 1) * lat;
    cur = out;
  }
  return time;
}

}  // namespace

double collective_time(Collective kind, double bytes, const std::vector<int>& mesh_axes, const DeviceMesh& mesh,
                       const Target& t) {
  std::vector<AxisLink> links;
  for (int a : mesh_axes) {
    if (a < 0 || a >= mesh.rank())
      throw std::invalid_argument(fmt::format("collective_time: mesh axis {} out of range for mesh {}", a, mesh.str()));
    AxisLink l = axis_link(a, mesh, t);
    if (l.n > 1) links.push_back(l);
  }
  if (links.empty() || bytes <= 0) return 0;
  const double lat = t.link_latency;
  // all-gather / reduce-scatter (mirror image, same time): try every axis order (mesh rank is small).
  auto gather = [&] {
    std::vector<int> perm(links.size());
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(i);
    double best = std::numeric_limits<double>::infinity();
    do {
      std::vector<AxisLink> order;
      for (int i : perm) order.push_back(links[i]);
      best = std::min(best, gather_stages(bytes, order, lat));
    } while (perm.size() <= 6 && std::next_permutation(perm.begin(), perm.end()));
    return best;
  };
  switch (kind) {
    case Collective::kCollectivePermute: return bytes / t.link_bandwidth + lat;
    case Collective::kAllToAll: {
      double time = 0;
      for (const auto& l : links) time += std::floor(l.n * l.n / 4) / l.n * bytes / l.bw + (l.n - 1) * lat;
      return time;
    }
    case Collective::kAllGather:
    case Collective::kReduceScatter: return gather();
    case Collective::kAllReduce: return 2 * gather();
  }
  throw std::logic_error("collective_time: invalid Collective");
}

std::string op_signature(const Graph& g, const Node& n) {
  std::string s = n.domain.empty() || n.domain == "ai.onnx" ? n.op_type : n.domain + ":" + n.op_type;
  auto values = [&](const std::vector<int>& ids) {
    s += '(';
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) s += ',';
      if (ids[i] < 0) {
        s += '-';
        continue;
      }
      const Value& v = g.values[static_cast<size_t>(ids[i])];
      s += fmt::format("{}[{}]", dtype_name(v.dtype), fmt::join(v.shape, ","));
    }
    s += ')';
  };
  values(n.inputs);
  s += "->";
  values(n.outputs);
  s += '{';
  bool first = true;
  for (const auto& [name, a] : n.attrs) {  // std::map: by name
    if (!first) s += ',';
    first = false;
    s += name + '=';
    std::visit(
        [&](const auto& x) {
          using T = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<T, Tensor>)
            s += fmt::format("{}[{}]", dtype_name(x.dtype), fmt::join(x.shape, ","));
          else if constexpr (std::is_same_v<T, std::string>)
            s += x;
          else if constexpr (std::is_same_v<T, std::vector<std::string>>)
            s += fmt::format("[{}]", fmt::join(x, ","));
          else if constexpr (std::is_same_v<T, int64_t> || std::is_same_v<T, float>)
            s += fmt::format("{}", x);
          else if constexpr (std::is_same_v<T, std::shared_ptr<const Graph>>)
            s += fmt::format("graph({} nodes)", x->nodes.size());
          else
            s += fmt::format("[{}]", fmt::join(x, ","));
        },
        a);
  }
  s += '}';
  return s;
}

double node_time(const Graph& program, const Node& n, const DeviceMesh& mesh, const Target& t) {
  if (const std::optional<Collective> kind = collective_of(n)) {
    double b = 0;
    for (int v : n.inputs) b = std::max(b, bytes_of(program, v));
    for (int v : n.outputs) b = std::max(b, bytes_of(program, v));
    return collective_time(*kind, b, mesh_axes_attr(n), mesh, t);
  }
  if (!t.measured_ops.empty()) {
    auto it = t.measured_ops.find(op_signature(program, n));
    if (it != t.measured_ops.end()) return it->second;
  }
  double f = node_flops(program, n);
  double b = node_bytes(program, n);
  // The compute dtype is the first present input's (MatMulInteger: int8; Cast-like ops have no FLOPs anyway).
  DType dt = DType::kFloat32;
  for (int v : n.inputs)
    if (v >= 0) {
      dt = program.values[static_cast<size_t>(v)].dtype;
      break;
    }
  const std::string& op = n.op_type;
  const bool conv = op == "Conv" || op == "ConvTranspose";
  const bool contraction = conv || op == "MatMul" || op == "Gemm" || op == "Einsum" || op == "MatMulInteger";
  const double rate = contraction ? t.contraction_rate(f, dt, conv) : t.peak_for(dt);
  return std::max(rate > 0 ? f / rate : 0.0, t.hbm_bandwidth > 0 ? b / t.hbm_bandwidth : 0.0) + t.op_overhead;
}

int64_t static_peak_memory(const Graph& program) {
  const auto bytes = [&](int v) { return program.values[static_cast<size_t>(v)].nbytes(); };
  const int n = static_cast<int>(program.nodes.size());
  std::vector<int> last(program.values.size(), -1);  // index of the last node reading each value; n = kept to the end
  for (int i = 0; i < n; ++i)
    for (int v : program.nodes[static_cast<size_t>(i)].inputs)
      if (v >= 0) last[static_cast<size_t>(v)] = i;
  for (int v : program.outputs) last[static_cast<size_t>(v)] = n;
  int64_t live = 0;
  for (size_t v = 0; v < program.values.size(); ++v)
    if (program.values[v].is_initializer) {
      live += bytes(static_cast<int>(v));
      last[v] = n;  // weights and constants stay resident
    }
  for (int v : program.inputs) live += bytes(v);
  int64_t peak = live;
  for (int i = 0; i < n; ++i) {
    const Node& node = program.nodes[static_cast<size_t>(i)];
    for (int o : node.outputs)
      if (o >= 0) live += bytes(o);
    peak = std::max(peak, live);
    for (int o : node.outputs)  // results nobody reads are dropped at once
      if (o >= 0 && last[static_cast<size_t>(o)] < 0) live -= bytes(o);
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const int v = node.inputs[k];
      if (v < 0 || last[static_cast<size_t>(v)] != i) continue;
      if (std::find(node.inputs.begin(), node.inputs.begin() + static_cast<long>(k), v) !=
          node.inputs.begin() + static_cast<long>(k))
        continue;  // read twice by this node: freed once
      live -= bytes(v);
    }
  }
  return peak;
}

CostReport simulate_cost(const Graph& g, const SpmdProgram& p, const Target& t, bool overlap) {
  CostReport r;
  r.overlap = overlap;
  r.model_flops = graph_flops(g);
  const size_t n = p.program.nodes.size();
  r.node_time_s.assign(n, 0.0);
  r.node_start_s.assign(n, 0.0);
  std::vector<double> ready(p.program.values.size(), 0.0);  // when each value exists
  double free_at[2] = {0.0, 0.0};                             // compute stream, communication stream
  double end = 0;
  for (size_t i = 0; i < n; ++i) {
    const Node& node = p.program.nodes[i];
    const double dt = node_time(p.program, node, p.mesh, t);
    const bool coll = is_collective(node);
    r.node_time_s[i] = dt;
    (coll ? r.communication_time_s : r.compute_time_s) += dt;
    double start = end;  // without overlap: one stream
    if (overlap) {
      start = free_at[coll];
      for (int v : node.inputs)
        if (v >= 0) start = std::max(start, ready[static_cast<size_t>(v)]);
    }
    r.node_start_s[i] = start;
    for (int v : node.outputs)
      if (v >= 0) ready[static_cast<size_t>(v)] = start + dt;
    free_at[coll] = start + dt;
    end = std::max(end, start + dt);
  }
  r.step_time_s = overlap ? end : r.compute_time_s + r.communication_time_s;
  r.peak_memory_bytes = static_peak_memory(p.program);
  double devices = static_cast<double>(p.mesh.num_devices());
  if (r.step_time_s > 0 && t.peak_flops > 0)
    r.flops_utilization = r.model_flops / (devices * t.peak_flops * r.step_time_s);
  return r;
}

}  // namespace gspmd
