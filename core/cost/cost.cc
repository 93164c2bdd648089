// core/cost: FLOPs/bytes per op, the alpha-beta collective model, simulated step time (the targets: target.cc).
// Formulas and the sources of every preset number: docs/cost-model.md.
#include "core/cost/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/ir/attrs.h"

namespace gspmd {

// ---------------------------------------------------------------------------------------------------------------
// FLOPs and bytes
// ---------------------------------------------------------------------------------------------------------------
namespace {

/// How the cost model counts one op (docs/cost-model.md, "FLOPs"): its FLOPs formula and whether it runs on the
/// matrix unit (a contraction: the target's contraction curve applies) or at the vector peak.
enum class Flops {
  kNone,           // data movement (Reshape, Transpose, Gather, ...), unknown ops
  kEinsum,         // 2 * (operands - 1) per point of the label space; one operand: 1 per input element
  kMatMul,         // 2*K per output element, K = A's last dim
  kGemm,           // 2*K per output element, K from transA; the bias add is not counted
  kConv,           // 2 * prod(W dims 1..) per output element
  kConvTranspose,  // 2 * prod(W dims 1..) per input element
  kElementwise,    // 1 per output element
  kVariadic,       // Sum/Max/Min/Mean: inputs - 1 per output element (at least 1)
  kNormalization,  // 5 per output element
  kBatchNorm,      // 2 per output element
  kReduction,      // 1 per input element
  kPool,           // prod(kernel_shape) per output element
};
enum class Unit { kVector, kMatrix, kConvolution };
struct OpCost {
  Flops flops = Flops::kNone;
  Unit unit = Unit::kVector;
};

/// The cost class of every op the model counts, by op type (any domain but `gspmd`); others count no FLOPs.
const std::unordered_map<std::string, OpCost>& op_costs() {
  static const std::unordered_map<std::string, OpCost> t = [] {
    std::unordered_map<std::string, OpCost> m;
    for (const char* op : {"Add",         "Sub",
                           "Mul",         "Div",
                           "Pow",         "Mod",
                           "Neg",         "Abs",
                           "Relu",        "LeakyRelu",
                           "PRelu",       "Elu",
                           "Selu",        "Celu",
                           "Tanh",        "Sigmoid",
                           "HardSigmoid", "HardSwish",
                           "Softplus",    "Softsign",
                           "Exp",         "Log",
                           "Sqrt",        "Reciprocal",
                           "Erf",         "Sin",
                           "Cos",         "Tan",
                           "Asin",        "Acos",
                           "Atan",        "Sinh",
                           "Cosh",        "Floor",
                           "Ceil",        "Round",
                           "Sign",        "Clip",
                           "Where",       "Equal",
                           "Less",        "LessOrEqual",
                           "Greater",     "GreaterOrEqual",
                           "Not",         "And",
                           "Or",          "Xor",
                           "IsNaN",       "IsInf",
                           "BitShift",    "Gelu",
                           "Mish",        "ThresholdedRelu",
                           "QuickGelu"})
      m[op] = {Flops::kElementwise, Unit::kVector};
    for (const char* op : {"Softmax", "LogSoftmax", "LayerNormalization", "Hardmax", "InstanceNormalization",
                           "GroupNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization"})
      m[op] = {Flops::kNormalization, Unit::kVector};
    for (const char* op :
         {"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare",
          "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "GlobalAveragePool", "GlobalMaxPool", "CumSum"})
      m[op] = {Flops::kReduction, Unit::kVector};
    for (const char* op : {"Sum", "Max", "Min", "Mean"}) m[op] = {Flops::kVariadic, Unit::kVector};
    m["MatMul"] = m["MatMulInteger"] = {Flops::kMatMul, Unit::kMatrix};
    m["FusedMatMul"] = {Flops::kMatMul, Unit::kVector};  // counted like MatMul, priced at the vector peak
    m["Gemm"] = {Flops::kGemm, Unit::kMatrix};
    m["Einsum"] = {Flops::kEinsum, Unit::kMatrix};
    m["Conv"] = {Flops::kConv, Unit::kConvolution};
    m["ConvTranspose"] = {Flops::kConvTranspose, Unit::kConvolution};
    m["BatchNormalization"] = {Flops::kBatchNorm, Unit::kVector};
    m["MaxPool"] = m["AveragePool"] = {Flops::kPool, Unit::kVector};
    return m;
  }();
  return t;
}

OpCost op_cost(const Node& n) {
  if (n.domain == kGspmdDomain) return {};
  auto it = op_costs().find(n.op_type);
  return it == op_costs().end() ? OpCost{} : it->second;
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

/// The number of points of an Einsum's label space: the product of its labels' sizes (ONNX Einsum; an ellipsis
/// stands for the operands' right-aligned leading dims, a size-1 dim broadcasts). 0 when the equation does not parse.
double einsum_points(const Graph& g, const Node& n) {
  std::string eq;
  for (char ch : n.s("equation"))
    if (ch != ' ') eq += ch;
  const std::string lhs = eq.substr(0, eq.find("->"));
  std::unordered_map<int, int64_t> size;  // letter, or 256 + position from the right of an ellipsis dim
  size_t begin = 0;
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const size_t end = std::min(lhs.find(',', begin), lhs.size());
    const Value* v = val(g, n.inputs[i]);
    if (!v || begin > lhs.size()) return 0;
    const std::string term = lhs.substr(begin, end - begin);
    begin = end + 1;
    const size_t dots = term.find("...");
    const size_t letters = term.size() - (dots == std::string::npos ? 0 : 3);
    if (v->shape.size() < letters) return 0;
    const size_t ell = v->shape.size() - letters, after = dots == std::string::npos ? term.size() : dots;
    size_t d = 0;
    auto take = [&](int label) { size[label] = std::max(size[label], v->shape[d++]); };
    for (size_t k = 0; k < after; ++k) take(static_cast<unsigned char>(term[k]));
    for (size_t e = 0; e < ell; ++e) take(256 + static_cast<int>(ell - e));
    for (size_t k = after + 3; k < term.size(); ++k) take(static_cast<unsigned char>(term[k]));
  }
  double points = 1;
  for (const auto& [label, s] : size) points *= static_cast<double>(s);
  return points;
}

}  // namespace

double node_flops(const Graph& g, const Node& n) {
  if (n.has_body()) return 0;  // control flow (If, Loop, Scan): not modelled (its trip count is data)
  auto out_numel = [&]() { return n.outputs.empty() ? 0.0 : numel_of(g, n.outputs[0]); };
  auto in_numel = [&](size_t i) { return i < n.inputs.size() ? numel_of(g, n.inputs[i]) : 0.0; };
  const Value* a = n.inputs.empty() ? nullptr : val(g, n.inputs[0]);
  // Products of W's dims 1..: C/group * prod(kernel) for Conv (W = [O, C/group, k...]), O/group * prod(kernel) for
  // ConvTranspose (W = [C, O/group, k...]); 0 without a weight of rank >= 2.
  auto per_weight = [&]() {
    const Value* w = n.inputs.size() > 1 ? val(g, n.inputs[1]) : nullptr;
    if (!w || w->shape.size() < 2) return 0.0;
    double per = 1;
    for (size_t i = 1; i < w->shape.size(); ++i) per *= static_cast<double>(w->shape[i]);
    return per;
  };
  switch (op_cost(n).flops) {
    case Flops::kNone: return 0;
    case Flops::kEinsum:
      return n.inputs.size() < 2 ? in_numel(0) : 2.0 * static_cast<double>(n.inputs.size() - 1) * einsum_points(g, n);
    case Flops::kMatMul:  // out[..., M, N] = A[..., M, K] x B[..., K, N]; 1-D A: K = A.shape[0]
      return a && !a->shape.empty() ? 2.0 * out_numel() * static_cast<double>(a->shape.back()) : 0.0;
    case Flops::kGemm:
      if (!a || a->shape.size() != 2) return 0;
      return 2.0 * out_numel() * static_cast<double>(n.i("transA", 0) ? a->shape[0] : a->shape[1]);
    case Flops::kConv: return 2.0 * out_numel() * per_weight();
    case Flops::kConvTranspose: return 2.0 * in_numel(0) * per_weight();
    case Flops::kElementwise: return out_numel();
    case Flops::kVariadic:
      return n.inputs.size() > 2 ? out_numel() * static_cast<double>(n.inputs.size() - 1) : out_numel();
    case Flops::kNormalization: return 5.0 * out_numel();
    case Flops::kBatchNorm: return 2.0 * out_numel();
    case Flops::kReduction: return in_numel(0);
    case Flops::kPool: {
      double per = 1;
      for (int64_t v : n.ints("kernel_shape")) per *= static_cast<double>(v);
      return out_numel() * per;
    }
  }
  return 0;
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
  double n = 1;    // group size along this axis (or level)
  double bw = 0;   // ring bandwidth per device (bytes/s)
  double lat = 0;  // per ring step (s)
};

// Ring of mesh axis `a`: its size and bandwidth from the target's placement of the axis (Target::placement).
AxisLink axis_link(int a, const DeviceMesh& mesh, const Target& t) {
  return AxisLink{static_cast<double>(mesh.shape.at(static_cast<size_t>(a))), t.placement(a, mesh).ring_bandwidth,
                  t.link_latency};
}

// All-gather of a result of S bytes per device over the links in the given order (first link gathered first).
double gather_stages(double S, const std::vector<AxisLink>& order) {
  // Before stage i the per-device size is S / prod(n_j for j >= i).
  double time = 0;
  double rest = 1;
  for (const auto& l : order) rest *= l.n;
  double cur = S / rest;
  for (const auto& l : order) {
    double out = cur * l.n;
    time += (l.n - 1) / l.n * out / l.bw + (l.n - 1) * l.lat;
    cur = out;
  }
  return time;
}

// All-gather (or its mirror image, reduce-scatter) of S bytes over `links`, in the cheapest order (few links).
double cheapest_gather(double S, const std::vector<AxisLink>& links) {
  std::vector<size_t> perm(links.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = i;
  double best = std::numeric_limits<double>::infinity();
  do {
    std::vector<AxisLink> order;
    for (size_t i : perm) order.push_back(links[i]);
    best = std::min(best, gather_stages(S, order));
  } while (perm.size() <= 6 && std::next_permutation(perm.begin(), perm.end()));
  return best;
}

// GPU clusters (Target::devices_per_node > 0): how the replica groups of a collective over `mesh_axes` lie on the
// nodes. k: the most devices of one group on one node; m: the most nodes one group spans. Device ids are those of
// DeviceMesh::replica_groups. O(devices).
struct NodeSpread {
  double k = 1, m = 1;
};
NodeSpread node_spread_of_groups(const std::vector<int>& mesh_axes, const DeviceMesh& mesh, int64_t per_node) {
  NodeSpread s;
  std::unordered_map<int64_t, int64_t> on_node;  // node -> devices of the group on it
  for (const std::vector<int64_t>& group : mesh.replica_groups(mesh_axes)) {
    on_node.clear();
    for (int64_t d : group) ++on_node[d / per_node];
    s.m = std::max(s.m, static_cast<double>(on_node.size()));
    for (const auto& [node, count] : on_node) s.k = std::max(s.k, static_cast<double>(count));
  }
  return s;
}

// node_spread_of_groups, remembered per thread for meshes in the identity device order (the spread depends only on
// the shape, the axes' parts and the node size then): a step has thousands of collectives over a few axis sets, and
// walking 2048 devices for each would make costing a plan grow with the device count.
NodeSpread node_spread(const std::vector<int>& mesh_axes, const DeviceMesh& mesh, int64_t per_node) {
  if (mesh.has_device_order()) return node_spread_of_groups(mesh_axes, mesh, per_node);
  std::vector<int64_t> key = mesh.shape;
  key.push_back(-1);
  for (const DeviceMesh::SubAxis& a : mesh.sub) key.insert(key.end(), {a.parent, a.pre});
  key.push_back(-1);
  key.insert(key.end(), mesh_axes.begin(), mesh_axes.end());
  key.push_back(per_node);
  thread_local std::map<std::vector<int64_t>, NodeSpread> memo;
  auto it = memo.find(key);
  if (it == memo.end()) {
    if (memo.size() > 4096) memo.clear();  // bounded: meshes come and go over a long search
    it = memo.emplace(std::move(key), node_spread_of_groups(mesh_axes, mesh, per_node)).first;
  }
  return it->second;
}

// A collective whose groups span nodes (docs/cost-model.md, "GPU clusters"): two levels, k devices per node on the
// node's switch and m nodes on the network, one NIC per device (each of a node's k devices talks to its peers on
// the other nodes over its own NIC, all in parallel).
double across_nodes_time(Collective kind, double S, const NodeSpread& sp, const Target& t) {
  const AxisLink node{sp.k, t.switch_bandwidth(), t.link_latency};
  const AxisLink net{sp.m, t.network_bandwidth, t.network_latency};
  std::vector<AxisLink> levels;
  for (const AxisLink& l : {node, net})
    if (l.n > 1) levels.push_back(l);
  switch (kind) {
    case Collective::kCollectivePermute: return S / net.bw + net.lat;
    case Collective::kAllToAll:
      // Of a device's S bytes, (k-1)/(k m) stay on its node and (m-1)/m leave it through its NIC.
      return (node.n - 1) / (node.n * net.n) * S / node.bw + (node.n - 1) * node.lat +
             (net.n - 1) / net.n * S / net.bw + (net.n - 1) * net.lat;
    case Collective::kAllGather:
    case Collective::kReduceScatter: return cheapest_gather(S, levels);
    case Collective::kAllReduce: return 2 * cheapest_gather(S, levels);
  }
  throw InternalError("collective_time: invalid Collective");
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
  if (t.devices_per_node > 0) {
    const NodeSpread sp = node_spread(mesh_axes, mesh, t.devices_per_node);
    if (sp.m > 1) return across_nodes_time(kind, bytes, sp, t);
  }
  const bool on_switch = t.torus_dims == 0;
  switch (kind) {
    case Collective::kCollectivePermute:
      return bytes / (on_switch ? t.switch_bandwidth() : t.link_bandwidth) + t.link_latency;
    case Collective::kAllToAll: {
      double time = 0;
      for (const auto& l : links) {
        // a ring: the traffic crossing its bisection; a switch: what each device sends to the others
        const double share = on_switch ? (l.n - 1) / l.n : std::floor(l.n * l.n / 4) / l.n;
        time += share * bytes / l.bw + (l.n - 1) * l.lat;
      }
      return time;
    }
    case Collective::kAllGather:
    case Collective::kReduceScatter: return cheapest_gather(bytes, links);
    case Collective::kAllReduce: return 2 * cheapest_gather(bytes, links);
  }
  throw InternalError("collective_time: invalid Collective");
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
    s += name + '=' + attr_text(a);
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
  const Unit unit = op_cost(n).unit;
  const double rate = unit == Unit::kVector ? t.peak_for(dt) : t.contraction_rate(f, dt, unit == Unit::kConvolution);
  return std::max(rate > 0 ? f / rate : 0.0, t.hbm_bandwidth > 0 ? b / t.hbm_bandwidth : 0.0) + t.op_overhead;
}

std::string_view memory_kind_name(MemoryKind k) {
  switch (k) {
    case MemoryKind::kWeights: return "weights";
    case MemoryKind::kGradients: return "gradients";
    case MemoryKind::kOptimizerState: return "optimizer_state";
    case MemoryKind::kSavedActivations: return "saved_activations";
    case MemoryKind::kInputs: return "inputs";
    case MemoryKind::kTransient: return "transient";
  }
  return "transient";
}

int MemoryRoles::phase(int n) const {
  auto it = std::upper_bound(forward_ranges.begin(), forward_ranges.end(), n,
                             [](int x, const std::pair<int, int>& r) { return x < r.first; });
  if (n < 0 || it == forward_ranges.begin()) return -1;
  --it;
  const int m = static_cast<int>(it - forward_ranges.begin());
  return n < it->second ? 2 * m : 2 * m + 1;
}

MemoryBreakdown memory_breakdown(const SpmdProgram& p, const MemoryRoles* roles) {
  const Graph& program = p.program;
  const size_t nv = program.values.size();
  const int n = static_cast<int>(program.nodes.size());
  const auto bytes = [&](int v) { return program.values[static_cast<size_t>(v)].nbytes(); };
  const auto origin = [&](int v) { return static_cast<size_t>(v) < p.value_origin.size() ? p.value_origin[v] : -1; };
  const auto node_origin = [&](int i) { return static_cast<size_t>(i) < p.node_origin.size() ? p.node_origin[i] : -1; };
  const auto backward = [&](int i) {  // node i belongs to a backward pass or the update
    const int o = node_origin(i);
    return roles && o >= 0 && roles->forward_pass(o) < 0;
  };
  std::vector<int> last(nv, -1);  // index of the last node reading each value; n = kept to the end
  std::vector<char> read_late(nv, 0), param(nv, 0), donated(nv, 0);
  for (int i = 0; i < n; ++i)
    for (int v : program.nodes[static_cast<size_t>(i)].inputs)
      if (v >= 0) {
        last[static_cast<size_t>(v)] = i;
        read_late[static_cast<size_t>(v)] |= static_cast<char>(backward(i));
      }
  for (const ProgramBinding& b : p.params) {
    param[static_cast<size_t>(b.local)] = 1;
    donated[static_cast<size_t>(b.local)] = b.donated;
  }
  std::vector<MemoryKind> kind(nv, MemoryKind::kTransient);
  for (size_t v = 0; v < nv; ++v) {
    const Value& val = program.values[v];
    const int o = origin(static_cast<int>(v));
    const MemoryKind role = roles && o >= 0 && static_cast<size_t>(o) < roles->kind.size()
                                ? roles->kind[static_cast<size_t>(o)]
                                : MemoryKind::kTransient;
    if (val.is_initializer) {
      kind[v] = MemoryKind::kWeights;
      if (role == MemoryKind::kOptimizerState) kind[v] = role;
    } else if (role == MemoryKind::kGradients || role == MemoryKind::kOptimizerState) {
      kind[v] = role;
    } else if (role == MemoryKind::kWeights && !param[v] && o >= 0 && !roles->donated[static_cast<size_t>(o)]) {
      kind[v] = MemoryKind::kWeights;  // an updated weight (a weight's other copies are transient)
    } else if (val.producer >= 0 && roles && !backward(val.producer) && read_late[v]) {
      kind[v] = MemoryKind::kSavedActivations;
    }
  }
  for (int v : program.inputs) {  // data and labels; a variable (a trained graph input) and its state by role
    const int o = origin(v);
    const MemoryKind role = roles && o >= 0 && static_cast<size_t>(o) < roles->kind.size()
                                ? roles->kind[static_cast<size_t>(o)]
                                : MemoryKind::kTransient;
    kind[static_cast<size_t>(v)] =
        role == MemoryKind::kWeights || role == MemoryKind::kOptimizerState ? role : MemoryKind::kInputs;
  }

  MemoryBreakdown r;
  std::array<int64_t, kMemoryKinds> live{};
  const auto add = [&](int v, int sign) { live[static_cast<size_t>(kind[static_cast<size_t>(v)])] += sign * bytes(v); };
  for (int v : program.outputs) last[static_cast<size_t>(v)] = n;
  // Totals: the trained weights' and optimizer state's params (every weight and constant without roles), each
  // gradient once (its smallest copy), the saved activations and the inputs.
  const auto total = [&](MemoryKind k) -> int64_t& { return r.total[static_cast<size_t>(k)]; };
  for (const ProgramBinding& b : p.params) {
    const MemoryKind role = roles ? roles->kind[static_cast<size_t>(b.global)] : MemoryKind::kWeights;
    if (role == MemoryKind::kWeights || role == MemoryKind::kOptimizerState) total(role) += bytes(b.local);
  }
  std::vector<int64_t> smallest(roles ? roles->kind.size() : 0, -1);  // per gradient: its smallest copy's bytes
  for (size_t v = 0; v < nv; ++v) {
    const int o = origin(static_cast<int>(v));
    const bool partial = roles && o >= 0 && static_cast<size_t>(o) < roles->partial.size() && roles->partial[o];
    if (kind[v] == MemoryKind::kGradients && !partial) {
      int64_t& b = smallest[static_cast<size_t>(o)];
      b = b < 0 ? bytes(static_cast<int>(v)) : std::min(b, bytes(static_cast<int>(v)));
    }
    if (kind[v] == MemoryKind::kSavedActivations || kind[v] == MemoryKind::kInputs)
      total(kind[v]) += bytes(static_cast<int>(v));
  }
  for (int v : program.inputs)  // the variables and their state
    if (kind[static_cast<size_t>(v)] != MemoryKind::kInputs) total(kind[static_cast<size_t>(v)]) += bytes(v);
  for (int64_t b : smallest) total(MemoryKind::kGradients) += std::max<int64_t>(b, 0);
  for (size_t v = 0; v < nv; ++v) {
    if (!program.values[v].is_initializer) continue;
    add(static_cast<int>(v), 1);
    if (!donated[v]) last[v] = n;  // weights and constants stay resident
  }
  for (int v : program.inputs) add(v, 1);
  const auto sum = [](const std::array<int64_t, kMemoryKinds>& a) {
    int64_t t = 0;
    for (int64_t x : a) t += x;
    return t;
  };
  r.at_peak = live;
  r.peak_bytes = sum(live);
  for (int i = 0; i < n; ++i) {
    const Node& node = program.nodes[static_cast<size_t>(i)];
    for (int o : node.outputs)
      if (o >= 0) add(o, 1);
    if (const int64_t now = sum(live); now > r.peak_bytes) {
      r.peak_bytes = now;
      r.at_peak = live;
      r.peak_node = i;
    }
    for (int o : node.outputs)  // results nobody reads are dropped at once
      if (o >= 0 && last[static_cast<size_t>(o)] < 0) add(o, -1);
    for (size_t k = 0; k < node.inputs.size(); ++k) {
      const int v = node.inputs[k];
      if (v < 0 || last[static_cast<size_t>(v)] != i) continue;
      if (std::find(node.inputs.begin(), node.inputs.begin() + static_cast<long>(k), v) !=
          node.inputs.begin() + static_cast<long>(k))
        continue;  // read twice by this node: freed once
      add(v, -1);
    }
  }
  return r;
}

CostReport simulate_cost(const Graph& g, const SpmdProgram& p, const Target& t, bool overlap,
                         const MemoryRoles* roles) {
  CostReport r;
  r.overlap = overlap;
  r.model_flops = graph_flops(g);
  const size_t n = p.program.nodes.size();
  r.node_time_s.assign(n, 0.0);
  r.node_start_s.assign(n, 0.0);
  std::vector<double> ready(p.program.values.size(), 0.0);  // when each value exists
  double free_at[2] = {0.0, 0.0};                           // compute stream, communication stream
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
  r.memory = memory_breakdown(p, roles);
  r.peak_memory_bytes = r.memory.peak_bytes;
  double devices = static_cast<double>(p.mesh.num_devices());
  if (r.step_time_s > 0 && t.peak_flops > 0)
    r.flops_utilization = r.model_flops / (devices * t.peak_flops * r.step_time_s);
  return r;
}

}  // namespace gspmd
