// Gradient rules (core/rules/gradient.h) against central finite differences. Each case builds a tiny forward graph
// whose float inputs are initializers (the weights), multiplies output 0 by a fixed random tensor R and sums it (by
// MatMuls with ones vectors), so the loss is sum(R * y) and its gradient w.r.t. a weight w is the vector-Jacobian
// product J_y(w)^T R. build_training_step differentiates it; the step graph, with every `<w>.grad` added as an output,
// runs unpartitioned (run_single), and each gradient element is compared with (loss(w + h) - loss(w - h)) / 2h computed
// by running the forward graph. Inputs stay away from the ops' kinks (Relu at 0, a pool window's runner-up, Clip's
// bounds) so that the finite difference is the derivative; exact ties are tested only where the rule splits evenly
// (Max, Min), which is what a central difference gives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "backend/kernels/kernels.h"
#include "backend/pod/pod.h"
#include "core/autodiff/autodiff.h"
#include "core/shapes/shapes.h"

namespace gspmd {
namespace {

const ShapeFunction kShapes = [](const Node& n, const std::vector<const TensorType*>& types,
                                 const std::vector<const Tensor*>& values,
                                 int64_t opset) { return infer_types(n, types, values, opset, &kernel_evaluator()); };

double get(const Tensor& t, int64_t i) {
  return t.dtype == DType::kFloat64 ? t.data<double>()[i] : static_cast<double>(t.data<float>()[i]);
}
void put(Tensor& t, int64_t i, double v) {
  if (t.dtype == DType::kFloat64)
    t.data<double>()[i] = v;
  else
    t.data<float>()[i] = static_cast<float>(v);
}

/// A float tensor of dtype `t` with values uniform in [lo, hi); with `gap` > 0, values in (-gap, gap) are pushed out
/// (away from a kink at 0).
Tensor rnd(DType t, const Shape& s, uint32_t seed, double lo = -1, double hi = 1, double gap = 0) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Tensor r(t, s);
  for (int64_t i = 0; i < r.numel(); ++i) {
    double v = d(g);
    if (gap > 0 && std::fabs(v) < gap) v = v < 0 ? v - gap : v + gap;
    put(r, i, v);
  }
  return r;
}

/// A forward graph under construction: weights (initializers with data), constants, nodes typed by the kernels'
/// shape functions.
struct Net {
  Graph g;
  DType dt;
  uint32_t seed = 1;
  explicit Net(DType t = DType::kFloat64, int64_t opset = 17) : dt(t) { g.opset = opset; }

  int init(const std::string& name, Tensor t) {
    Value v;
    v.name = name;
    v.dtype = t.dtype;
    v.shape = t.shape;
    v.is_initializer = true;
    v.data = std::make_shared<const Tensor>(std::move(t));
    return g.add_value(std::move(v));
  }
  /// A trainable weight of shape `s`, uniform in [lo, hi) (with `gap`, see rnd).
  int w(const std::string& name, const Shape& s, double lo = -1, double hi = 1, double gap = 0) {
    weights.push_back(name);
    return init(name, rnd(dt, s, seed++, lo, hi, gap));
  }
  int wt(const std::string& name, Tensor t) {
    weights.push_back(name);
    return init(name, std::move(t));
  }
  std::vector<int> node(const std::string& op, const std::vector<int>& in, std::map<std::string, AttrValue> attrs = {},
                        size_t outs = 1) {
    Node n;
    n.name = fmt::format("{}_{}", op, g.nodes.size());
    n.op_type = op;
    n.inputs = in;
    n.attrs = std::move(attrs);
    std::vector<TensorType> st(in.size());
    std::vector<const TensorType*> types;
    std::vector<const Tensor*> values;
    for (size_t k = 0; k < in.size(); ++k) {
      if (in[k] < 0) {
        types.push_back(nullptr);
        values.push_back(nullptr);
        continue;
      }
      const Value& v = g.values[static_cast<size_t>(in[k])];
      st[k] = {v.dtype, v.shape};
      types.push_back(&st[k]);
      values.push_back(v.is_initializer ? v.data.get() : nullptr);
    }
    const std::vector<TensorType> out = infer_types(n, types, values, g.opset, &kernel_evaluator());
    for (size_t k = 0; k < outs; ++k)
      n.outputs.push_back(g.add_value_unique(n.name + "_" + std::to_string(k), out.at(k).dtype, out.at(k).shape));
    const std::vector<int> ids = n.outputs;
    g.add_node(std::move(n));
    return ids;
  }
  int op(const std::string& o, const std::vector<int>& in, std::map<std::string, AttrValue> attrs = {}) {
    return node(o, in, std::move(attrs)).at(0);
  }
  std::vector<std::string> weights;
};

/// sum(output 0 of `g`) in double.
double total(const Graph& g) {
  const PodRun r = run_single(g, {});
  double s = 0;
  for (int64_t i = 0; i < r.outputs[0].numel(); ++i) s += get(r.outputs[0], i);
  return s;
}

/// Checks every weight's gradient of sum(R * y) (y = `y`, R random) against central differences: |g - fd| <=
/// atol + rtol |fd|. float64 nets use h = 1e-6, float32 ones h = 1e-2 with the tolerances given.
void check(Net& net, int y, double atol = 1e-6, double rtol = 1e-5) {
  Graph& g = net.g;
  const Value& yv = g.values[static_cast<size_t>(y)];
  const int r = net.init("R", rnd(yv.dtype, yv.shape, 999, -1, 1, 0.1));
  // The sum as MatMuls by ones vectors, last dim first ([.., c] x [c] -> [..]): LossKind::kSum's ReduceSum has no
  // gradient rule yet (reduce_norm.cc), and MatMul's 1-D forms get exercised on the way.
  int z = net.op("Mul", {y, r});
  for (int k = 0; !g.values[static_cast<size_t>(z)].shape.empty(); ++k) {
    const Value& zv = g.values[static_cast<size_t>(z)];
    Tensor ones(zv.dtype, {zv.shape.back()});
    for (int64_t i = 0; i < ones.numel(); ++i) put(ones, i, 1.0);
    z = net.op("MatMul", {z, net.init("ones" + std::to_string(k), std::move(ones))});
  }
  g.outputs = {z};

  TrainingOptions o;
  o.loss = LossKind::kOutput;
  o.trainable = net.weights;
  TrainingStep step = build_training_step(g, o, kShapes);
  ASSERT_TRUE(step.unused.empty()) << "weights without gradient: " << step.unused.front();
  ASSERT_EQ(step.weights.size(), net.weights.size());
  Graph sg = step.graph;
  for (const TrainingStep::Weight& w : step.weights) sg.outputs.push_back(sg.find(w.grad));
  const PodRun run = run_single(sg, {});

  const bool f64 = net.dt == DType::kFloat64;
  const double h = f64 ? 1e-6 : 1e-2;
  for (size_t k = 0; k < step.weights.size(); ++k) {
    const std::string& name = step.weights[k].name;
    const Tensor& grad = run.outputs[1 + step.weights.size() + k];
    const int wid = g.find(name);
    const std::shared_ptr<const Tensor> orig = g.values[static_cast<size_t>(wid)].data;
    ASSERT_EQ(grad.shape, orig->shape) << name;
    int bad = 0;
    for (int64_t i = 0; i < orig->numel(); ++i) {
      double f[2];
      for (int side = 0; side < 2; ++side) {
        Tensor t = *orig;
        put(t, i, get(*orig, i) + (side ? -h : h));
        g.values[static_cast<size_t>(wid)].data = std::make_shared<const Tensor>(std::move(t));
        f[side] = total(g);
      }
      const double fd = (f[0] - f[1]) / (2 * h), got = get(grad, i);
      if (std::fabs(got - fd) > atol + rtol * std::fabs(fd) && bad++ < 5)
        ADD_FAILURE() << fmt::format("d loss / d {}[{}]: rule gives {:.9g}, finite difference {:.9g}", name, i, got,
                                     fd);
    }
    g.values[static_cast<size_t>(wid)].data = orig;
    EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << orig->numel() << " elements differ";
  }
}

using Attrs = std::map<std::string, AttrValue>;
using I64s = std::vector<int64_t>;

// ---- elementwise ----

TEST(GradientRules, BinaryBroadcast) {
  for (const char* op : {"Add", "Sub", "Mul", "Div"}) {
    SCOPED_TRACE(op);
    Net n;
    const int a = n.w("a", {2, 3, 4});
    const int b = std::string(op) == "Div" ? n.w("b", {3, 1}, 0.5, 1.5) : n.w("b", {3, 1});
    check(n, n.op(op, {a, b}));
  }
  Net n;  // a scalar and a leading-rank broadcast
  const int a = n.w("a", {4});
  const int b = n.w("b", {2, 1, 4});
  const int s = n.w("s", {});
  check(n, n.op("Mul", {n.op("Add", {a, b}), s}));
}

TEST(GradientRules, Pow) {
  Net n;
  const int a = n.w("a", {2, 3}, 0.5, 1.5);
  const int b = n.w("b", {3}, -1, 2);
  check(n, n.op("Pow", {a, b}));
}

TEST(GradientRules, Where) {
  Net n;
  Tensor cond(DType::kBool, {2, 3, 4});
  for (int64_t i = 0; i < cond.numel(); ++i) cond.data<bool>()[i] = (i * 7) % 3 == 0;
  const int c = n.init("cond", cond);
  const int a = n.w("a", {2, 3, 4});
  const int b = n.w("b", {3, 1});
  check(n, n.op("Where", {c, a, b}));
}

/// One case per unary op: (op, attrs, input range lo, hi, gap around 0).
struct Unary {
  const char* op;
  Attrs attrs;
  double lo, hi, gap;
};

TEST(GradientRules, Unary) {
  const std::vector<Unary> cases = {
      {"Relu", {}, -1, 1, 0.05},
      {"Erf", {}, -2, 2, 0},
      {"Tanh", {}, -2, 2, 0},
      {"Sigmoid", {}, -3, 3, 0},
      {"Exp", {}, -1, 1, 0},
      {"Log", {}, 0.2, 2, 0},
      {"Sqrt", {}, 0.2, 2, 0},
      {"Reciprocal", {}, -2, 2, 0.3},
      {"Neg", {}, -1, 1, 0},
      {"Identity", {}, -1, 1, 0},
      {"Sin", {}, -3, 3, 0},
      {"Cos", {}, -3, 3, 0},
      {"Abs", {}, -1, 1, 0.05},
      {"Softplus", {}, -3, 3, 0},
      {"LeakyRelu", {}, -1, 1, 0.05},
      {"LeakyRelu", {{"alpha", 0.3f}}, -1, 1, 0.05},
      {"Elu", {}, -2, 2, 0.05},
      {"Elu", {{"alpha", 0.7f}}, -2, 2, 0.05},
      {"HardSigmoid", {}, -4, 4, 0},  // kinks at -2.5 and 2.5
      {"HardSigmoid", {{"alpha", 0.3f}, {"beta", 0.4f}}, -3, 3, 0},
      {"HardSwish", {}, -5, 5, 0},  // kinks at -3 and 3
  };
  for (const Unary& u : cases) {
    SCOPED_TRACE(u.op);
    Net n;
    n.seed = 7;
    const int x = n.w("x", {3, 5}, u.lo, u.hi, u.gap);
    check(n, n.op(u.op, {x}, u.attrs));
  }
}

// Piecewise-constant ops have no gradient (zero almost everywhere, as in torch): x * op(x) has the derivative op(x),
// away from the steps (each range stays between two of them).
TEST(GradientRules, PiecewiseConstant) {
  for (const auto& [op, lo, hi] : std::vector<std::tuple<const char*, double, double>>{
           {"Floor", 1.2, 1.8}, {"Ceil", 1.2, 1.8}, {"Round", 1.6, 2.4}, {"Sign", 0.2, 1.0}}) {
    SCOPED_TRACE(op);
    Net n;
    const int x = n.w("x", {3, 4}, lo, hi);
    check(n, n.op("Mul", {x, n.op(op, {x})}));
  }
}

TEST(GradientRules, CastFloatToFloat) {
  Net n(DType::kFloat32);
  const int x = n.w("x", {2, 3});
  check(n, n.op("Cast", {x}, {{"to", static_cast<int64_t>(DType::kFloat64)}}), 1e-3, 1e-3);
}

TEST(GradientRules, Clip) {
  {
    SCOPED_TRACE("opset 13: min and max inputs (trained too)");
    Net n(DType::kFloat64, 13);
    const int x = n.w("x", {4, 5}, -2, 2);
    const int lo = n.wt("lo", rnd(DType::kFloat64, {}, 5, -0.55, -0.45));
    const int hi = n.wt("hi", rnd(DType::kFloat64, {}, 6, 0.45, 0.55));
    check(n, n.op("Clip", {x, lo, hi}));
  }
  {
    SCOPED_TRACE("opset 13: max only");
    Net n(DType::kFloat64, 13);
    const int x = n.w("x", {4, 5}, -2, 2);
    const int hi = n.init("hi", rnd(DType::kFloat64, {}, 6, 0.45, 0.55));
    check(n, n.op("Clip", {x, -1, hi}));
  }
  {
    SCOPED_TRACE("opset 6: attributes");
    Net n(DType::kFloat64, 6);
    const int x = n.w("x", {4, 5}, -2, 2);
    check(n, n.op("Clip", {x}, {{"min", -0.5f}, {"max", 0.5f}}));
  }
}

TEST(GradientRules, MaxMin) {
  for (const char* op : {"Max", "Min"}) {
    SCOPED_TRACE(op);
    Net n;
    const int a = n.w("a", {2, 3});
    const int b = n.w("b", {3});
    // c ties with a at some positions (a central difference splits a tie evenly, as the rule does)
    Tensor ct = rnd(DType::kFloat64, {2, 3}, 77);
    const Tensor& at = *n.g.values[static_cast<size_t>(a)].data;
    ct.data<double>()[1] = at.data<double>()[1];
    ct.data<double>()[4] = at.data<double>()[4];
    const int c = n.wt("c", ct);
    check(n, n.op(op, {a, b, c}));
  }
  Net n;  // one input: identity
  check(n, n.op("Max", {n.w("a", {3})}));
}

// ---- MatMul, Gemm ----

TEST(GradientRules, MatMul) {
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{3, 4}, {4, 5}}, {{2, 3, 4}, {4, 5}}, {{4}, {2, 4, 5}}, {{2, 1, 3, 4}, {3, 4, 2}},
      {{3, 4}, {4}},    {{4}, {4}},          {{2, 3, 4}, {4}},
  };
  for (const auto& [sa, sb] : cases) {
    SCOPED_TRACE(shape_str(sa) + " x " + shape_str(sb));
    Net n;
    const int a = n.w("a", sa);
    const int b = n.w("b", sb);
    check(n, n.op("MatMul", {a, b}));
  }
}

TEST(GradientRules, Gemm) {
  struct Case {
    bool ta, tb;
    float alpha, beta;
    Shape c;  // empty = no C, {-1} = scalar C
  };
  const std::vector<Case> cases = {
      {false, false, 1, 1, {}},      {true, false, 0.7f, 1.3f, {5}},  {false, true, 1, 1.3f, {1, 5}},
      {true, true, 0.7f, 1, {3, 1}}, {false, false, 1, 0.5f, {3, 5}}, {true, false, 1, 2, {-1}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(fmt::format("transA {} transB {} alpha {} beta {} C {}", k.ta, k.tb, k.alpha, k.beta, shape_str(k.c)));
    Net n;
    const int a = n.w("a", k.ta ? Shape{4, 3} : Shape{3, 4});
    const int b = n.w("b", k.tb ? Shape{5, 4} : Shape{4, 5});
    std::vector<int> in{a, b};
    if (!k.c.empty()) in.push_back(n.w("c", k.c == Shape{-1} ? Shape{} : k.c));
    check(n, n.op("Gemm", in,
                  {{"transA", int64_t{k.ta}}, {"transB", int64_t{k.tb}}, {"alpha", k.alpha}, {"beta", k.beta}}));
  }
}

// ---- conv / pool ----

struct ConvCase {
  std::string what;
  Shape x, w;
  Attrs attrs;
  bool bias = true;
  DType dt = DType::kFloat64;
  int64_t opset = 17;
};

TEST(GradientRules, Conv) {
  const std::vector<ConvCase> cases = {
      {"2-D, asymmetric pads, strides, dilations",
       {2, 3, 7, 6},
       {4, 3, 3, 2},
       {{"strides", I64s{2, 1}}, {"pads", I64s{1, 0, 0, 1}}, {"dilations", I64s{1, 2}}}},
      {"2-D, last rows never read (stride 2)", {1, 2, 6, 6}, {3, 2, 3, 3}, {{"strides", I64s{2, 2}}}, false},
      {"2-D, last rows never read, opset 9 (Slice attributes)",
       {1, 2, 6, 6},
       {3, 2, 3, 3},
       {{"strides", I64s{2, 2}}},
       false,
       DType::kFloat64,
       9},
      {"group 2",
       {1, 4, 5, 5},
       {6, 2, 3, 3},
       {{"group", int64_t{2}}, {"strides", I64s{2, 2}}, {"pads", I64s{1, 1, 1, 1}}}},
      {"depthwise",
       {2, 3, 6, 6},
       {3, 1, 3, 3},
       {{"group", int64_t{3}}, {"strides", I64s{2, 2}}, {"pads", I64s{1, 1, 1, 1}}}},
      {"1-D", {2, 2, 9}, {3, 2, 3}, {{"strides", I64s{2}}, {"dilations", I64s{2}}, {"pads", I64s{1, 2}}}},
      {"3-D", {1, 2, 4, 5, 4}, {2, 2, 2, 3, 2}, {{"pads", I64s{1, 0, 1, 0, 1, 0}}, {"strides", I64s{1, 2, 1}}}},
      {"SAME_UPPER", {1, 2, 5, 5}, {2, 2, 3, 3}, {{"auto_pad", std::string("SAME_UPPER")}, {"strides", I64s{2, 2}}}},
      {"SAME_LOWER", {1, 2, 6, 5}, {2, 2, 2, 2}, {{"auto_pad", std::string("SAME_LOWER")}}},
      {"float32 (oneDNN)",
       {2, 4, 8, 8},
       {6, 2, 3, 3},
       {{"group", int64_t{2}}, {"strides", I64s{2, 2}}, {"pads", I64s{1, 0, 1, 1}}},
       true,
       DType::kFloat32},
  };
  for (const ConvCase& k : cases) {
    SCOPED_TRACE(k.what);
    Net n(k.dt, k.opset);
    std::vector<int> in{n.w("x", k.x), n.w("w", k.w)};
    if (k.bias) in.push_back(n.w("b", {k.w[0]}));
    if (k.dt == DType::kFloat64)
      check(n, n.op("Conv", in, k.attrs));
    else
      check(n, n.op("Conv", in, k.attrs), 2e-2, 2e-2);
  }
}

/// Distinct values (a shuffled ramp with spacing 0.05): no two taps of a pool window tie, nor cross when perturbed.
Tensor distinct(DType t, const Shape& s, uint32_t seed) {
  Tensor r(t, s);
  std::vector<int64_t> perm(static_cast<size_t>(r.numel()));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
  std::mt19937 g(seed);
  std::shuffle(perm.begin(), perm.end(), g);
  for (int64_t i = 0; i < r.numel(); ++i) put(r, i, -1 + 0.05 * static_cast<double>(perm[static_cast<size_t>(i)]));
  return r;
}

TEST(GradientRules, MaxPool) {
  const std::vector<ConvCase> cases = {
      {"resnet 3x3 stride 2 pad 1",
       {1, 2, 7, 7},
       {3, 3},
       {{"kernel_shape", I64s{3, 3}}, {"strides", I64s{2, 2}}, {"pads", I64s{1, 1, 1, 1}}}},
      {"ceil_mode, asymmetric pads, dilations",
       {2, 2, 8, 7},
       {2, 3},
       {{"kernel_shape", I64s{2, 3}},
        {"strides", I64s{2, 2}},
        {"pads", I64s{0, 1, 1, 0}},
        {"dilations", I64s{2, 1}},
        {"ceil_mode", int64_t{1}}}},
      {"last rows never read", {1, 1, 6, 6}, {3, 3}, {{"kernel_shape", I64s{3, 3}}, {"strides", I64s{2, 2}}}},
      {"1-D", {2, 3, 9}, {3}, {{"kernel_shape", I64s{3}}, {"strides", I64s{2}}, {"pads", I64s{1, 1}}}},
      {"3-D", {1, 2, 4, 4, 4}, {2, 2, 2}, {{"kernel_shape", I64s{2, 2, 2}}, {"pads", I64s{1, 0, 0, 0, 1, 0}}}},
      {"SAME_UPPER", {1, 2, 5, 5}, {2, 2}, {{"kernel_shape", I64s{2, 2}}, {"auto_pad", std::string("SAME_UPPER")}}},
      {"opset 10 (Pad attributes)",
       {1, 2, 7, 7},
       {3, 3},
       {{"kernel_shape", I64s{3, 3}}, {"strides", I64s{2, 2}}, {"pads", I64s{1, 1, 1, 1}}},
       true,
       DType::kFloat64,
       10},
      {"float32 (oneDNN)",
       {2, 4, 9, 9},
       {3, 3},
       {{"kernel_shape", I64s{3, 3}}, {"strides", I64s{2, 2}}, {"pads", I64s{1, 1, 1, 1}}},
       true,
       DType::kFloat32},
  };
  for (const ConvCase& k : cases) {
    SCOPED_TRACE(k.what);
    Net n(k.dt, k.opset);
    const int x = n.wt("x", distinct(k.dt, k.x, 3));
    const int y = n.op("MaxPool", {x}, k.attrs);
    if (k.dt == DType::kFloat64)
      check(n, y);
    else
      check(n, y, 1e-3, 1e-3);
  }
}

TEST(GradientRules, AveragePool) {
  const std::vector<ConvCase> cases = {
      {"count_include_pad 0",
       {1, 2, 7, 6},
       {3, 3},
       {{"kernel_shape", I64s{3, 3}}, {"strides", I64s{2, 2}}, {"pads", I64s{1, 0, 1, 1}}}},
      {"count_include_pad 1",
       {1, 2, 7, 6},
       {3, 3},
       {{"kernel_shape", I64s{3, 3}},
        {"strides", I64s{2, 2}},
        {"pads", I64s{1, 0, 1, 1}},
        {"count_include_pad", int64_t{1}}}},
      {"ceil_mode, count_include_pad 1",
       {2, 1, 8, 8},
       {3, 2},
       {{"kernel_shape", I64s{3, 2}},
        {"strides", I64s{2, 3}},
        {"pads", I64s{1, 1, 0, 0}},
        {"ceil_mode", int64_t{1}},
        {"count_include_pad", int64_t{1}}}},
      {"ceil_mode, count_include_pad 0",
       {2, 1, 8, 8},
       {3, 2},
       {{"kernel_shape", I64s{3, 2}}, {"strides", I64s{2, 3}}, {"pads", I64s{1, 1, 0, 0}}, {"ceil_mode", int64_t{1}}}},
      {"1-D SAME_LOWER", {2, 2, 7}, {2}, {{"kernel_shape", I64s{2}}, {"auto_pad", std::string("SAME_LOWER")}}},
      {"3-D", {1, 1, 4, 5, 4}, {2, 2, 2}, {{"kernel_shape", I64s{2, 2, 2}}, {"strides", I64s{2, 1, 2}}}},
      {"float32 (oneDNN)",
       {2, 3, 8, 8},
       {3, 3},
       {{"kernel_shape", I64s{3, 3}}, {"strides", I64s{2, 2}}, {"pads", I64s{1, 1, 1, 1}}},
       true,
       DType::kFloat32},
  };
  for (const ConvCase& k : cases) {
    SCOPED_TRACE(k.what);
    Net n(k.dt, k.opset);
    const int y = n.op("AveragePool", {n.w("x", k.x)}, k.attrs);
    if (k.dt == DType::kFloat64)
      check(n, y);
    else
      check(n, y, 1e-3, 1e-3);
  }
}

TEST(GradientRules, GlobalAveragePool) {
  Net n;
  check(n, n.op("GlobalAveragePool", {n.w("x", {2, 3, 4, 5})}));
}

TEST(GradientRules, BatchNormalization) {
  for (int64_t opset : {15, 7}) {
    SCOPED_TRACE(opset);
    Net n(DType::kFloat64, opset);
    const int x = n.w("x", {2, 3, 4, 2});
    const int scale = n.w("scale", {3});
    const int b = n.w("b", {3});
    const int mean = n.w("mean", {3});
    const int var = n.w("var", {3}, 0.5, 1.5);
    check(n, n.op("BatchNormalization", {x, scale, b, mean, var}, {{"epsilon", 1e-3f}}));
  }
}

/// Nearest upsampling by whole factors: Upsample (opset 9, scales input), Resize (opset 13, sizes input: half_pixel
/// with the default rounding, asymmetric with floor). Each input element's gradient is the sum of its block.
TEST(GradientRules, NearestResize) {
  auto floats = [](const std::vector<float>& v) { return Tensor::from_floats({static_cast<int64_t>(v.size())}, v); };
  {
    Net n(DType::kFloat32, 9);
    check(n,
          n.op("Upsample", {n.w("x", {1, 2, 3, 2}), n.init("scales", floats({1, 1, 2, 3}))},
               {{"mode", std::string("nearest")}}),
          1e-3, 1e-3);
  }
  for (const auto& [mode, rounding] : {std::pair<std::string, std::string>{"half_pixel", "round_prefer_floor"},
                                       std::pair<std::string, std::string>{"asymmetric", "floor"}}) {
    SCOPED_TRACE(mode);
    Net n(DType::kFloat32, 13);
    const int x = n.w("x", {1, 2, 2, 3});
    check(
        n,
        n.op("Resize", {x, -1, -1, n.init("sizes", Tensor::from_int64s({1, 2, 6, 6}))},
             {{"mode", std::string("nearest")}, {"coordinate_transformation_mode", mode}, {"nearest_mode", rounding}}),
        1e-3, 1e-3);
  }
}

/// CumSum along an axis (an int32 or int64 input), every exclusive / reverse combination: dX is dy summed the other
/// way round.
TEST(GradientRules, CumSum) {
  for (int64_t exclusive : {0, 1})
    for (int64_t reverse : {0, 1}) {
      SCOPED_TRACE(fmt::format("exclusive {} reverse {}", exclusive, reverse));
      Net n;
      const int x = n.w("x", {2, 5, 3});
      check(n, n.op("CumSum", {x, n.init("axis", Tensor::from_int64s({-2}))},
                    {{"exclusive", exclusive}, {"reverse", reverse}}));
    }
}

/// TopK's values (largest and smallest, on the last axis and on axis 0; with the indices output, and without it
/// as loading leaves a TopK whose indices are unused): dX is dy at the chosen elements and 0 elsewhere (random
/// inputs have no ties, so the choice does not change within h).
TEST(GradientRules, TopK) {
  for (const auto& [axis, largest] : {std::pair<int64_t, int64_t>{-1, 1}, std::pair<int64_t, int64_t>{0, 0}})
    for (size_t outputs : {2, 1}) {
      SCOPED_TRACE(fmt::format("axis {} largest {} outputs {}", axis, largest, outputs));
      Net n;
      const int x = n.w("x", {4, 3, 5});
      const std::vector<int> out =
          n.node("TopK", {x, n.init("k", Tensor::from_int64s({2}))}, {{"axis", axis}, {"largest", largest}}, outputs);
      check(n, out[0]);
    }
}

/// A resnet stem: Conv -> BatchNormalization -> Relu -> MaxPool -> GlobalAveragePool -> 1x1 Conv.
TEST(GradientRules, ResnetStem) {
  Net n;
  const int x = n.w("x", {2, 2, 9, 9});
  const int w = n.w("w", {4, 2, 3, 3});
  const int conv = n.op("Conv", {x, w}, {{"strides", I64s{2, 2}}, {"pads", I64s{1, 1, 1, 1}}});
  const int bn =
      n.op("BatchNormalization", {conv, n.w("scale", {4}), n.w("b", {4}), n.w("mean", {4}), n.w("var", {4}, 0.5, 1.5)});
  const int relu = n.op("Relu", {bn});
  const int pool =
      n.op("MaxPool", {relu}, {{"kernel_shape", I64s{3, 3}}, {"strides", I64s{2, 2}}, {"pads", I64s{1, 1, 1, 1}}});
  const int gap = n.op("GlobalAveragePool", {pool});
  check(n, n.op("Conv", {gap, n.w("fc", {3, 4, 1, 1}), n.w("fcb", {3})}), 1e-5, 1e-4);  // the classifier
}

}  // namespace
}  // namespace gspmd
