// core/cost: FLOPs/bytes per op, targets, alpha-beta collective model, simulated step time.
// Formulas and the sources of every preset number: docs/cost-model.md.
#include "core/cost/cost.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_set>

#include <fmt/format.h>

namespace gspmd {

// ---------------------------------------------------------------------------------------------------------------
// Targets
// ---------------------------------------------------------------------------------------------------------------
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// See docs/cost-model.md for the sources and derivations.
Target preset_v3() {
  Target t;
  t.name = "tpu-v3";
  t.peak_flops = 123e12 / 2;           // 123 TFLOP/s bf16 per chip, 2 TensorCores per chip; a device is a core
  t.hbm_bytes = 32 * kGiB / 2;         // 32 GiB per chip
  t.hbm_bandwidth = 900e9 / 2;         // 900 GB/s per chip
  t.link_bandwidth = 340e12 / 1024 / 4 / 2;  // all-reduce BW per pod / chips / ICI ports, shared by the 2 cores
  t.link_latency = 1e-6;
  t.wraparound = true;
  t.links_per_axis = 2;
  t.torus_dims = 2;
  return t;
}

Target preset_v4() {
  Target t;
  t.name = "tpu-v4";
  t.peak_flops = 275e12;               // per chip (megacore: one device per chip)
  t.hbm_bytes = 32 * kGiB;
  t.hbm_bandwidth = 1200e9;
  t.link_bandwidth = 1.1e15 / 4096 / 6;  // all-reduce BW per pod / chips / 6 ICI ports = 44.8 GB/s
  t.link_latency = 1e-6;
  t.wraparound = true;
  t.links_per_axis = 2;
  t.torus_dims = 3;
  return t;
}

Target preset_v5e() {
  Target t;
  t.name = "tpu-v5e";
  t.peak_flops = 197e12;
  t.hbm_bytes = 16 * kGiB;
  t.hbm_bandwidth = 819e9;
  t.link_bandwidth = 400e9 / 4 / 2;    // 400 GB/s bidirectional ICI per chip, 4 ports, 2 directions = 50 GB/s
  t.link_latency = 1e-6;
  t.wraparound = true;
  t.links_per_axis = 2;
  t.torus_dims = 2;
  return t;
}

// ---- a tiny flat JSON object reader: {"key": number | "string" | true | false, ...} ----
struct FlatJson {
  struct Item {
    std::string key;
    enum Kind { kNumber, kString, kBool } kind;
    double num = 0;
    std::string str;
    bool b = false;
  };
  std::vector<Item> items;
};

class FlatParser {
 public:
  explicit FlatParser(const std::string& s) : s_(s) {}

  FlatJson parse() {
    FlatJson out;
    ws();
    expect('{');
    ws();
    if (peek() == '}') {
      ++i_;
    } else {
      for (;;) {
        ws();
        FlatJson::Item it;
        it.key = string();
        ws();
        expect(':');
        ws();
        char c = peek();
        if (c == '"') {
          it.kind = FlatJson::Item::kString;
          it.str = string();
        } else if (c == 't' || c == 'f') {
          it.kind = FlatJson::Item::kBool;
          it.b = word();
        } else {
          it.kind = FlatJson::Item::kNumber;
          it.num = number();
        }
        out.items.push_back(std::move(it));
        ws();
        if (peek() == ',') { ++i_; continue; }
        expect('}');
        break;
      }
    }
    ws();
    if (i_ != s_.size()) fail("trailing characters after the JSON object");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const {
    throw std::runtime_error(fmt::format("{} (at offset {})", why, i_));
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++i_;
  }
  std::string string() {
    expect('"');
    std::string out;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c == '\\') {
        if (i_ >= s_.size()) fail("unterminated string");
        char e = s_[i_++];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case 'r': out += '\r'; break;
          case 'b': out += '\b'; break;
          case 'f': out += '\f'; break;
          case 'u': fail("\\u escapes are not supported");
          default: out += e;
        }
      } else {
        out += c;
      }
    }
    expect('"');
    return out;
  }
  bool word() {
    if (s_.compare(i_, 4, "true") == 0) { i_ += 4; return true; }
    if (s_.compare(i_, 5, "false") == 0) { i_ += 5; return false; }
    fail("expected a number, a string, true or false");
  }
  double number() {
    size_t start = i_;
    while (i_ < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[i_])) || s_[i_] == '-' || s_[i_] == '+' ||
                              s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
      ++i_;
    if (start == i_) fail("expected a number, a string, true or false");
    std::string tok = s_.substr(start, i_ - start);
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != tok.size()) { i_ = start; fail(fmt::format("bad number '{}'", tok)); }
    return v;
  }

  const std::string& s_;
  size_t i_ = 0;
};

bool file_exists(const std::string& p) {
  std::ifstream f(p);
  return f.good();
}

Target load_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InputError(fmt::format("{}: cannot open target file", path));
  std::stringstream ss;
  ss << f.rdbuf();
  std::string text = ss.str();
  FlatJson js;
  try {
    js = FlatParser(text).parse();
  } catch (const std::exception& e) {
    throw InputError(fmt::format("{}: {}", path, e.what()));
  }
  Target t;
  // stem of the file name as the default name
  {
    std::string base = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
    if (base.size() > 5 && base.ends_with(".json")) base.resize(base.size() - 5);
    t.name = base;
  }
  for (const auto& it : js.items) {
    if (it.key == "base") {
      if (it.kind != FlatJson::Item::kString) throw InputError(fmt::format("{}: 'base' must be a string", path));
      std::string keep = t.name;
      if (it.str == "tpu-v3") t = preset_v3();
      else if (it.str == "tpu-v4") t = preset_v4();
      else if (it.str == "tpu-v5e") t = preset_v5e();
      else throw InputError(fmt::format("{}: unknown base target '{}' (known: tpu-v3, tpu-v4, tpu-v5e)", path, it.str));
      t.name = keep;
    }
  }
  auto num = [&](const FlatJson::Item& it) {
    if (it.kind != FlatJson::Item::kNumber)
      throw InputError(fmt::format("{}: field '{}' must be a number", path, it.key));
    if (!std::isfinite(it.num) || it.num < 0)
      throw InputError(fmt::format("{}: field '{}' must be a finite number >= 0", path, it.key));
    return it.num;
  };
  for (const auto& it : js.items) {
    const std::string& k = it.key;
    if (k == "base") continue;
    if (k == "name") {
      if (it.kind != FlatJson::Item::kString) throw InputError(fmt::format("{}: 'name' must be a string", path));
      t.name = it.str;
    } else if (k == "peak_flops") t.peak_flops = num(it);
    else if (k == "hbm_bytes") t.hbm_bytes = num(it);
    else if (k == "hbm_bandwidth") t.hbm_bandwidth = num(it);
    else if (k == "link_bandwidth") t.link_bandwidth = num(it);
    else if (k == "link_latency") t.link_latency = num(it);
    else if (k == "wraparound") {
      if (it.kind != FlatJson::Item::kBool) throw InputError(fmt::format("{}: 'wraparound' must be true or false", path));
      t.wraparound = it.b;
    } else if (k == "links_per_axis" || k == "torus_dims") {
      double v = num(it);
      if (v < 1 || v != std::floor(v) || v > 64)
        throw InputError(fmt::format("{}: field '{}' must be an integer in [1, 64]", path, k));
      (k == "links_per_axis" ? t.links_per_axis : t.torus_dims) = static_cast<int>(v);
    } else {
      throw InputError(fmt::format("{}: unknown field '{}' (known: name, base, peak_flops, hbm_bytes, hbm_bandwidth, "
                                   "link_bandwidth, link_latency, wraparound, links_per_axis, torus_dims)",
                                   path, k));
    }
  }
  if (!(t.peak_flops > 0)) throw InputError(fmt::format("{}: peak_flops must be > 0", path));
  if (!(t.hbm_bandwidth > 0)) throw InputError(fmt::format("{}: hbm_bandwidth must be > 0", path));
  if (!(t.link_bandwidth > 0)) throw InputError(fmt::format("{}: link_bandwidth must be > 0", path));
  return t;
}

}  // namespace

std::vector<std::string> Target::presets() { return {"tpu-v3", "tpu-v4", "tpu-v5e"}; }

Target Target::load(const std::string& name_or_path) {
  if (name_or_path == "tpu-v3") return preset_v3();
  if (name_or_path == "tpu-v4") return preset_v4();
  if (name_or_path == "tpu-v5e") return preset_v5e();
  if (!name_or_path.empty() &&
      (name_or_path.ends_with(".json") || name_or_path.find('/') != std::string::npos || file_exists(name_or_path)))
    return load_file(name_or_path);
  throw InputError(fmt::format("--target: unknown target '{}' (known: tpu-v3, tpu-v4, tpu-v5e)", name_or_path));
}

std::string Target::to_json() const {
  std::string esc;
  for (char c : name) {
    if (c == '"' || c == '\\') esc += '\\';
    esc += c;
  }
  return fmt::format(
      "{{\"name\": \"{}\", \"peak_flops\": {}, \"hbm_bytes\": {}, \"hbm_bandwidth\": {}, \"link_bandwidth\": {}, "
      "\"link_latency\": {}, \"wraparound\": {}, \"links_per_axis\": {}, \"torus_dims\": {}}}",
      esc, peak_flops, hbm_bytes, hbm_bandwidth, link_bandwidth, link_latency, wraparound ? "true" : "false",
      links_per_axis, torus_dims);
}

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

// Ring bandwidth of mesh axis `a`: physical dim min(user axis of a, torus_dims-1); axes folded onto one physical dim share it:
// an axis of stride s (product of the sizes of more-minor folded axes) runs s rings over the same links (bw / s) and
// only has wraparound when it spans the whole physical dim.
AxisLink axis_link(int a, const DeviceMesh& mesh, const Target& t) {
  AxisLink l;
  l.n = static_cast<double>(mesh.shape.at(a));
  int dims = std::max(1, t.torus_dims);
  // user axis u runs on physical dim min(u, dims-1); the parts of a refined axis fold onto their parent's dim
  int phys = std::min(mesh.user_axis(a), dims - 1);
  double stride = 1, span_total = 1;
  for (int b = 0; b < mesh.rank(); ++b) {
    if (std::min(mesh.user_axis(b), dims - 1) != phys) continue;
    span_total *= static_cast<double>(mesh.shape[b]);
    if (b > a) stride *= static_cast<double>(mesh.shape[b]);
  }
  bool wrap = t.wraparound && l.n * stride == span_total;
  l.bw = t.link_bandwidth * std::max(1, t.links_per_axis) * (wrap ? 1.0 : 0.5) / stride;
  return l;
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

double collective_time(const std::string& kind, double bytes, const std::vector<int>& mesh_axes,
                       const DeviceMesh& mesh, const Target& t) {
  if (kind != "all-reduce" && kind != "all-gather" && kind != "reduce-scatter" && kind != "all-to-all" &&
      kind != "collective-permute")
    throw std::invalid_argument(fmt::format("collective_time: unknown collective kind '{}'", kind));
  std::vector<AxisLink> links;
  for (int a : mesh_axes) {
    if (a < 0 || a >= mesh.rank())
      throw std::invalid_argument(fmt::format("collective_time: mesh axis {} out of range for mesh {}", a, mesh.str()));
    AxisLink l = axis_link(a, mesh, t);
    if (l.n > 1) links.push_back(l);
  }
  if (links.empty() || bytes <= 0) return 0;
  const double lat = t.link_latency;
  if (kind == "collective-permute") return bytes / t.link_bandwidth + lat;
  if (kind == "all-to-all") {
    double time = 0;
    for (const auto& l : links) time += std::floor(l.n * l.n / 4) / l.n * bytes / l.bw + (l.n - 1) * lat;
    return time;
  }
  // all-gather / reduce-scatter (mirror image, same time): try every axis order (mesh rank is small).
  std::vector<int> perm(links.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(i);
  double best = std::numeric_limits<double>::infinity();
  do {
    std::vector<AxisLink> order;
    for (int i : perm) order.push_back(links[i]);
    best = std::min(best, gather_stages(bytes, order, lat));
  } while (perm.size() <= 6 && std::next_permutation(perm.begin(), perm.end()));
  return kind == "all-reduce" ? 2 * best : best;
}

bool is_collective(const Node& n, std::string* kind) {
  if (n.domain != kGspmdDomain) return false;
  const char* k = nullptr;
  if (n.op_type == "AllReduce") k = "all-reduce";
  else if (n.op_type == "AllGather") k = "all-gather";
  else if (n.op_type == "ReduceScatter") k = "reduce-scatter";
  else if (n.op_type == "AllToAll") k = "all-to-all";
  else if (n.op_type == "CollectivePermute") k = "collective-permute";
  if (!k) return false;
  if (kind) *kind = k;
  return true;
}

double node_time(const Graph& program, const Node& n, const DeviceMesh& mesh, const Target& t) {
  std::string kind;
  if (is_collective(n, &kind)) {
    double b = 0;
    for (int v : n.inputs) b = std::max(b, bytes_of(program, v));
    for (int v : n.outputs) b = std::max(b, bytes_of(program, v));
    std::vector<int> axes;
    for (int64_t a : n.ints("mesh_axes")) axes.push_back(static_cast<int>(a));
    return collective_time(kind, b, axes, mesh, t);
  }
  double f = node_flops(program, n);
  double b = node_bytes(program, n);
  return std::max(t.peak_flops > 0 ? f / t.peak_flops : 0.0, t.hbm_bandwidth > 0 ? b / t.hbm_bandwidth : 0.0);
}

int64_t static_peak_memory(const Graph& program) {
  const auto bytes = [&](int v) {
    const Value& val = program.values[static_cast<size_t>(v)];
    return num_elements(val.shape) * static_cast<int64_t>(dtype_size(val.dtype));
  };
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
