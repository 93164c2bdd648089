// Differential testing (issue 3): random ONNX-like graphs with random static shapes (many dims that do not divide
// the mesh), random sharding annotations on random 1-D..3-D meshes, checked as
//   run_spmd(partition(propagate(g, ann))) == run_single(g)   (floats within 1e-5 + 1e-4 |ref|, ints/bools exactly).
// Header-only so that tests/e2e/differential_test.cc and bench/difftest.cc (gspmd-difftest) share it.
//
//   RandomCase c = generate_case(seed);        // deterministic in (seed, options)
//   CheckResult r = check_case(c.g, c.ann, c.inputs);
//   if (r.status == CheckResult::kFail) { Repro m = reduce_repro(to_repro(c), r); std::cout << dump(m.g, m.ann); }
//
// See docs/testing.md.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "backend/kernels/kernels.h"
#include "backend/pod/pod.h"
#include "core/autodiff/autodiff.h"
#include "core/partition/spmd.h"
#include "core/propagation/propagation.h"
#include "core/shapes/shapes.h"
#include "core/sharding/sharding.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd::difftest {

// ---------------------------------------------------------------------------------------------------------------
// Meshes

inline DeviceMesh mesh_of(const std::vector<int64_t>& shape) {
  static const char* names[] = {"x", "y", "z", "w"};
  DeviceMesh m;
  m.shape = shape;
  for (size_t i = 0; i < shape.size(); ++i) m.axes.push_back(names[i]);
  return m;
}

/// The meshes cases are drawn from (1-D to 3-D, up to 16 devices; an axis of size 1 once).
inline const std::vector<std::vector<int64_t>>& mesh_shapes() {
  static const std::vector<std::vector<int64_t>> m = {{2},    {3},    {4},       {5},       {8},       {16},
                                                      {2, 2}, {2, 3}, {3, 2},    {3, 3},    {2, 4},    {4, 2},
                                                      {4, 4}, {1, 3}, {2, 2, 2}, {2, 2, 4}, {2, 3, 2}, {3, 2, 2}};
  return m;
}

// ---------------------------------------------------------------------------------------------------------------
// Generated case

struct GenOptions {
  int64_t max_devices = 16;
  int min_nodes = 3;
  int max_nodes = 12;
  int max_float_inputs = 3;
  int64_t max_numel = 2048;  // per value
  /// Stress mode (gspmd-difftest --stress): unreduced annotations also on weights and intermediate values (sum), and
  /// on inputs and weights with random reductions (sum, max, min, prod), instead of only sum on graph inputs.
  bool stress = false;
  /// Also draw ops beyond the list (gspmd-difftest --extra-ops): LogSoftmax, Flatten, Expand, Pad, Tile,
  /// CumSum, ArgMax, ReduceMin/ReduceProd/ReduceL2/ReduceLogSumExp.
  bool extra_ops = false;
};

struct RandomCase {
  uint64_t seed = 0;
  Graph g;
  Annotations ann;
  std::vector<Tensor> inputs;     // one per g.inputs
  std::vector<std::string> tags;  // coverage: op types plus variants ("MatMul:batched", "mesh:2x3", ...)
};

/// A failing (or to-be-reduced) triple.
struct Repro {
  Graph g;
  Annotations ann;
  std::vector<Tensor> inputs;
};

inline Repro to_repro(const RandomCase& c) { return Repro{c.g, c.ann, c.inputs}; }

namespace detail {

inline std::optional<Shape> broadcast(const Shape& a, const Shape& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (size_t i = 0; i < r; ++i) {
    int64_t x = i < r - a.size() ? 1 : a[i - (r - a.size())];
    int64_t y = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[i] = x == 1 ? y : x;
  }
  return out;
}

inline std::string mesh_tag(const DeviceMesh& m) {
  std::string s;
  for (size_t i = 0; i < m.shape.size(); ++i) s += (i ? "x" : "") + std::to_string(m.shape[i]);
  return s;
}

/// What the generator knows about a value.
struct Info {
  bool exact = false;  // bit-identical whatever the partitioning (no floating-point reduction upstream)
  bool ge1 = false;    // every element >= 1 (a safe divisor)
  double scale = 0.6;  // rough magnitude (rms)
  int64_t ids_hi = 0;  // int64 ids inputs: values in [0, ids_hi)
};

class Generator {
 public:
  Generator(uint64_t seed, const GenOptions& o) : rng_(seed), opt_(o) { c_.seed = seed; }

  RandomCase run() {
    // Mesh.
    std::vector<std::vector<int64_t>> meshes;
    for (const auto& m : mesh_shapes()) {
      int64_t n = 1;
      for (int64_t d : m) n *= d;
      if (n <= opt_.max_devices) meshes.push_back(m);
    }
    if (meshes.empty()) meshes.push_back({1});
    mesh_ = mesh_of(pick(meshes));
    c_.g.name = "random_" + std::to_string(c_.seed);
    c_.g.opset = 17;
    tag("mesh:" + mesh_tag(mesh_));

    // First input: sometimes an image for Conv/pools.
    if (P(0.3))
      new_input({R(1, 3), R(1, 6), R(3, 8), R(3, 8)});
    else
      new_input(rand_shape(R(1, 4), 400));

    const int target = R(opt_.min_nodes, opt_.max_nodes);
    for (int attempt = 0; attempt < 400 && static_cast<int>(c_.g.nodes.size()) < target; ++attempt) {
      const int before_nodes = static_cast<int>(c_.g.nodes.size());
      Snapshot snap = snapshot();
      budget_ = target - before_nodes;
      bool ok = false;
      try {
        ok = try_op(R(0, kNumOps - 1 + (opt_.extra_ops ? kNumExtraOps : 0)));
      } catch (const Reject&) {
        ok = false;
      }
      if (!ok) restore(snap);
    }
    finish();
    return std::move(c_);
  }

 private:
  struct Reject {};
  static constexpr int kNumOps = 30;
  static constexpr int kNumExtraOps = 9;

  std::mt19937_64 rng_;
  GenOptions opt_;
  RandomCase c_;
  DeviceMesh mesh_;
  std::map<int, Info> info_;
  std::vector<int> pool_;    // float values usable as operands
  std::vector<int> bools_;   // bool values (Where conditions)
  std::vector<int> ids_;     // int64 ids graph inputs
  std::map<int, int> uses_;  // consumers per value
  int counter_ = 0;
  int n_float_inputs_ = 0;
  int budget_ = 0;

  struct Snapshot {
    Graph g;
    std::map<int, Info> info;
    std::vector<int> pool, bools, ids;
    std::map<int, int> uses;
    int n_float_inputs;
    size_t ntags;
  };
  Snapshot snapshot() const { return {c_.g, info_, pool_, bools_, ids_, uses_, n_float_inputs_, c_.tags.size()}; }
  void restore(Snapshot& s) {
    c_.g = std::move(s.g);
    info_ = std::move(s.info);
    pool_ = std::move(s.pool);
    bools_ = std::move(s.bools);
    ids_ = std::move(s.ids);
    uses_ = std::move(s.uses);
    n_float_inputs_ = s.n_float_inputs;
    c_.tags.resize(s.ntags);
  }

  // ---- randomness
  int64_t R(int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng_); }
  bool P(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(R(0, static_cast<int64_t>(v.size()) - 1))];
  }
  int64_t rdim() {
    static const std::vector<int64_t> d = {1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 7, 8, 9};
    return pick(d);
  }
  Shape rand_shape(int rank, int64_t max_numel) {
    for (;;) {
      Shape s(static_cast<size_t>(rank));
      for (auto& d : s) d = rdim();
      if (num_elements(s) <= max_numel) return s;
    }
  }
  void tag(const std::string& t) { c_.tags.push_back(t); }

  // ---- values
  // By value: creating values (weights, constants) while a shape is in use would invalidate a reference.
  Shape shape(int v) const { return c_.g.values[static_cast<size_t>(v)].shape; }
  const Shape& sref(int v) const { return c_.g.values[static_cast<size_t>(v)].shape; }
  int rank(int v) const { return static_cast<int>(shape(v).size()); }
  Info& info(int v) { return info_[v]; }
  int add_value(const std::string& prefix, DType t, const Shape& s) {
    Value v;
    v.name = prefix + std::to_string(counter_++);
    v.dtype = t;
    v.shape = s;
    return c_.g.add_value(std::move(v));
  }
  void check_numel(const Shape& s) const {
    if (num_elements(s) > opt_.max_numel || num_elements(s) < 1) throw Reject{};
  }
  int new_input(const Shape& s) {
    if (n_float_inputs_ >= opt_.max_float_inputs) throw Reject{};
    check_numel(s);
    int v = add_value("x", DType::kFloat32, s);
    c_.g.inputs.push_back(v);
    info_[v] = Info{true, false, 0.58, 0};
    pool_.push_back(v);
    ++n_float_inputs_;
    return v;
  }
  int new_ids(const Shape& s, int64_t hi) {
    if (ids_.size() >= 2) throw Reject{};
    int v = add_value("ids", DType::kInt64, s);
    c_.g.inputs.push_back(v);
    info_[v] = Info{true, false, 0, hi};
    ids_.push_back(v);
    return v;
  }
  int init_tensor(const std::string& prefix, Tensor t) {
    Value v;
    v.name = prefix + std::to_string(counter_++);
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.is_initializer = true;
    v.data = std::make_shared<Tensor>(std::move(t));
    return c_.g.add_value(std::move(v));
  }
  /// A float weight, uniform in [-amp, amp] (positive: [0.5, 2]; zeros: small set {0, 1}).
  int new_weight(const Shape& s, double amp, bool positive = false, bool small_set = false) {
    check_numel(s);
    std::uniform_real_distribution<float> u(static_cast<float>(-amp), static_cast<float>(amp)), p(0.5f, 2.f);
    std::vector<float> d(static_cast<size_t>(num_elements(s)));
    for (float& x : d) x = small_set ? static_cast<float>(R(0, 1)) : positive ? p(rng_) : u(rng_);
    int v = init_tensor("w", Tensor::from_floats(s, d));
    info_[v] = Info{true, positive, positive ? 1.3 : small_set ? 0.5 : amp * 0.58, 0};
    pool_.push_back(v);
    return v;
  }
  int const_i64(const std::vector<int64_t>& v, bool scalar = false) {
    return init_tensor("k", Tensor::from_int64s(v, scalar));
  }
  int const_f(float x) { return init_tensor("k", Tensor::from_floats({}, {x})); }

  /// Emits a node; outputs (dtype, shape) get `inf`. Returns the output ids.
  std::vector<int> emit(const std::string& op, const std::vector<int>& ins,
                        const std::vector<std::pair<DType, Shape>>& outs, std::map<std::string, AttrValue> attrs,
                        const Info& inf) {
    if (budget_ <= 0) throw Reject{};
    for (const auto& o : outs) {
      check_numel(o.second);
      if (o.first == DType::kFloat32 && (inf.scale > 30 || !std::isfinite(inf.scale))) throw Reject{};
    }
    Node n;
    n.op_type = op;
    n.name = op + "_" + std::to_string(c_.g.nodes.size());
    n.inputs = ins;
    n.attrs = std::move(attrs);
    for (const auto& [t, s] : outs) {
      int v = add_value("t", t, s);
      n.outputs.push_back(v);
      info_[v] = inf;
      if (t == DType::kFloat32) pool_.push_back(v);
      if (t == DType::kBool) bools_.push_back(v);
    }
    for (int i : ins)
      if (i >= 0) ++uses_[i];
    std::vector<int> outs_ids = n.outputs;
    c_.g.add_node(std::move(n));
    --budget_;
    tag(op);
    return outs_ids;
  }
  int emit1(const std::string& op, const std::vector<int>& ins, DType t, const Shape& s,
            std::map<std::string, AttrValue> attrs, const Info& inf) {
    return emit(op, ins, {{t, s}}, std::move(attrs), inf)[0];
  }

  /// A float operand satisfying `pred`, biased to recent and still unused values; -1 if none.
  int pick_float(const std::function<bool(int)>& pred = nullptr) {
    std::vector<int> c, unused;
    for (int v : pool_)
      if (!pred || pred(v)) {
        c.push_back(v);
        if (!uses_.count(v)) unused.push_back(v);
      }
    if (c.empty()) return -1;
    if (!unused.empty() && P(0.5)) return pick(unused);
    if (P(0.5))
      return c[static_cast<size_t>(
          R(std::max<int64_t>(0, static_cast<int64_t>(c.size()) - 3), static_cast<int64_t>(c.size()) - 1))];
    return pick(c);
  }
  int need_float(const std::function<bool(int)>& pred = nullptr) {
    int v = pick_float(pred);
    if (v < 0) throw Reject{};
    return v;
  }
  /// A 4-D float value [N,C,H,W] with C <= 8, or a new image input.
  int need_image() {
    int v = pick_float([&](int x) { return rank(x) == 4 && shape(x)[1] <= 8; });
    if (v >= 0 && P(0.85)) return v;
    return new_input({R(1, 3), R(1, 6), R(3, 8), R(3, 8)});
  }

  /// A shape that broadcasts with `a` (sometimes expanding it, sometimes lower or higher rank).
  Shape partner_shape(const Shape& a) {
    const int ra = static_cast<int>(a.size());
    int rb = ra;
    double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (ra > 0 && u < 0.2)
      rb = static_cast<int>(R(0, ra - 1));
    else if (u > 0.92 && ra < 4)
      rb = ra + 1;
    Shape b(static_cast<size_t>(rb));
    for (int i = 0; i < rb; ++i) {
      int ia = i - (rb - ra);
      if (ia < 0)
        b[static_cast<size_t>(i)] = R(1, 3);
      else if (a[static_cast<size_t>(ia)] == 1)
        b[static_cast<size_t>(i)] = P(0.35) ? R(2, 5) : 1;
      else
        b[static_cast<size_t>(i)] = P(0.7) ? a[static_cast<size_t>(ia)] : 1;
    }
    return b;
  }
  /// A second operand for a binary op with `a`: a pool value that broadcasts, a new weight, or a new input.
  int partner(int a, const std::function<bool(int)>& pred, bool positive_weight, bool allow_input = true) {
    const Shape as = shape(a);
    if (P(0.35)) {
      int b = pick_float([&](int v) { return broadcast(as, shape(v)).has_value() && (!pred || pred(v)); });
      if (b >= 0) return b;
    }
    Shape bs = partner_shape(as);
    if (allow_input && !positive_weight && P(0.2) && n_float_inputs_ < opt_.max_float_inputs) return new_input(bs);
    return new_weight(bs, 1.0, positive_weight);
  }

  static double rms2(double a, double b) { return std::sqrt(a * a + b * b); }

  // ---- ops
  bool try_op(int k) {
    switch (k) {
      case 0: return op_unary("Relu");
      case 1: return op_unary(pick(std::vector<std::string>{"Tanh", "Sigmoid"}));
      case 2: return op_unary("Exp");
      case 3: return op_unary(pick(std::vector<std::string>{"Neg", "Abs"}));
      case 4: return op_unary("Erf");
      case 5: return op_sqrt_abs1();
      case 6: return op_clip();
      case 7:
      case 8: return op_binary(pick(std::vector<std::string>{"Add", "Sub", "Mul", "Div"}));
      case 9: return op_compare_where();
      case 10:
      case 11: return op_matmul();
      case 12: return op_gemm();
      case 13: return op_softmax();
      case 14: return op_layernorm();
      case 15: return op_reduce(pick(std::vector<std::string>{"ReduceSum", "ReduceMean", "ReduceMax"}));
      case 16: return op_transpose();
      case 17: return op_reshape();
      case 18: return P(0.5) ? op_unsqueeze() : op_squeeze();
      case 19: return op_concat();
      case 20: return op_slice();
      case 21: return op_split();
      case 22: return op_gather();
      case 23: return op_conv();
      case 24: return op_pool(P(0.5) ? "MaxPool" : "AveragePool");
      case 25: return op_gap();
      case 26: return op_einsum();
      case 27: return op_variadic(P(0.5) ? "Sum" : "Max");
      case 28: return op_squeeze();
      case 29: return op_binary(pick(std::vector<std::string>{"Add", "Mul"}));
      // Extra ops (GenOptions::extra_ops).
      case 30: return op_logsoftmax();
      case 31: return op_flatten();
      case 32: return op_expand();
      case 33: return op_pad();
      case 34: return op_tile();
      case 35: return op_cumsum();
      case 36: return op_argmax();
      case 37:
      case 38:
        return op_reduce(pick(std::vector<std::string>{"ReduceMin", "ReduceProd", "ReduceL2", "ReduceLogSumExp"}));
    }
    return false;
  }

  bool op_unary(const std::string& op) {
    int x = need_float([&](int v) { return op != "Exp" || info(v).scale <= 1.5; });
    const Info& in = info(x);
    Info o;
    o.exact = in.exact && (op == "Relu" || op == "Neg" || op == "Abs");
    o.scale = op == "Relu"      ? in.scale * 0.6
              : op == "Tanh"    ? std::min(in.scale, 1.0)
              : op == "Sigmoid" ? 0.5
              : op == "Exp"     ? std::exp(in.scale * 1.5)
              : op == "Erf"     ? std::min(in.scale, 1.0)
                                : in.scale;
    emit1(op, {x}, DType::kFloat32, shape(x), {}, o);
    return true;
  }

  bool op_sqrt_abs1() {
    if (budget_ < 3) return false;
    int x = need_float();
    Info in = info(x);
    int a = emit1("Abs", {x}, DType::kFloat32, shape(x), {}, Info{in.exact, false, in.scale, 0});
    int b = emit1("Add", {a, const_f(1.f)}, DType::kFloat32, shape(x), {}, Info{false, true, in.scale + 1, 0});
    emit1("Sqrt", {b}, DType::kFloat32, shape(x), {}, Info{false, true, std::sqrt(in.scale + 1), 0});
    tag("Sqrt:of-abs+1");
    return true;
  }

  bool op_clip() {
    int x = need_float();
    float lo = -static_cast<float>(R(1, 8)) / 8.f, hi = static_cast<float>(R(1, 8)) / 8.f;
    std::vector<int> ins = {x};
    int v = static_cast<int>(R(0, 2));
    if (v == 0) ins = {x, const_f(lo), const_f(hi)}, tag("Clip:min+max");
    if (v == 1) ins = {x, const_f(lo)}, tag("Clip:min");
    if (v == 2) ins = {x, -1, const_f(hi)}, tag("Clip:max");
    emit1("Clip", ins, DType::kFloat32, shape(x), {}, Info{info(x).exact, false, std::min(info(x).scale, 1.0), 0});
    return true;
  }

  bool op_binary(const std::string& op) {
    int a = need_float();
    int b = op == "Div" ? partner(
                              a, [&](int v) { return info(v).ge1; }, true)
                        : partner(a, nullptr, false);
    if (op != "Div" && P(0.4)) std::swap(a, b);
    auto y = broadcast(shape(a), shape(b));
    if (!y) throw Reject{};
    if (*y != shape(a) && *y != shape(b))
      tag(op + ":broadcast-both");
    else if (shape(a) != shape(b))
      tag(op + ":broadcast");
    const double sa = info(a).scale, sb = info(b).scale;
    double s = op == "Mul" ? sa * sb : op == "Div" ? sa * 2 : rms2(sa, sb);
    emit1(op, {a, b}, DType::kFloat32, *y, {}, Info{false, false, s, 0});
    return true;
  }

  /// Equal/Less/Greater of exact values (so rounding never flips a comparison), then usually a Where on it.
  bool op_compare_where() {
    const std::string op = pick(std::vector<std::string>{"Equal", "Less", "Greater"});
    int cond = -1;
    if (!bools_.empty() && P(0.3)) {
      cond = pick(bools_);
    } else if (op == "Equal" && !ids_.empty() && P(0.3)) {
      int ids = pick(ids_);
      int k = const_i64({R(0, std::max<int64_t>(0, info(ids).ids_hi - 1))}, true);
      cond = emit1("Equal", {ids, k}, DType::kBool, shape(ids), {}, Info{true, false, 0, 0});
      tag("Equal:int64");
    } else {
      int a = need_float([&](int v) { return info(v).exact; });
      int b;
      if (P(0.4)) {
        b = pick_float([&](int v) { return info(v).exact && v != a && broadcast(shape(a), shape(v)).has_value(); });
        if (b < 0) b = new_weight(partner_shape(shape(a)), 1.0, false, op == "Equal");
      } else {
        b = new_weight(partner_shape(shape(a)), 1.0, false, op == "Equal");
      }
      if (P(0.3)) std::swap(a, b);
      auto y = broadcast(shape(a), shape(b));
      if (!y) throw Reject{};
      cond = emit1(op, {a, b}, DType::kBool, *y, {}, Info{true, false, 0, 0});
    }
    if (P(0.25) && cond >= 0 && uses_.count(cond) == 0) return true;  // the bool is a graph output
    // Where(cond, x, y).
    const Shape cs = shape(cond);
    int x = need_float([&](int v) { return broadcast(cs, shape(v)).has_value(); });
    auto xs = broadcast(cs, shape(x));
    int y = partner(
        x, [&](int v) { return broadcast(*xs, shape(v)).has_value(); }, false);
    if (P(0.5)) std::swap(x, y);
    auto out = broadcast(*xs, shape(y));
    if (!out) throw Reject{};
    out = broadcast(*out, shape(x));
    if (!out) throw Reject{};
    emit1("Where", {cond, x, y}, DType::kFloat32, *out, {},
          Info{info(x).exact && info(y).exact, false, std::max(info(x).scale, info(y).scale), 0});
    return true;
  }

  static Shape batch_of(const Shape& s) { return s.size() <= 2 ? Shape{} : Shape(s.begin(), s.end() - 2); }

  bool op_matmul() {
    int a = need_float([&](int v) { return rank(v) >= 1 && info(v).scale < 5; });
    const Shape as = shape(a);
    const int ra = rank(a);
    const int64_t K = as.back();
    int b = -1;
    if (P(0.25)) {
      b = pick_float([&](int v) {
        const Shape& s = shape(v);
        if (s.empty() || (ra == 1 && s.size() == 1) || info(v).scale > 5) return false;
        int64_t kb = s.size() == 1 ? s[0] : s[s.size() - 2];
        return kb == K && broadcast(batch_of(as), batch_of(s)).has_value();
      });
    }
    const double amp = 1.7 / std::sqrt(static_cast<double>(K));
    if (b < 0) {
      const int64_t N = rdim();
      double u = std::uniform_real_distribution<double>(0, 1)(rng_);
      if (u < 0.1 && ra >= 2) {
        b = new_weight({K}, amp);
      } else if (u < 0.4 && ra >= 3) {
        Shape bs = batch_of(as);
        for (auto& d : bs)
          if (P(0.25)) d = 1;
        bs.push_back(K);
        bs.push_back(N);
        b = (P(0.4) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(bs) : new_weight(bs, amp);
      } else {
        b = new_weight({K, N}, amp);
      }
    }
    const Shape bs = shape(b);
    auto batch = broadcast(batch_of(as), batch_of(bs));
    if (!batch) throw Reject{};
    Shape y = *batch;
    if (ra >= 2) y.push_back(as[as.size() - 2]);
    if (bs.size() >= 2) y.push_back(bs.back());
    if (ra == 1)
      tag("MatMul:1-D x N-D");
    else if (bs.size() == 1)
      tag("MatMul:N-D x 1-D");
    else if (bs.size() >= 3)
      tag("MatMul:batched x batched");
    else if (ra >= 3)
      tag("MatMul:batched x 2-D");
    else
      tag("MatMul:2-D");
    emit1("MatMul", {a, b}, DType::kFloat32, y, {},
          Info{false, false, info(a).scale * info(b).scale * std::sqrt(static_cast<double>(K)), 0});
    return true;
  }

  bool op_gemm() {
    int a = need_float([&](int v) { return rank(v) == 2 && info(v).scale < 5; });
    const bool ta = P(0.3), tb = P(0.3);
    const int64_t M = ta ? shape(a)[1] : shape(a)[0], K = ta ? shape(a)[0] : shape(a)[1];
    const int64_t N = rdim();
    const double amp = 1.7 / std::sqrt(static_cast<double>(K));
    Shape bshape = tb ? Shape{N, K} : Shape{K, N};
    int b = (P(0.25) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(bshape) : new_weight(bshape, amp);
    std::vector<int> ins = {a, b};
    const float alpha = pick(std::vector<float>{1.f, 0.5f, 2.f}), beta = pick(std::vector<float>{1.f, 0.5f, 2.f});
    int cv = static_cast<int>(R(0, 4));
    if (cv > 0) {
      Shape cs = cv == 1 ? Shape{N} : cv == 2 ? Shape{1, N} : cv == 3 ? Shape{M, N} : Shape{M, 1};
      ins.push_back((P(0.3) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(cs) : new_weight(cs, 1.0));
      tag(std::string("Gemm:C") + (cv == 1 ? "[N]" : cv == 2 ? "[1,N]" : cv == 3 ? "[M,N]" : "[M,1]"));
    }
    if (ta) tag("Gemm:transA");
    if (tb) tag("Gemm:transB");
    std::map<std::string, AttrValue> at = {{"alpha", alpha}, {"beta", beta}};
    if (ta) at["transA"] = int64_t{1};
    if (tb) at["transB"] = int64_t{1};
    emit1("Gemm", ins, DType::kFloat32, {M, N}, at,
          Info{false, false, alpha * info(a).scale * info(b).scale * std::sqrt(double(K)) + beta, 0});
    return true;
  }

  bool op_softmax() {
    int x = need_float([&](int v) { return rank(v) >= 1; });
    const int r = rank(x);
    int64_t axis = R(-r, r - 1);
    emit1("Softmax", {x}, DType::kFloat32, shape(x), {{"axis", axis}}, Info{false, false, 0.5, 0});
    return true;
  }

  bool op_logsoftmax() {
    int x = need_float([&](int v) { return rank(v) >= 1 && info(v).scale < 5; });
    const int r = rank(x);
    int64_t axis = R(-r, r - 1);
    emit1("LogSoftmax", {x}, DType::kFloat32, shape(x), {{"axis", axis}}, Info{false, false, 3.0, 0});
    return true;
  }

  bool op_flatten() {
    int x = need_float([&](int v) { return rank(v) >= 1; });
    const Shape s = shape(x);
    const int r = rank(x);
    const int64_t axis = R(0, r);
    int64_t a = 1, b = 1;
    for (int d = 0; d < r; ++d) (d < axis ? a : b) *= s[static_cast<size_t>(d)];
    std::map<std::string, AttrValue> at;
    if (axis != 1 || P(0.3)) at["axis"] = int64_t{P(0.2) && axis < r ? axis - r : axis};
    emit1("Flatten", {x}, DType::kFloat32, {a, b}, at, info(x));
    return true;
  }

  bool op_expand() {
    int x = need_float([&](int v) { return rank(v) <= 3 || std::count(sref(v).begin(), sref(v).end(), 1) > 0; });
    const Shape s = shape(x);
    Shape t;
    if (s.size() < 4 && P(0.3)) t.push_back(R(1, 3));
    for (int64_t d : s) t.push_back(d == 1 ? (P(0.6) ? R(2, 4) : 1) : (P(0.2) ? 1 : d));
    auto y = broadcast(s, t);
    if (!y || *y == s) throw Reject{};
    emit1("Expand", {x, const_i64(std::vector<int64_t>(t.begin(), t.end()))}, DType::kFloat32, *y, {}, info(x));
    return true;
  }

  bool op_pad() {
    int x = need_float([&](int v) { return rank(v) >= 1; });
    const Shape s = shape(x);
    const int r = rank(x);
    const std::string mode = pick(std::vector<std::string>{"constant", "constant", "reflect", "edge"});
    std::vector<int64_t> pads(static_cast<size_t>(2 * r), 0);
    Shape y = s;
    for (int d = 0; d < r; ++d) {
      const int64_t n = s[static_cast<size_t>(d)];
      if (!P(0.6)) continue;
      const int64_t hi = mode == "reflect" ? std::min<int64_t>(2, n - 1) : 2;
      if (hi <= 0) continue;
      pads[static_cast<size_t>(d)] = R(0, hi);
      pads[static_cast<size_t>(d + r)] = R(0, hi);
      if (mode == "constant" && P(0.15) && n > 1) pads[static_cast<size_t>(d)] = -1, tag("Pad:negative");
      y[static_cast<size_t>(d)] += pads[static_cast<size_t>(d)] + pads[static_cast<size_t>(d + r)];
    }
    if (y == s && std::all_of(pads.begin(), pads.end(), [](int64_t p) { return p == 0; })) throw Reject{};
    std::vector<int> ins = {x, const_i64(pads)};
    if (mode == "constant" && P(0.5)) ins.push_back(const_f(0.5f));
    tag("Pad:" + mode);
    std::map<std::string, AttrValue> at;
    if (mode != "constant" || P(0.3)) at["mode"] = mode;
    emit1("Pad", ins, DType::kFloat32, y, at, info(x));
    return true;
  }

  bool op_tile() {
    int x = need_float([&](int v) { return rank(v) >= 1 && num_elements(sref(v)) <= 300; });
    const Shape s = shape(x);
    std::vector<int64_t> rep;
    Shape y;
    for (int64_t d : s) {
      rep.push_back(P(0.5) ? R(2, 3) : 1);
      y.push_back(d * rep.back());
    }
    if (y == s) throw Reject{};
    emit1("Tile", {x, const_i64(rep)}, DType::kFloat32, y, {}, info(x));
    return true;
  }

  bool op_cumsum() {
    int x = need_float([&](int v) { return rank(v) >= 1; });
    const int r = rank(x);
    const int64_t axis = R(-r, r - 1);
    std::map<std::string, AttrValue> at;
    if (P(0.3)) at["exclusive"] = int64_t{1}, tag("CumSum:exclusive");
    if (P(0.3)) at["reverse"] = int64_t{1}, tag("CumSum:reverse");
    const double n = static_cast<double>(shape(x)[static_cast<size_t>(axis < 0 ? axis + r : axis)]);
    emit1("CumSum", {x, const_i64({axis}, true)}, DType::kFloat32, shape(x), at,
          Info{false, false, info(x).scale * std::sqrt(n) * 1.5, 0});
    return true;
  }

  /// ArgMax of an exact value (ties, e.g. Relu zeros, are decided by select_last_index, never by rounding).
  bool op_argmax() {
    int x = need_float([&](int v) { return rank(v) >= 1 && info(v).exact; });
    const int r = rank(x);
    const int64_t axis = R(-r, r - 1);
    const bool keep = P(0.5);
    Shape y = shape(x);
    if (keep)
      y[static_cast<size_t>(axis < 0 ? axis + r : axis)] = 1;
    else
      y.erase(y.begin() + (axis < 0 ? axis + r : axis));
    std::map<std::string, AttrValue> at = {{"axis", axis}, {"keepdims", int64_t{keep}}};
    if (P(0.4)) at["select_last_index"] = int64_t{1}, tag("ArgMax:select_last_index");
    emit1("ArgMax", {x}, DType::kInt64, y, at, Info{true, false, 0, 0});
    return true;
  }

  bool op_layernorm() {
    int x = need_float([&](int v) { return rank(v) >= 1; });
    const int r = rank(x);
    int64_t axis = R(-r, r - 1);
    const int64_t a = axis < 0 ? axis + r : axis;
    const Shape xs = shape(x);
    Shape ns(xs.begin() + a, xs.end());
    if (P(0.3) && ns.size() > 1)
      ns.erase(ns.begin(), ns.begin() + R(1, static_cast<int64_t>(ns.size()) - 1)),
          tag("LayerNormalization:broadcast-scale");
    std::vector<float> d(static_cast<size_t>(num_elements(ns)));
    for (float& v : d) v = 0.5f + static_cast<float>(R(0, 100)) / 100.f;
    check_numel(ns);
    int scale = init_tensor("w", Tensor::from_floats(ns, d));
    info_[scale] = Info{true, false, 1.0, 0};
    std::vector<int> ins = {x, scale};
    if (P(0.6))
      ins.push_back(new_weight(ns, 1.0));
    else
      tag("LayerNormalization:no-bias");
    // epsilon >= 1e-2: rows of (nearly) equal values (broadcast scalars, a Softmax over a size-1 axis) would
    // otherwise amplify the rounding differences of the split mean/variance (another summation order than the
    // single-device run) by up to 1/sqrt(epsilon) beyond the comparison's 1e-5 (seed 20243325 at 1e-3).
    const float eps = P(0.7) ? 1e-1f : 1e-2f;
    emit1("LayerNormalization", ins, DType::kFloat32, shape(x), {{"axis", axis}, {"epsilon", eps}},
          Info{false, false, 2.0, 0});
    return true;
  }

  bool op_reduce(const std::string& op) {
    int x = need_float([&](int v) { return rank(v) >= 1; });
    const int r = rank(x);
    std::vector<int64_t> axes;
    const bool all = P(0.15);
    std::vector<char> red(static_cast<size_t>(r), all);
    if (!all) {
      for (int d = 0; d < r; ++d)
        if (P(0.4)) red[static_cast<size_t>(d)] = 1;
      if (std::find(red.begin(), red.end(), 1) == red.end()) red[static_cast<size_t>(R(0, r - 1))] = 1;
      for (int d = 0; d < r; ++d)
        if (red[static_cast<size_t>(d)]) axes.push_back(P(0.3) ? d - r : d);
      std::shuffle(axes.begin(), axes.end(), rng_);
    }
    const bool keep = P(0.5);
    Shape y;
    int64_t n = 1;
    for (int d = 0; d < r; ++d) {
      if (!red[static_cast<size_t>(d)])
        y.push_back(shape(x)[static_cast<size_t>(d)]);
      else {
        n *= shape(x)[static_cast<size_t>(d)];
        if (keep) y.push_back(1);
      }
    }
    std::vector<int> ins = {x};
    std::map<std::string, AttrValue> at = {{"keepdims", int64_t{keep}}};
    if (!all) {
      if (op == "ReduceSum")
        ins.push_back(const_i64(axes));
      else
        at["axes"] = axes;
    }
    tag(op + (keep ? ":keepdims=1" : ":keepdims=0"));
    if (all) tag(op + ":all-axes");
    const double s = info(x).scale;
    if (op == "ReduceProd" && (n > 6 || s > 1.5)) throw Reject{};
    emit1(op, ins, DType::kFloat32, y, at,
          Info{(op == "ReduceMax" || op == "ReduceMin") && info(x).exact, false,
               op == "ReduceSum" || op == "ReduceL2" ? s * std::sqrt(double(n)) * 1.5
               : op == "ReduceLogSumExp"             ? s + std::log(double(n)) + 1
                                                     : s,
               0});
    return true;
  }

  bool op_transpose() {
    int x = need_float([&](int v) { return rank(v) >= 2; });
    const int r = rank(x);
    std::vector<int64_t> perm(static_cast<size_t>(r));
    for (int i = 0; i < r; ++i) perm[static_cast<size_t>(i)] = i;
    std::map<std::string, AttrValue> at;
    Shape y(static_cast<size_t>(r));
    if (P(0.15)) {
      std::reverse(perm.begin(), perm.end());
      tag("Transpose:default-perm");
    } else {
      std::shuffle(perm.begin(), perm.end(), rng_);
      at["perm"] = perm;
    }
    for (int i = 0; i < r; ++i) y[static_cast<size_t>(i)] = shape(x)[static_cast<size_t>(perm[static_cast<size_t>(i)])];
    emit1("Transpose", {x}, DType::kFloat32, y, at, info(x));
    return true;
  }

  bool op_reshape() {
    int x = need_float([&](int v) { return num_elements(shape(v)) > 1; });
    const Shape s = shape(x);
    const int r = rank(x);
    Shape y;
    int mode = static_cast<int>(R(0, 3));
    if (mode == 0 && r >= 2) {  // merge adjacent dims
      int i = static_cast<int>(R(0, r - 2));
      y = s;
      y[static_cast<size_t>(i)] *= y[static_cast<size_t>(i) + 1];
      y.erase(y.begin() + i + 1);
      tag("Reshape:merge");
    } else if (mode <= 2 && r < 4) {  // split one dim
      std::vector<int> cand;
      for (int i = 0; i < r; ++i) {
        int64_t d = s[static_cast<size_t>(i)];
        for (int64_t f = 2; f < d; ++f)
          if (d % f == 0) {
            cand.push_back(i);
            break;
          }
      }
      if (cand.empty()) throw Reject{};
      int i = pick(cand);
      int64_t d = s[static_cast<size_t>(i)];
      std::vector<int64_t> fs;
      for (int64_t f = 2; f < d; ++f)
        if (d % f == 0) fs.push_back(f);
      int64_t f = pick(fs);
      y = s;
      y[static_cast<size_t>(i)] = f;
      y.insert(y.begin() + i + 1, d / f);
      tag("Reshape:split");
    } else {  // flatten, or a 2-D view
      int64_t n = num_elements(s);
      if (P(0.5) || r == 1) {
        y = {n};
        tag("Reshape:flatten");
      } else {
        y = {s[0], n / s[0]};
        tag("Reshape:2-D");
      }
    }
    if (y == s) throw Reject{};
    std::vector<int64_t> target(y.begin(), y.end());
    for (size_t i = 0; i < target.size(); ++i)
      if (i < s.size() && target[i] == s[i] && P(0.3)) target[i] = 0;
    if (P(0.3)) {
      size_t i = static_cast<size_t>(R(0, static_cast<int64_t>(target.size()) - 1));
      if (target[i] != 0) target[i] = -1, tag("Reshape:-1");
    }
    emit1("Reshape", {x, const_i64(target)}, DType::kFloat32, y, {}, info(x));
    return true;
  }

  bool op_unsqueeze() {
    int x = need_float([&](int v) { return rank(v) <= 3; });
    const int r = rank(x);
    const int k = static_cast<int>(R(1, std::min(2, 4 - r)));
    const int R2 = r + k;
    std::vector<int64_t> pos(static_cast<size_t>(R2));
    for (int i = 0; i < R2; ++i) pos[static_cast<size_t>(i)] = i;
    std::shuffle(pos.begin(), pos.end(), rng_);
    pos.resize(static_cast<size_t>(k));
    std::vector<char> is_new(static_cast<size_t>(R2), 0);
    for (int64_t p : pos) is_new[static_cast<size_t>(p)] = 1;
    Shape y;
    size_t j = 0;
    for (int i = 0; i < R2; ++i) y.push_back(is_new[static_cast<size_t>(i)] ? 1 : shape(x)[j++]);
    for (auto& p : pos)
      if (P(0.3)) p -= R2;
    emit1("Unsqueeze", {x, const_i64(pos)}, DType::kFloat32, y, {}, info(x));
    return true;
  }

  bool op_squeeze() {
    int x = need_float(
        [&](int v) { return std::count(sref(v).begin(), sref(v).end(), 1) > 0 && num_elements(shape(v)) > 1; });
    const int r = rank(x);
    std::vector<int64_t> axes;
    const bool noaxes = P(0.15);
    std::vector<char> sq(static_cast<size_t>(r), 0);
    for (int d = 0; d < r; ++d)
      if (shape(x)[static_cast<size_t>(d)] == 1 && (noaxes || P(0.6))) sq[static_cast<size_t>(d)] = 1;
    if (!noaxes && std::find(sq.begin(), sq.end(), 1) == sq.end())
      for (int d = 0; d < r; ++d)
        if (shape(x)[static_cast<size_t>(d)] == 1) {
          sq[static_cast<size_t>(d)] = 1;
          break;
        }
    Shape y;
    for (int d = 0; d < r; ++d) {
      if (sq[static_cast<size_t>(d)])
        axes.push_back(P(0.3) ? d - r : d);
      else
        y.push_back(shape(x)[static_cast<size_t>(d)]);
    }
    std::vector<int> ins = {x};
    if (!noaxes)
      ins.push_back(const_i64(axes));
    else
      tag("Squeeze:no-axes");
    emit1("Squeeze", ins, DType::kFloat32, y, {}, info(x));
    return true;
  }

  bool op_concat() {
    int x = need_float([&](int v) { return rank(v) >= 1; });
    const Shape s = shape(x);
    const int r = rank(x);
    const int64_t axis = R(0, r - 1);
    std::vector<int> ins = {x};
    const int n = P(0.25) ? 3 : 2;
    for (int k = 1; k < n; ++k) {
      int o = -1;
      if (P(0.5))
        o = pick_float([&](int v) {
          if (rank(v) != r) return false;
          for (int d = 0; d < r; ++d)
            if (d != axis && shape(v)[static_cast<size_t>(d)] != s[static_cast<size_t>(d)]) return false;
          return true;
        });
      if (o < 0) {
        Shape os = s;
        os[static_cast<size_t>(axis)] = R(1, 5);
        o = (P(0.2) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(os) : new_weight(os, 1.0);
      }
      ins.push_back(o);
    }
    Shape y = s;
    y[static_cast<size_t>(axis)] = 0;
    bool exact = true;
    double sc = 0;
    for (int v : ins) {
      y[static_cast<size_t>(axis)] += shape(v)[static_cast<size_t>(axis)];
      exact = exact && info(v).exact;
      sc = std::max(sc, info(v).scale);
    }
    int64_t ax = P(0.3) ? axis - r : axis;
    if (n == 3) tag("Concat:3-way");
    emit1("Concat", ins, DType::kFloat32, y, {{"axis", ax}}, Info{exact, false, sc, 0});
    return true;
  }

  /// ONNX Slice output length of one axis.
  static int64_t slice_len(int64_t d, int64_t start, int64_t end, int64_t step) {
    if (start < 0) start += d;
    if (end < 0) end += d;
    if (step > 0) {
      start = std::clamp<int64_t>(start, 0, d);
      end = std::clamp<int64_t>(end, 0, d);
      return end > start ? (end - start + step - 1) / step : 0;
    }
    start = std::clamp<int64_t>(start, 0, d - 1);
    end = std::clamp<int64_t>(end, -1, d - 1);
    return start > end ? (start - end + (-step) - 1) / (-step) : 0;
  }

  bool op_slice() {
    int x = need_float([&](int v) { return rank(v) >= 1 && num_elements(shape(v)) > 1; });
    const Shape s = shape(x);
    const int r = rank(x);
    std::vector<int> dims;
    for (int d = 0; d < r; ++d) dims.push_back(d);
    std::shuffle(dims.begin(), dims.end(), rng_);
    dims.resize(static_cast<size_t>(R(1, r)));
    const bool with_axes = P(0.8);
    if (!with_axes) {  // axes default to 0..k-1
      std::sort(dims.begin(), dims.end());
      for (size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<int>(i);
    }
    std::vector<int64_t> starts, ends, axes, steps;
    bool nonunit = false;
    Shape y = s;
    for (int d : dims) {
      const int64_t n = s[static_cast<size_t>(d)];
      int64_t st = 0, en = 0, step = 1, len = 0;
      for (int tries = 0; tries < 20 && len < 1; ++tries) {
        double u = std::uniform_real_distribution<double>(0, 1)(rng_);
        step = u < 0.65 ? 1 : u < 0.8 ? 2 : u < 0.95 ? -1 : 3;
        if (step > 0) {
          st = R(0, n - 1);
          en = P(0.2) ? (P(0.5) ? n + R(0, 5) : int64_t{1} << 40) : R(st + 1, n);
        } else {
          st = P(0.2) ? n + R(0, 3) : R(0, n - 1);
          en = P(0.3) ? -(n + 1 + R(0, 3)) : R(-1, std::min(st, n - 1) - 1);
          if (en == -1) en = -(n + 1);  // -1 would mean the last element
        }
        if (P(0.3) && st >= 0 && st < n) st -= n;  // same position, negative form
        len = slice_len(n, st, en, step);
      }
      if (len < 1) throw Reject{};
      if (step != 1) nonunit = true;
      if (step < 0) tag("Slice:negative-step");
      if (step > 1) tag("Slice:step>1");
      starts.push_back(st);
      ends.push_back(en);
      axes.push_back(P(0.2) ? d - r : d);
      steps.push_back(step);
      y[static_cast<size_t>(d)] = len;
    }
    if (y == s && P(0.7)) throw Reject{};
    std::vector<int> ins = {x, const_i64(starts), const_i64(ends)};
    if (with_axes || nonunit || P(0.3)) ins.push_back(with_axes ? const_i64(axes) : -1);
    if (nonunit || P(0.3)) {
      if (ins.size() < 4) ins.push_back(-1);
      ins.push_back(const_i64(steps));
    }
    if (!with_axes) tag("Slice:default-axes");
    emit1("Slice", ins, DType::kFloat32, y, {}, info(x));
    return true;
  }

  bool op_split() {
    int x = need_float(
        [&](int v) { return std::any_of(sref(v).begin(), sref(v).end(), [](int64_t d) { return d >= 2; }); });
    const Shape s = shape(x);
    const int r = rank(x);
    std::vector<int> cand;
    for (int d = 0; d < r; ++d)
      if (s[static_cast<size_t>(d)] >= 2) cand.push_back(d);
    const int axis = pick(cand);
    const int64_t n = s[static_cast<size_t>(axis)];
    const int k = static_cast<int>(R(2, std::min<int64_t>(3, n)));
    std::vector<int64_t> sizes;
    std::vector<int> ins = {x};
    if (n % k == 0 && P(0.3)) {
      sizes.assign(static_cast<size_t>(k), n / k);
      tag("Split:equal-no-input");
    } else {
      // k positive parts summing to n.
      std::vector<int64_t> cuts;
      for (int64_t i = 1; i < n; ++i) cuts.push_back(i);
      std::shuffle(cuts.begin(), cuts.end(), rng_);
      cuts.resize(static_cast<size_t>(k - 1));
      std::sort(cuts.begin(), cuts.end());
      int64_t prev = 0;
      for (int64_t c : cuts) sizes.push_back(c - prev), prev = c;
      sizes.push_back(n - prev);
      ins.push_back(const_i64(sizes));
    }
    std::vector<std::pair<DType, Shape>> outs;
    for (int64_t z : sizes) {
      Shape y = s;
      y[static_cast<size_t>(axis)] = z;
      outs.push_back({DType::kFloat32, y});
    }
    emit("Split", ins, outs, {{"axis", int64_t{P(0.3) ? axis - r : axis}}}, info(x));
    return true;
  }

  bool op_gather() {
    int data;
    int64_t axis = 0;
    if (P(0.6)) {
      data = new_weight({R(2, 12), R(1, 8)}, 1.0);
      tag("Gather:embedding");
    } else {
      data = need_float([&](int v) { return rank(v) >= 1; });
      axis = R(0, rank(data) - 1);
      tag("Gather:axis" + std::to_string(axis));
    }
    const int64_t hi = shape(data)[static_cast<size_t>(axis)];
    int ids = -1;
    for (int v : ids_)
      if (info(v).ids_hi <= hi && P(0.5)) ids = v;
    if (ids < 0) {
      Shape is = rand_shape(static_cast<int>(R(1, 2)), 40);
      ids = new_ids(is, hi);
    }
    const Shape ds = shape(data);
    Shape y(ds.begin(), ds.begin() + axis);
    for (int64_t d : shape(ids)) y.push_back(d);
    y.insert(y.end(), ds.begin() + axis + 1, ds.end());
    std::map<std::string, AttrValue> at;
    if (axis != 0 || P(0.3)) at["axis"] = int64_t{P(0.3) ? axis - static_cast<int64_t>(ds.size()) : axis};
    emit1("Gather", {data, ids}, DType::kFloat32, y, at, info(data));
    return true;
  }

  static int64_t window_out(int64_t in, int64_t k, int64_t s, int64_t d, int64_t pb, int64_t pe, bool ceil_mode) {
    const int64_t span = in + pb + pe - d * (k - 1) - 1;
    if (span < 0) return 0;
    int64_t o = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
    if (ceil_mode && (o - 1) * s >= in + pb) --o;
    return o;
  }

  bool op_conv() {
    int x = need_image();
    const Shape xs = shape(x);
    const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
    int64_t G = 1, O;
    double u = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (u < 0.25 && C > 1) {
      G = C;
      O = C * R(1, 2);
      tag("Conv:depthwise");
    } else if (u < 0.45) {
      std::vector<int64_t> gs;
      for (int64_t g = 2; g < C; ++g)
        if (C % g == 0) gs.push_back(g);
      if (gs.empty()) throw Reject{};
      G = pick(gs);
      O = G * R(1, 3);
      tag("Conv:grouped");
    } else {
      O = R(1, 6);
    }
    const int64_t kh = R(1, 3), kw = R(1, 3);
    const int64_t sh = P(0.3) ? 2 : 1, sw = P(0.3) ? 2 : 1;
    const int64_t dh = P(0.1) ? 2 : 1, dw = P(0.1) ? 2 : 1;
    std::vector<int64_t> pads = {R(0, kh - 1), R(0, kw - 1), R(0, kh - 1), R(0, kw - 1)};
    const int64_t Ho = window_out(H, kh, sh, dh, pads[0], pads[2], false);
    const int64_t Wo = window_out(W, kw, sw, dw, pads[1], pads[3], false);
    if (Ho < 1 || Wo < 1) throw Reject{};
    const int64_t fan = (C / G) * kh * kw;
    int w = new_weight({O, C / G, kh, kw}, 1.7 / std::sqrt(double(fan)));
    std::vector<int> ins = {x, w};
    if (P(0.5)) ins.push_back(new_weight({O}, 1.0)), tag("Conv:bias");
    std::map<std::string, AttrValue> at = {{"kernel_shape", std::vector<int64_t>{kh, kw}}};
    if (sh != 1 || sw != 1 || P(0.3)) at["strides"] = std::vector<int64_t>{sh, sw};
    if (sh != 1 || sw != 1) tag("Conv:stride2");
    if (dh != 1 || dw != 1) at["dilations"] = std::vector<int64_t>{dh, dw}, tag("Conv:dilation2");
    if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; })) at["pads"] = pads, tag("Conv:pads");
    if (G != 1) at["group"] = G;
    if (kh == 1 && kw == 1) tag("Conv:1x1");
    emit1("Conv", ins, DType::kFloat32, {N, O, Ho, Wo}, at, Info{false, false, info(x).scale + 0.6, 0});
    return true;
  }

  bool op_pool(const std::string& op) {
    int x = need_image();
    const Shape xs = shape(x);
    const int64_t kh = R(1, 3), kw = R(1, 3);
    const int64_t sh = R(1, 2), sw = R(1, 2);
    std::vector<int64_t> pads = {R(0, kh - 1), R(0, kw - 1), R(0, kh - 1), R(0, kw - 1)};
    const bool ceil_mode = P(0.15);
    const int64_t Ho = window_out(xs[2], kh, sh, 1, pads[0], pads[2], ceil_mode);
    const int64_t Wo = window_out(xs[3], kw, sw, 1, pads[1], pads[3], ceil_mode);
    if (Ho < 1 || Wo < 1) throw Reject{};
    std::map<std::string, AttrValue> at = {{"kernel_shape", std::vector<int64_t>{kh, kw}}};
    if (sh != 1 || sw != 1 || P(0.3)) at["strides"] = std::vector<int64_t>{sh, sw};
    if (std::any_of(pads.begin(), pads.end(), [](int64_t p) { return p != 0; })) at["pads"] = pads, tag(op + ":pads");
    if (ceil_mode) at["ceil_mode"] = int64_t{1}, tag(op + ":ceil_mode");
    if (op == "AveragePool" && P(0.5)) at["count_include_pad"] = int64_t{1}, tag(op + ":count_include_pad");
    if (sh == 2 || sw == 2) tag(op + ":stride2");
    emit1(op, {x}, DType::kFloat32, {xs[0], xs[1], Ho, Wo}, at,
          Info{op == "MaxPool" && info(x).exact, false, info(x).scale, 0});
    return true;
  }

  bool op_gap() {
    int x = need_image();
    const Shape xs = shape(x);
    emit1("GlobalAveragePool", {x}, DType::kFloat32, {xs[0], xs[1], 1, 1}, {}, Info{false, false, info(x).scale, 0});
    return true;
  }

  bool op_einsum() {
    int p = static_cast<int>(R(0, 6));
    std::string eq;
    std::vector<int> ins;
    Shape y;
    double sc = 1;
    auto small = [&](int v) { return info(v).scale < 5; };
    if (p == 0) {  // ij,jk->ik
      int a = need_float([&](int v) { return rank(v) == 2 && small(v); });
      int64_t K = shape(a)[1], N = rdim();
      ins = {a, new_weight({K, N}, 1.7 / std::sqrt(double(K)))};
      eq = "ij,jk->ik";
      y = {shape(a)[0], N};
      sc = info(a).scale * 1.2;
    } else if (p == 1) {  // bij,bjk->bik
      int a = need_float([&](int v) { return rank(v) == 3 && small(v); });
      const Shape as = shape(a);
      int64_t N = rdim();
      Shape bs = {as[0], as[2], N};
      ins = {a, (P(0.4) && n_float_inputs_ < opt_.max_float_inputs) ? new_input(bs)
                                                                    : new_weight(bs, 1.7 / std::sqrt(double(as[2])))};
      eq = "bij,bjk->bik";
      y = {as[0], as[1], N};
      sc = info(a).scale * info(ins[1]).scale * std::sqrt(double(as[2]));
    } else if (p == 2) {  // bsh,hf->bsf
      int a = need_float([&](int v) { return rank(v) == 3 && small(v); });
      const Shape as = shape(a);
      int64_t F = rdim();
      ins = {a, new_weight({as[2], F}, 1.7 / std::sqrt(double(as[2])))};
      eq = "bsh,hf->bsf";
      y = {as[0], as[1], F};
      sc = info(a).scale * 1.2;
    } else if (p == 3) {  // ij->ji
      int a = need_float([&](int v) { return rank(v) == 2; });
      ins = {a};
      eq = "ij->ji";
      y = {shape(a)[1], shape(a)[0]};
      sc = info(a).scale;
    } else if (p == 4) {  // bij->bj (sum over i)
      int a = need_float([&](int v) { return rank(v) == 3 && small(v); });
      ins = {a};
      eq = "bij->bj";
      y = {shape(a)[0], shape(a)[2]};
      sc = info(a).scale * std::sqrt(double(shape(a)[1])) * 1.5;
    } else if (p == 5) {  // ij,ij->i
      int a = need_float([&](int v) { return rank(v) == 2 && small(v); });
      int b = pick_float([&](int v) { return v != a && shape(v) == shape(a) && small(v); });
      if (b < 0) b = new_weight(shape(a), 1.0);
      ins = {a, b};
      eq = "ij,ij->i";
      y = {shape(a)[0]};
      sc = info(a).scale * info(b).scale * std::sqrt(double(shape(a)[1]));
    } else {  // ...ij,jk->...ik
      int a = need_float([&](int v) { return rank(v) >= 2 && small(v); });
      const Shape as = shape(a);
      int64_t K = as.back(), N = rdim();
      ins = {a, new_weight({K, N}, 1.7 / std::sqrt(double(K)))};
      eq = "...ij,jk->...ik";
      y = as;
      y.back() = N;
      sc = info(a).scale * 1.2;
    }
    tag("Einsum:" + eq);
    emit1("Einsum", ins, DType::kFloat32, y, {{"equation", eq}}, Info{false, false, sc, 0});
    return true;
  }

  bool op_variadic(const std::string& op) {
    int a = need_float();
    std::vector<int> ins = {a};
    Shape y = shape(a);
    const int n = P(0.5) ? 3 : 2;
    bool exact = info(a).exact;
    double sc = info(a).scale * info(a).scale;
    for (int k = 1; k < n; ++k) {
      int b = partner(
          a, [&](int v) { return broadcast(y, shape(v)).has_value(); }, false);
      auto yy = broadcast(y, shape(b));
      if (!yy) throw Reject{};
      y = *yy;
      ins.push_back(b);
      exact = exact && info(b).exact;
      sc += info(b).scale * info(b).scale;
    }
    std::shuffle(ins.begin(), ins.end(), rng_);
    tag(op + ":" + std::to_string(n) + "-way");
    emit1(op, ins, DType::kFloat32, y, {}, Info{op == "Max" && exact, false, std::sqrt(sc), 0});
    return true;
  }

  // ---- outputs, pruning, annotations, inputs
  TensorSharding rand_sharding(const Shape& s, bool allow_unreduced) {
    const int r = static_cast<int>(s.size());
    TensorSharding t = TensorSharding::replicated(r);
    std::vector<int> axes;
    for (int a = 0; a < mesh_.rank(); ++a) axes.push_back(a);
    std::shuffle(axes.begin(), axes.end(), rng_);
    for (int a : axes) {
      double u = std::uniform_real_distribution<double>(0, 1)(rng_);
      if (r > 0 && u < 0.6) {
        // Prefer dims of size > 1, but sometimes split a size-1 dim too.
        std::vector<int> dims;
        for (int d = 0; d < r; ++d)
          for (int w = 0; w < (s[static_cast<size_t>(d)] > 1 ? 6 : 1); ++w) dims.push_back(d);
        t.dims[static_cast<size_t>(pick(dims))].push_back(a);
      } else if (allow_unreduced && u < 0.72) {
        t.unreduced.push_back(a);
      }
    }
    std::sort(t.unreduced.begin(), t.unreduced.end());
    return t;
  }

  void finish() {
    Graph& g = c_.g;
    // Outputs: every node output nothing consumes, plus some consumed ones.
    std::set<int> outs;
    for (const Node& n : g.nodes)
      for (int o : n.outputs)
        if (!uses_.count(o) || P(0.12)) outs.insert(o);
    g.outputs.assign(outs.begin(), outs.end());
    // Drop unused inputs (a failed op may have created one), then unused initializers.
    std::set<int> used;
    for (const Node& n : g.nodes)
      for (int i : n.inputs)
        if (i >= 0) used.insert(i);
    std::vector<int> keep_inputs;
    for (int v : g.inputs)
      if (used.count(v)) keep_inputs.push_back(v);
    std::map<std::string, Info> by_name;
    for (const auto& [v, inf] : info_) by_name[g.values[static_cast<size_t>(v)].name] = inf;
    g.inputs = keep_inputs;
    g.prune();
    g.verify();

    // Annotations.
    c_.ann.mesh = mesh_;
    int n_unreduced = 0;
    for (int v = 0; v < static_cast<int>(g.values.size()); ++v) {
      const Value& x = g.values[static_cast<size_t>(v)];
      const bool is_input = std::find(g.inputs.begin(), g.inputs.end(), v) != g.inputs.end();
      const bool is_weight = x.is_initializer && x.name[0] == 'w';
      double p = is_input || is_weight ? 0.5 : x.is_initializer ? 0.0 : 0.3;
      if (x.shape.empty() || !P(p)) continue;
      const bool unred = x.dtype == DType::kFloat32 && (is_input || opt_.stress);
      TensorSharding s = rand_sharding(x.shape, unred && P(0.3));
      // Non-sum partial values only where they are given (inputs, weights): a node output annotated as a max/min/prod
      // partial is a known gap (partition throws "reshard of 't' did not reach its target"; docs/testing.md).
      if (!s.unreduced.empty() && opt_.stress && (is_input || is_weight) && P(0.4)) {
        s.reduction = pick(std::vector<ReductionKind>{ReductionKind::kMax, ReductionKind::kMin, ReductionKind::kProd});
        tag("ann:unreduced-" + std::string(reduction_name(s.reduction)));
      }
      if (!s.unreduced.empty() && !is_input) tag("ann:unreduced-non-input");
      if (!s.unreduced.empty()) ++n_unreduced;
      const int prio = P(0.15) ? static_cast<int>(R(1, 2)) : 0;
      if (prio) tag("ann:priority>0");
      c_.ann.by_value[v] = Annotation{s, prio, "random"};
      for (const auto& d : s.dims)
        if (d.size() >= 2) tag("ann:2-axes-on-a-dim");
      if (s.is_uneven(x.shape, mesh_)) tag("ann:uneven");
      if (!x.is_initializer && !is_input) tag("ann:intermediate");
    }
    if (n_unreduced) tag("ann:unreduced-input");

    // Inputs.
    for (int v : g.inputs) {
      const Value& x = g.values[static_cast<size_t>(v)];
      Tensor t(x.dtype, x.shape);
      if (x.dtype == DType::kInt64) {
        const int64_t hi = std::max<int64_t>(1, by_name[x.name].ids_hi);
        for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = R(0, hi - 1);
      } else {
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng_);
      }
      c_.inputs.push_back(std::move(t));
    }
    // Keep only the tags of nodes that survived pruning (op tags are re-derived from the graph by callers).
  }
};

}  // namespace detail

/// Generates the case of `seed` (deterministic).
inline RandomCase generate_case(uint64_t seed, const GenOptions& opt = {}) {
  return detail::Generator(seed, opt).run();
}

/// The training step of case `c` (docs/training.md): the loss is the sum of its first floating-point output, the
/// weights are its float weights (the generator's "w..." initializers), the annotations are carried over by name and
/// the step's inputs are the case's. nullopt when there is no float output or no weight reaches it, or when an op
/// on the way has no gradient rule (`why` says which). `remat`: the step's rematerialization policy (tag "remat-...").
inline std::optional<RandomCase> training_case(const RandomCase& c, std::string* why = nullptr,
                                               RematPolicy remat = RematPolicy::kNone) {
  Graph g = c.g;
  int out = -1;
  for (int o : g.outputs)
    if (out < 0 && is_floating(g.values[static_cast<size_t>(o)].dtype)) out = o;
  if (out < 0) return std::nullopt;
  g.outputs = {out};
  TrainingOptions o;
  o.loss = LossKind::kSum;
  o.remat = remat;
  for (const Value& v : g.values)
    if (v.is_initializer && is_floating(v.dtype) && !v.name.empty() && v.name[0] == 'w') o.trainable.push_back(v.name);
  if (o.trainable.empty()) return std::nullopt;
  RandomCase t;
  try {
    TrainingStep step = build_training_step(
        g, o,
        [](const Node& n, const std::vector<const TensorType*>& types, const std::vector<const Tensor*>& values,
           int64_t opset) { return infer_types(n, types, values, opset, &kernel_evaluator()); });
    t.g = std::move(step.graph);
  } catch (const InputError& e) {
    if (why) *why = e.what();
    return std::nullopt;
  }
  t.seed = c.seed;
  t.ann.mesh = c.ann.mesh;
  for (const auto& [v, a] : c.ann.by_value) {
    const int id = t.g.find(c.g.values[static_cast<size_t>(v)].name);
    if (id >= 0) t.ann.by_value.emplace(id, a);
  }
  for (int v : t.g.inputs) {
    const std::string& name = t.g.values[static_cast<size_t>(v)].name;
    for (size_t k = 0; k < c.g.inputs.size(); ++k)
      if (c.g.values[static_cast<size_t>(c.g.inputs[k])].name == name) t.inputs.push_back(c.inputs[k]);
  }
  t.tags = c.tags;
  t.tags.push_back("training");
  if (remat != RematPolicy::kNone) t.tags.push_back("remat-" + std::string(remat_name(remat)));
  return t;
}

// ---------------------------------------------------------------------------------------------------------------
// Checking

struct CheckResult {
  enum Status { kPass, kFail, kUnsupported } status = kPass;
  std::string stage;  // "reference", "propagate", "partition", "run_spmd", "compare"
  std::string why;
  int collectives = 0;
  std::vector<std::string> sharded;  // coverage: "sharded:<op>" for nodes touching a tiled/unreduced value,
                                     // "split-spatial:<op>" for Conv/pools whose input is split on H or W
};

/// propagate -> partition -> run_spmd, compared with run_single. UnsupportedError anywhere => kUnsupported.
inline CheckResult check_case(const Graph& g, const Annotations& user_ann, const std::vector<Tensor>& inputs) {
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

/// A coarse failure signature used to keep reductions on the same bug: the stage plus the message with numbers
/// and quoted names removed.
inline std::string failure_signature(const CheckResult& r) {
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

// ---------------------------------------------------------------------------------------------------------------
// Dump

inline std::string attr_str(const AttrValue& a) {
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

/// Readable dump: mesh, inputs, initializers (int constants with their values), nodes, outputs, annotations.
inline std::string dump(const Graph& g, const Annotations& ann) {
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

/// Coverage keys of a case: its nodes' op types plus the generator's variant tags (for ops that survived pruning).
inline std::vector<std::string> coverage_keys(const RandomCase& c) {
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

// ---------------------------------------------------------------------------------------------------------------
// Reduction of failing cases

namespace detail {

/// Keeps outputs `outs` (value names), prunes, drops unused inputs, remaps annotations and input tensors by name.
inline Repro restrict_outputs(const Repro& r, const std::vector<std::string>& outs) {
  Repro n;
  n.g = r.g;
  std::map<std::string, Tensor> in_by_name;
  for (size_t i = 0; i < r.g.inputs.size(); ++i)
    in_by_name[r.g.values[static_cast<size_t>(r.g.inputs[i])].name] = r.inputs[i];
  std::map<std::string, Annotation> ann_by_name;
  for (const auto& [v, a] : r.ann.by_value) ann_by_name[r.g.values[static_cast<size_t>(v)].name] = a;
  n.g.outputs.clear();
  for (const auto& o : outs) n.g.outputs.push_back(n.g.at(o));
  // Inputs nothing reaches from the outputs are dropped: prune, then rebuild the input list.
  n.g.prune();
  std::set<int> used;
  for (const Node& x : n.g.nodes)
    for (int i : x.inputs)
      if (i >= 0) used.insert(i);
  for (int o : n.g.outputs) used.insert(o);
  std::vector<int> ins;
  for (int v : n.g.inputs)
    if (used.count(v)) ins.push_back(v);
  n.g.inputs = ins;
  n.g.prune();
  for (int v : n.g.inputs) n.inputs.push_back(in_by_name.at(n.g.values[static_cast<size_t>(v)].name));
  n.ann.mesh = r.ann.mesh;
  for (auto& [name, a] : ann_by_name) {
    int v = n.g.find(name);
    if (v >= 0) n.ann.by_value[v] = a;
  }
  return n;
}

inline std::vector<std::string> output_names(const Graph& g) {
  std::vector<std::string> o;
  for (int v : g.outputs) o.push_back(g.values[static_cast<size_t>(v)].name);
  return o;
}

/// Replaces the single-output node producing `v` by a graph input holding v's reference value.
inline std::optional<Repro> cut_at(const Repro& r, int v) {
  const int prod = r.g.values[static_cast<size_t>(v)].producer;
  if (prod < 0 || r.g.nodes[static_cast<size_t>(prod)].outputs.size() != 1) return std::nullopt;
  Graph probe = r.g;
  probe.outputs = {v};
  Tensor val;
  try {
    val = run_single(probe, r.inputs).outputs.at(0);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  Repro n = r;
  n.g.nodes.erase(n.g.nodes.begin() + prod);
  for (auto& x : n.g.values) x.producer = -1;
  for (size_t k = 0; k < n.g.nodes.size(); ++k)
    for (int o : n.g.nodes[k].outputs) n.g.values[static_cast<size_t>(o)].producer = static_cast<int>(k);
  n.g.inputs.push_back(v);
  n.inputs.push_back(std::move(val));
  return restrict_outputs(n, output_names(n.g));
}

inline TensorSharding drop_axis(const TensorSharding& s, int axis, bool renumber) {
  TensorSharding t = s;
  auto fix = [&](std::vector<int>& l) {
    l.erase(std::remove(l.begin(), l.end(), axis), l.end());
    if (renumber)
      for (int& a : l)
        if (a > axis) --a;
  };
  for (auto& d : t.dims) fix(d);
  fix(t.unreduced);
  if (t.unreduced.empty()) t.reduction = ReductionKind::kSum;  // as the sharding file loader would leave it
  return t;
}

}  // namespace detail

/// Greedy reduction of a failing case keeping its failure signature: fewer outputs, upstream nodes cut into inputs,
/// fewer annotations and axes, smaller meshes. `budget` bounds the number of checks.
inline Repro reduce_repro(Repro r, const CheckResult& failure, int budget = 400) {
  const std::string sig = failure_signature(failure);
  auto still_fails = [&](const Repro& c) {
    if (budget-- <= 0) return false;
    CheckResult x = check_case(c.g, c.ann, c.inputs);
    return x.status == CheckResult::kFail && failure_signature(x) == sig;
  };
  bool changed = true;
  while (changed && budget > 0) {
    changed = false;
    // 1. A single output, earliest first.
    if (r.g.outputs.size() > 1 || !r.g.nodes.empty()) {
      for (int v = 0; v < static_cast<int>(r.g.values.size()); ++v) {
        if (r.g.values[static_cast<size_t>(v)].producer < 0) continue;
        if (r.g.outputs.size() == 1 && r.g.outputs[0] == v) break;
        Repro c = detail::restrict_outputs(r, {r.g.values[static_cast<size_t>(v)].name});
        if (c.g.nodes.size() < r.g.nodes.size() || (c.g.nodes.size() == r.g.nodes.size() && r.g.outputs.size() > 1)) {
          if (still_fails(c)) {
            r = std::move(c);
            changed = true;
            break;
          }
        }
      }
    }
    // 2. Cut producers into inputs.
    for (size_t k = 0; k < r.g.nodes.size() && r.g.nodes.size() > 1; ++k) {
      for (int in : r.g.nodes[k].inputs) {
        if (in < 0 || r.g.values[static_cast<size_t>(in)].producer < 0) continue;
        auto c = detail::cut_at(r, in);
        if (c && c->g.nodes.size() < r.g.nodes.size() && still_fails(*c)) {
          r = std::move(*c);
          changed = true;
          break;
        }
      }
      if (changed) break;
    }
    if (changed) continue;
    // 3. Fewer annotations, then fewer axes per annotation.
    for (auto it = r.ann.by_value.begin(); it != r.ann.by_value.end(); ++it) {
      Repro c = r;
      c.ann.by_value.erase(it->first);
      if (still_fails(c)) {
        r = std::move(c);
        changed = true;
        break;
      }
    }
    if (changed) continue;
    for (auto& [v, a] : r.ann.by_value) {
      for (int ax = 0; ax < r.ann.mesh.rank() && !changed; ++ax) {
        TensorSharding t = detail::drop_axis(a.sharding, ax, false);
        if (t == a.sharding) continue;
        Repro c = r;
        c.ann.by_value[v].sharding = t;
        if (still_fails(c)) {
          r = std::move(c);
          changed = true;
        }
      }
      if (changed) break;
    }
    if (changed) continue;
    // 4. Smaller meshes: drop an axis, or shrink it to 2.
    for (int ax = 0; ax < r.ann.mesh.rank() && !changed; ++ax) {
      if (r.ann.mesh.rank() > 1) {
        Repro c = r;
        c.ann.mesh.shape.erase(c.ann.mesh.shape.begin() + ax);
        c.ann.mesh.axes.erase(c.ann.mesh.axes.begin() + ax);
        for (auto& [v, a] : c.ann.by_value) a.sharding = detail::drop_axis(a.sharding, ax, true);
        if (still_fails(c)) {
          r = std::move(c);
          changed = true;
          break;
        }
      }
      for (int64_t sz = 2; sz < r.ann.mesh.shape[static_cast<size_t>(ax)]; ++sz) {
        Repro c = r;
        c.ann.mesh.shape[static_cast<size_t>(ax)] = sz;
        if (still_fails(c)) {
          r = std::move(c);
          changed = true;
          break;
        }
      }
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------------------------------
// Running many cases

struct RunSummary {
  int passed = 0, failed = 0, unsupported = 0;
  int with_collectives = 0;  // passing cases whose program has at least one collective
  int64_t collectives = 0;
  std::map<std::string, int> coverage;  // key -> number of cases containing it
  std::vector<uint64_t> failing_seeds;
  std::vector<std::string> reports;  // one per failure (maybe truncated by max_reports)
  double seconds = 0;
};

/// Runs cases seed_base .. seed_base + n - 1. `report` formats each failure (seed, reason, dump, reduced dump).
inline RunSummary run_cases(uint64_t seed_base, int n, const GenOptions& opt, bool reduce, int max_reports,
                            const std::function<void(uint64_t, const CheckResult&)>& on_case = nullptr) {
  RunSummary s;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    const uint64_t seed = seed_base + static_cast<uint64_t>(i);
    RandomCase c = generate_case(seed, opt);
    std::set<std::string> keys;
    for (const auto& k : coverage_keys(c)) keys.insert(k);
    for (const auto& k : keys) ++s.coverage[k];
    CheckResult r = check_case(c.g, c.ann, c.inputs);
    for (const auto& k : std::set<std::string>(r.sharded.begin(), r.sharded.end())) ++s.coverage[k];
    if (on_case) on_case(seed, r);
    if (r.status == CheckResult::kPass) {
      ++s.passed;
      s.with_collectives += r.collectives > 0;
      s.collectives += r.collectives;
    } else if (r.status == CheckResult::kUnsupported)
      ++s.unsupported;
    else {
      ++s.failed;
      s.failing_seeds.push_back(seed);
      if (static_cast<int>(s.reports.size()) < max_reports) {
        std::ostringstream os;
        os << "seed " << seed << ": " << r.why << "\n" << dump(c.g, c.ann);
        if (reduce) {
          Repro m = reduce_repro(to_repro(c), r);
          CheckResult mr = check_case(m.g, m.ann, m.inputs);
          os << " reduced (" << m.g.nodes.size() << " nodes): " << mr.why << "\n" << dump(m.g, m.ann);
        }
        s.reports.push_back(os.str());
      }
    }
  }
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

inline std::string coverage_str(const std::map<std::string, int>& cov) {
  std::ostringstream os;
  int col = 0;
  for (const auto& [k, n] : cov) {
    std::string item = k + "=" + std::to_string(n);
    if (col + item.size() > 110) os << "\n", col = 0;
    os << (col ? "  " : "  ") << item;
    col += static_cast<int>(item.size()) + 2;
  }
  return os.str();
}

}  // namespace gspmd::difftest
