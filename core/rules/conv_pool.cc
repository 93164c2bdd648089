// Convolution, pooling and the CNN normalisations.
//
// Conv X[N,C,D1..Dk] * W[O,C/G,K1..Kk] (+ B[O]) -> Y[N,O,D1'..Dk'] (docs/architecture.md, "Factor rules"):
//   n pass-through; with group G == 1: o pass-through, c reduction (sum); with G > 1 the channel dims are compound,
//   major to minor: X dim 1 = (g, cg), W dim 0 = (g, og), W dim 1 = (cg), Y dim 1 = B dim 0 = (g, og), where g
//   (size G) and og (size O/G) are pass-through and cg (size C/G) is the reduction; a size-1 cg/og is left out
//   (depthwise conv: X dim 1 = (g), W dim 1 has no factor). Splitting g needs the local node's `group` to be
//   G / (split of g) — the partitioner's business.
//   One factor per spatial dim, kWindowed, size = the INPUT dim, on X dim 2+i and Y dim 2+i (W's kernel dims have
//   no factor). A window that is the identity (kernel 1, stride 1, no padding, output dim = input dim) is
//   pass-through instead: output i reads exactly input i, no halo is ever needed.
// ConvTranspose X[N,C,D..] * W[C,O/G,K..] -> Y[N,O,D'..]: the same with the roles of W's dims swapped (reduction over
//   input channels); spatial dims kNeedReplication (no transposed-halo support).
// MaxPool/AveragePool/LpPool: n, c pass-through; spatial kWindowed (identity windows pass-through). MaxPool's
//   optional Indices output holds flat indices into the WHOLE input, so with it every factor needs replication.
// GlobalAveragePool: spatial kReduction (sum) with `mean`; GlobalMaxPool: kReduction (max); GlobalLpPool: spatial
//   kNeedReplication.
// BatchNormalization (inference): every dim pass-through, per-channel params on c. In training mode (batch
//   statistics) n and the spatial dims need replication. LRN: c needs replication (window over channels).
// InstanceNormalization: spatial dims need replication. MeanVarianceNormalization: its `axes` need replication.
// DepthToSpace/SpaceToDepth: n pass-through; C, H, W (input and output) need replication.
#include <algorithm>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "core/rules/gradient.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

// Sets the dims of every present operand (or result, if `results`) from index `first` on to `f(shape)`; absent ones
// keep none. Returns false as soon as `f` rejects a shape with nullopt (the instance is not expressible).
template <class F>
bool set_present(RuleMaker& m, bool results, size_t first, F f) {
  const size_t count = results ? m.node().outputs.size() : m.node().inputs.size();
  for (size_t i = first; i < count; ++i) {
    if (!(results ? m.has_output(i) : m.has_input(i))) continue;
    std::optional<DimFactors> df = f(results ? m.out(i) : m.in(i));
    if (!df) return false;
    if (results)
      m.result(i, std::move(*df));
    else
      m.operand(i, std::move(*df));
  }
  return true;
}

// Spatial dim i of a window op (k spatial dims) is the identity window: kernel 1, stride 1, no padding, same size.
bool identity_window(const Node& n, int i, int k, int64_t kernel, int64_t in_dim, int64_t out_dim) {
  if (kernel != 1 || in_dim != out_dim) return false;
  auto strides = n.ints("strides");
  if (i < static_cast<int>(strides.size()) && strides[i] != 1) return false;
  const std::string pad = n.s("auto_pad", "NOTSET");
  if (pad == "NOTSET" || pad.empty()) {
    auto pads = n.ints("pads");
    if (i < static_cast<int>(pads.size()) && pads[i] != 0) return false;
    if (i + k < static_cast<int>(pads.size()) && pads[i + k] != 0) return false;
  }
  // SAME_* / VALID with kernel 1 and stride 1 pad nothing.
  return true;
}

// Channel factors of a (possibly grouped) conv: `in` indexes the input channels (reduction), `out` the output
// channels (pass-through); `kind_in` is kReduction.
struct Channels {
  std::vector<int> in;   // X dim 1: (g, cg) or (c)
  std::vector<int> wc;   // W's input-channel dim: (cg) or (c)
  std::vector<int> out;  // Y dim 1, B: (g, og) or (o)
};

// Adds n, channel and spatial factors in the order n, g, og/o, spatial..., cg/c and returns the channel layout;
// `spatial` receives one factor per spatial dim built by `spatial_kind(i)`.
template <class SpatialFn>
Channels conv_factors(RuleMaker& m, int64_t N, int64_t C, int64_t O, int64_t G, int k, int& fn,
                      std::vector<int>& spatial, SpatialFn spatial_factor) {
  Channels ch;
  fn = m.factor(N, FactorKind::kPassThrough);
  if (G > 1) {
    int fg = m.factor(G, FactorKind::kPassThrough);
    ch.out = {fg};
    ch.in = {fg};
    if (O / G > 1) ch.out.push_back(m.factor(O / G, FactorKind::kPassThrough));
  } else {
    ch.out = {m.factor(O, FactorKind::kPassThrough)};
  }
  spatial.clear();
  for (int i = 0; i < k; ++i) spatial.push_back(spatial_factor(i));
  if (G > 1) {
    if (C / G > 1) {
      int fcg = m.factor(C / G, FactorKind::kReduction);
      ch.in.push_back(fcg);
      ch.wc = {fcg};
    }
  } else {
    int fc = m.factor(C, FactorKind::kReduction);
    ch.in = {fc};
    ch.wc = {fc};
  }
  return ch;
}

// Why Conv (ConvTranspose, if `transpose`) X [N,C,D..] * W -> Y cannot be expressed, or nullopt.
std::optional<NotExpressible> conv_mismatch(const Graph& g, const Node& n, bool transpose) {
  if (!present(n, 0) || !present(n, 1) || n.inputs.size() > 3 || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects X, W, an optional B and one output");
  const Shape& x = shape_of(g, n.inputs[0]);
  const Shape& w = shape_of(g, n.inputs[1]);
  const Shape& y = shape_of(g, n.outputs[0]);
  if (x.size() < 3 || w.size() != x.size() || y.size() != x.size())
    return reject("X {}, W {} and Y {} are not of one rank >= 3", shape_str(x), shape_str(w), shape_str(y));
  const int64_t G = n.i("group", 1), N = x[0], C = x[1];
  if (G <= 0 || C % G != 0 || y[0] != N) return reject("group {} does not divide the {} channels, or N differs", G, C);
  const int64_t O = transpose ? w[1] * G : w[0];
  if (transpose ? w[0] != C : (w[1] * G != C || O % G != 0))
    return reject("W {} does not fit {} input channels in {} groups", shape_str(w), C, G);
  if (y[1] != O) return reject("Y has {} channels, W gives {}", y[1], O);
  if (present(n, 2) && shape_of(g, n.inputs[2]) != Shape{O})
    return reject("B {} is not [{}]", shape_str(shape_of(g, n.inputs[2])), O);
  return std::nullopt;
}

// transpose: ConvTranspose (W = [C, O/G, K..], spatial need replication).
RuleBuilder conv_rule(bool transpose) {
  return [transpose](const Graph& g, const Node& n) -> RuleResult {
    if (auto e = conv_mismatch(g, n, transpose)) return *e;
    RuleMaker m(g, n);
    const Shape& x = m.in(0);
    const Shape& w = m.in(1);
    const Shape& y = m.out(0);
    const int rk = static_cast<int>(x.size()), k = rk - 2;
    const int64_t G = n.i("group", 1), N = x[0], C = x[1], O = transpose ? w[1] * G : w[0];
    auto kernel = n.ints("kernel_shape");
    int fn = -1;
    std::vector<int> sp;
    Channels ch = conv_factors(m, N, C, O, G, k, fn, sp, [&](int i) {
      int64_t ks = i < static_cast<int>(kernel.size()) ? kernel[i] : w[2 + i];
      auto opad = n.ints("output_padding");
      if (identity_window(n, i, k, ks, x[2 + i], y[2 + i]) && (i >= static_cast<int>(opad.size()) || opad[i] == 0))
        return m.factor(x[2 + i], FactorKind::kPassThrough);
      return m.factor(x[2 + i], transpose ? FactorKind::kNeedReplication : FactorKind::kWindowed);
    });
    DimFactors dx(rk), dw(rk), dy(rk);
    dx[0] = dy[0] = {fn};
    dx[1] = ch.in;
    dy[1] = ch.out;
    if (transpose) {
      dw[0] = ch.in;                                                                               // (g, cg)
      dw[1] = ch.out.size() > 1 || G == 1 ? std::vector<int>{ch.out.back()} : std::vector<int>{};  // (og) / (o)
    } else {
      dw[0] = ch.out;
      dw[1] = ch.wc;
    }
    for (int i = 0; i < k; ++i) dx[2 + i] = dy[2 + i] = {sp[i]};
    const bool bias = present(n, 2);
    m.operand(0, dx).operand(1, dw).result(0, dy).reduction(ReductionKind::kSum);
    if (bias) m.operand(2, {ch.out});
    if (bias && !transpose) m.bias(2);
    if (G > 1) m.group_factor(ch.in.front());
    // Linear in X and in W (not both partial: the partitioner allows one partial operand); affine with a bias.
    if (!bias) m.linear(0).linear(1);
    return m.build();
  };
}

enum class Pool { kMax, kAverage, kLp };

RuleBuilder pool_rule(Pool kind) {
  return [kind](const Graph& g, const Node& n) -> RuleResult {
    if (n.inputs.size() != 1 || !present(n, 0) || !present(n, 0, true)) return reject("expects X and output Y");
    RuleMaker m(g, n);
    const Shape& x = m.in(0);
    const Shape& y = m.out(0);
    const int rk = static_cast<int>(x.size()), k = rk - 2;
    if (rk < 3 || y.size() != x.size() || y[0] != x[0] || y[1] != x[1])
      return reject("X {} and Y {} do not agree on N and C at one rank >= 3", shape_str(x), shape_str(y));
    auto kernel = n.ints("kernel_shape");
    if (static_cast<int>(kernel.size()) != k)
      return reject("kernel_shape has {} dims for {} spatial", kernel.size(), k);
    for (size_t o = 1; o < n.outputs.size(); ++o)
      if (m.has_output(o) && m.out(o).size() != x.size()) return reject("result {} has rank {}", o, m.out(o).size());
    const bool indices = kind == Pool::kMax && present(n, 1, true);
    const FactorKind pass = indices ? FactorKind::kNeedReplication : FactorKind::kPassThrough;
    const DimFactors dx = one_factor_each(m.factors(x, [&](int d) {
      if (d < 2 || indices) return pass;
      const int i = d - 2;
      return identity_window(n, i, k, kernel[i], x[d], y[d]) ? FactorKind::kPassThrough : FactorKind::kWindowed;
    }));
    m.operand(0, dx);
    for (size_t o = 0; o < n.outputs.size(); ++o)
      if (m.has_output(o)) m.result(o, dx);
    // An average is linear in its input (a pooled partial sum is the partial sum of the pooled value).
    m.linear(0, kind == Pool::kAverage);
    return m.build();
  };
}

// kind: factor kind of the spatial dims; red / mean: how split partials combine.
RuleBuilder global_pool_rule(FactorKind kind, ReductionKind red, bool mean, bool linear) {
  return [=](const Graph& g, const Node& n) -> RuleResult {
    if (n.inputs.size() != 1 || !present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true))
      return reject("expects one input and one output");
    RuleMaker m(g, n);
    const Shape& x = m.in(0);
    const int rk = static_cast<int>(x.size());
    if (rk < 2 || m.out(0).size() != x.size())
      return reject("X {} and Y {} are not of one rank >= 2", shape_str(x), shape_str(m.out(0)));
    const std::vector<int> xf = m.factors(x, [&](int d) { return d < 2 ? FactorKind::kPassThrough : kind; });
    DimFactors dy(rk);  // Y's spatial dims are 1: no factor
    dy[0] = {xf[0]};
    dy[1] = {xf[1]};
    m.operand(0, one_factor_each(xf)).result(0, dy).reduction(red).mean(mean).linear(0, linear);
    return m.build();
  };
}

RuleResult batchnorm_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() < 5 || !present(n, 0) || !present(n, 0, true)) return reject("expects X, scale, B, mean, var");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const int rk = static_cast<int>(x.size());
  if (rk < 2 || m.out(0) != x)
    return reject("X {} and Y {} differ or have rank < 2", shape_str(x), shape_str(m.out(0)));
  bool training = n.i("training_mode", 0) != 0;
  for (size_t o = 1; o < n.outputs.size(); ++o) training |= n.outputs[o] >= 0;
  const FactorKind stat = training ? FactorKind::kNeedReplication : FactorKind::kPassThrough;
  const std::vector<int> xf = m.factors(x, [&](int d) { return d == 1 ? FactorKind::kPassThrough : stat; });
  m.operand(0, one_factor_each(xf)).result(0, one_factor_each(xf));
  // scale, B, mean, var: [C] (or, before opset 9 with spatial=0, [C, D1, ..]): dim j is X dim 1 + j.
  const bool params_ok = set_present(m, false, 1, [&](const Shape& s) -> std::optional<DimFactors> {
    if (s.empty() || static_cast<int>(s.size()) > rk - 1) return std::nullopt;
    DimFactors dp(s.size());
    for (size_t j = 0; j < s.size(); ++j) {
      if (s[j] == x[1 + j])
        dp[j] = {xf[1 + j]};
      else if (s[j] != 1)
        return std::nullopt;
    }
    return dp;
  });
  if (!params_ok) return reject("a parameter does not fit X {}'s channels", shape_str(x));
  // Running / saved statistics: [C].
  const bool stats_ok = set_present(m, true, 1, [&](const Shape& s) -> std::optional<DimFactors> {
    if (s.size() != 1 || s[0] != x[1]) return std::nullopt;
    return DimFactors{{xf[1]}};
  });
  if (!stats_ok) return reject("a statistics output is not [{}]", x[1]);
  return m.build();
}

// Per-dim kinds: whole(d) = the dim must stay whole. Extra operands (InstanceNorm's scale/B) are [C] on dim 1.
RuleBuilder per_dim_rule(std::function<bool(const Node&, int d, int rank)> whole, bool channel_params) {
  return [=](const Graph& g, const Node& n) -> RuleResult {
    if (!present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true)) return reject("expects X and one output");
    RuleMaker m(g, n);
    const Shape& x = m.in(0);
    const int rk = static_cast<int>(x.size());
    if (m.out(0) != x) return reject("Y {} differs from X {}", shape_str(m.out(0)), shape_str(x));
    const DimFactors dx = one_factor_each(
        m.factors(x, [&](int d) { return whole(n, d, rk) ? FactorKind::kNeedReplication : FactorKind::kPassThrough; }));
    m.operand(0, dx).result(0, dx);
    const bool params_ok = set_present(m, false, 1, [&](const Shape& s) -> std::optional<DimFactors> {
      if (!channel_params || rk < 2 || s != Shape{x[1]}) return std::nullopt;
      return DimFactors{dx[1]};
    });
    if (!params_ok) return reject("a parameter is not [C] of X {}", shape_str(x));
    return m.build();
  };
}

RuleResult depth_space_rule(const Graph& g, const Node& n) {
  if (n.inputs.size() != 1 || !present(n, 0) || n.outputs.size() != 1 || !present(n, 0, true))
    return reject("expects one input and one output");
  RuleMaker m(g, n);
  const Shape& x = m.in(0);
  const Shape& y = m.out(0);
  if (x.size() != 4 || y.size() != 4 || x[0] != y[0])
    return reject("X {} and Y {} are not 4-D with one N", shape_str(x), shape_str(y));
  const FactorKind kRep = FactorKind::kNeedReplication, kPass = FactorKind::kPassThrough;
  const std::vector<int> xf = m.factors(x, [&](int d) { return d == 0 ? kPass : kRep; });
  DimFactors dy(4);
  dy[0] = {xf[0]};
  for (int d = 1; d < 4; ++d) dy[d] = {m.factor(y[d], kRep)};
  m.operand(0, one_factor_each(xf)).result(0, dy).linear(0);  // a permutation of elements
  return m.build();
}

}  // namespace

void register_conv_pool_rules() {
  add_builtin("Conv", conv_rule(false));
  add_builtin("ConvTranspose", conv_rule(true));
  add_builtin("MaxPool", pool_rule(Pool::kMax));
  add_builtin("AveragePool", pool_rule(Pool::kAverage));
  add_builtin("LpPool", pool_rule(Pool::kLp));
  add_builtin("GlobalAveragePool", global_pool_rule(FactorKind::kReduction, ReductionKind::kSum, true, true));
  add_builtin("GlobalMaxPool", global_pool_rule(FactorKind::kReduction, ReductionKind::kMax, false, false));
  // ||x||_p over the window: the partials would need a p-th-power sum; keep the spatial dims whole.
  add_builtin("GlobalLpPool", global_pool_rule(FactorKind::kNeedReplication, ReductionKind::kSum, false, false));
  add_builtin("BatchNormalization", batchnorm_rule);
  add_builtin("LRN", per_dim_rule([](const Node&, int d, int) { return d == 1; }, false));
  add_builtin("InstanceNormalization", per_dim_rule([](const Node&, int d, int) { return d >= 2; }, true));
  add_builtin("MeanVarianceNormalization", per_dim_rule(
                                               [](const Node& n, int d, int rk) {
                                                 for (int64_t a : n.ints("axes", {0, 2, 3}))
                                                   if (norm_axis(a, rk) == d) return true;
                                                 return false;
                                               },
                                               false));
  add_builtin("DepthToSpace", depth_space_rule);
  add_builtin("SpaceToDepth", depth_space_rule);
}

// ---- gradients (vector-Jacobian products in ONNX ops; core/rules/gradient.h) ----
//
// Conv: dX is the transposed convolution of dY by W (ConvTranspose with the forward geometry and an output_padding
// that restores X's size); dW is a convolution of X by dY with batch and channels swapped (strides and dilations
// exchanged, groups kept); dB sums dY over N and the spatial dims. MaxPool: each window's maximum is found again by a
// depthwise one-hot Conv that lays the window's taps out as channels (ArgMax over them, the first maximum in
// row-major window order wins on ties, as torch's CPU kernel does), and dY goes back through the same one-hot taps by
// ConvTranspose; no Indices output and no scatter, so the backward ops keep the forward's sharding (Indices would
// force replication, see the factor rule above) and exist at every opset. AveragePool: dY divided by each window's
// count, spread by a depthwise all-ones ConvTranspose. These are the vector-Jacobian products of torch.autograd's
// convolution_backward / max_pool*_with_indices_backward / avg_pool*_backward.
namespace {

using G = GradContext;

/// The window of a Conv or pool node: per spatial dim the input and output sizes, kernel, stride, dilation, left
/// and declared right pad (pads / auto_pad; VALID: 0), and the right pad the last window actually reaches ((out-1)*s +
/// ext - in - pl: above the `pads` entry with ceil_mode, negative when the last input rows are never read). auto_pad
/// SAME_* splits as the kernels do.
struct Geom {
  std::vector<int64_t> in, out, k, s, d, pl, pr, used_pr;
  size_t n() const { return in.size(); }
  int64_t ext(size_t i) const { return (k[i] - 1) * d[i] + 1; }
};

Geom geometry(const Node& n, const Shape& x, const Shape& y, const std::vector<int64_t>& kernel, bool dilations) {
  Geom g;
  const size_t sp = x.size() - 2;
  g.in.assign(x.begin() + 2, x.end());
  g.out.assign(y.begin() + 2, y.end());
  g.k = kernel;
  g.s = n.ints("strides", std::vector<int64_t>(sp, 1));
  g.d = dilations ? n.ints("dilations", std::vector<int64_t>(sp, 1)) : std::vector<int64_t>(sp, 1);
  if (g.k.size() != sp || g.s.size() != sp || g.d.size() != sp)
    throw InternalError(fmt::format("gradient of node '{}' ({}): kernel, strides or dilations do not have {} dims",
                                    n.name, n.op_type, sp));
  const std::string ap = n.s("auto_pad", "NOTSET");
  std::vector<int64_t> pads = ap == "NOTSET" || ap.empty() ? n.ints("pads") : std::vector<int64_t>{};
  if (pads.empty()) pads.assign(2 * sp, 0);
  for (size_t i = 0; i < sp; ++i) {
    if (ap == "SAME_UPPER" || ap == "SAME_LOWER") {
      const int64_t total = std::max<int64_t>(0, (g.out[i] - 1) * g.s[i] + g.ext(i) - g.in[i]);
      g.pl.push_back(ap == "SAME_UPPER" ? total / 2 : total - total / 2);
      g.pr.push_back(total - g.pl.back());
    } else {
      g.pl.push_back(pads.at(i));
      g.pr.push_back(pads.at(sp + i));
    }
    g.used_pr.push_back((g.out[i] - 1) * g.s[i] + g.ext(i) - g.in[i] - g.pl[i]);
  }
  return g;
}

/// ConvTranspose attributes that map a [.., out..] gradient back onto [.., in..] through the window `g`: pads (pl,
/// the used right pad when >= 0) and output_padding (the never-read tail).
std::map<std::string, AttrValue> transposed_attrs(const Geom& g, int64_t group) {
  std::vector<int64_t> pads = g.pl, opad;
  for (size_t i = 0; i < g.n(); ++i) {
    pads.push_back(std::max<int64_t>(g.used_pr[i], 0));
    opad.push_back(std::max<int64_t>(-g.used_pr[i], 0));
  }
  return {{"strides", g.s}, {"dilations", g.d}, {"pads", pads}, {"output_padding", opad}, {"group", group}};
}

/// A constant of dtype `t` and shape `shape` holding `v` (float types; others through a Cast from float64).
int filled(G& c, DType t, const Shape& shape, const std::vector<double>& v) {
  Tensor d(DType::kFloat64, shape);
  std::copy(v.begin(), v.end(), d.data<double>());
  if (t == DType::kFloat64) return c.constant(d);
  if (t == DType::kFloat32) {
    Tensor f(DType::kFloat32, shape);
    for (size_t i = 0; i < v.size(); ++i) f.data<float>()[i] = static_cast<float>(v[i]);
    return c.constant(f);
  }
  return c.cast(c.constant(d), t);
}

/// [d0, .., dk] with `mid` inserted at position `at`.
Shape with(const Shape& s, size_t at, const std::vector<int64_t>& mid) {
  Shape r(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(at));
  r.insert(r.end(), mid.begin(), mid.end());
  r.insert(r.end(), s.begin() + static_cast<std::ptrdiff_t>(at), s.end());
  return r;
}

/// Conv (onnx Conv, torch.nn.functional.conv*d): X [N,C,D..], W [O,C/G,K..], B [O] -> Y [N,O,D'..].
void conv_grad(G& c) {
  const int dy = c.dy(0);
  if (dy < 0) return;
  const Node& n = c.node();
  const Shape x = c.value(c.x(0)).shape, w = c.value(c.x(1)).shape, y = c.value(c.y(0)).shape;
  const int64_t groups = n.i("group", 1), N = x[0], C = x[1], Cg = C / groups;
  const size_t sp = x.size() - 2;
  const Geom g = geometry(n, x, y, Shape(w.begin() + 2, w.end()), true);
  if (c.wants(0)) {  // dX = ConvTranspose(dY, W): W [O, C/G, K..] is ConvTranspose's [C_in, C_out/G, K..]
    c.set_dx(0, c.op("ConvTranspose", {dy, c.x(1)}, transposed_attrs(g, groups)));
  }
  if (c.wants(1)) {
    // dW[g*Og+o, c, k] = sum_{n,p} dY[n, g*Og+o, p] X[n, g*Cg+c, p*s - pl + k*d]: a grouped Conv whose batch is c,
    // whose input channels are (g, n) and whose kernel is dY, with stride d and dilation s; result [Cg, O, K..].
    int xs = c.x(0);
    std::vector<int64_t> pads = g.pl, ends;
    bool crop = false;
    for (size_t i = 0; i < sp; ++i) {
      pads.push_back(std::max<int64_t>(g.used_pr[i], 0));
      ends.push_back(g.in[i] + std::min<int64_t>(g.used_pr[i], 0));  // drop input rows no window reads
      crop = crop || g.used_pr[i] < 0;
    }
    if (crop) {
      std::vector<int64_t> starts(sp, 0), axes;
      for (size_t i = 0; i < sp; ++i) axes.push_back(static_cast<int64_t>(2 + i));
      xs = c.slice(xs, starts, ends, axes);
    }
    Shape xc = c.value(xs).shape;  // [N, C, D..] (cropped)
    std::vector<int64_t> perm{2, 1, 0};
    for (size_t i = 0; i < sp; ++i) perm.push_back(static_cast<int64_t>(3 + i));
    const int xg = c.transpose(c.reshape(xs, with(Shape(xc.begin() + 2, xc.end()), 0, {N, groups, Cg})), perm);
    const int xin = c.reshape(xg, with(Shape(xc.begin() + 2, xc.end()), 0, {Cg, groups * N}));
    std::vector<int64_t> swap01{1, 0};
    for (size_t i = 0; i < sp; ++i) swap01.push_back(static_cast<int64_t>(2 + i));
    const int kern = c.transpose(dy, swap01);  // [O, N, D'..]
    const int dw = c.op("Conv", {xin, kern}, {{"strides", g.d}, {"dilations", g.s}, {"pads", pads}, {"group", groups}});
    c.set_dx(1, c.transpose(dw, swap01));  // [Cg, O, K..] -> [O, Cg, K..]
  }
  if (c.wants(2)) {
    std::vector<int64_t> axes{0};
    for (size_t i = 0; i < sp; ++i) axes.push_back(static_cast<int64_t>(2 + i));
    c.set_dx(2, c.reduce_sum(dy, axes, false));
  }
}

/// The depthwise weights [C*T, 1, K..] (T = prod K) whose channel c*T+t holds a 1 at window tap t (row-major): a
/// Conv with them (group C) lays each window's taps out as channels, a ConvTranspose puts them back.
int one_hot_taps(G& c, DType t, int64_t C, const std::vector<int64_t>& k) {
  int64_t T = 1;
  for (int64_t v : k) T *= v;
  Shape s{C * T, 1};
  s.insert(s.end(), k.begin(), k.end());
  std::vector<double> v(static_cast<size_t>(C * T * T), 0.0);
  for (int64_t ch = 0; ch < C; ++ch)
    for (int64_t tap = 0; tap < T; ++tap) v[static_cast<size_t>((ch * T + tap) * T + tap)] = 1.0;
  return filled(c, t, s, v);
}

/// MaxPool (onnx MaxPool, torch max_pool*d): the gradient of Y goes to the first maximum of each window (row-major
/// window order). The Indices output (if any) has no gradient. storage_order only affects Indices.
void maxpool_grad(G& c) {
  const int dy = c.dy(0);
  if (dy < 0 || !c.wants(0)) return;
  const Node& n = c.node();
  const Shape x = c.value(c.x(0)).shape, y = c.value(c.y(0)).shape;
  const DType dt = c.value(c.x(0)).dtype;
  const Geom g = geometry(n, x, y, n.ints("kernel_shape"), true);
  const int64_t N = x[0], C = x[1];
  const size_t sp = g.n();
  int64_t T = 1;
  for (int64_t v : g.k) T *= v;
  // Taps: pad X with the lowest value where windows reach past it (a padded tap never wins), then one channel per tap.
  std::vector<int64_t> pads{0, 0};
  pads.insert(pads.end(), g.pl.begin(), g.pl.end());
  pads.push_back(0);
  pads.push_back(0);
  for (size_t i = 0; i < sp; ++i) pads.push_back(std::max<int64_t>(g.used_pr[i], 0));
  const double lowest = dt == DType::kFloat64   ? std::numeric_limits<double>::lowest()
                        : dt == DType::kFloat32 ? static_cast<double>(std::numeric_limits<float>::lowest())
                                                : -65504.0;  // float16's lowest (also fine for bfloat16)
  const int xp = c.pad(c.x(0), pads, lowest);
  const int taps = one_hot_taps(c, dt, C, g.k);
  const int v = c.op("Conv", {xp, taps}, {{"strides", g.s}, {"dilations", g.d}, {"group", C}});
  const Shape out(y.begin() + 2, y.end());
  const int v4 = c.reshape(v, with(out, 0, {N, C, T}));
  const int best = c.op("ArgMax", {v4}, {{"axis", int64_t{2}}, {"keepdims", int64_t{1}}});  // first maximum
  std::vector<int64_t> tap_ids(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) tap_ids[static_cast<size_t>(t)] = t;
  Tensor ids = Tensor::from_int64s(tap_ids);
  ids.shape = with(Shape(sp, 1), 0, {1, 1, T});
  const int mask = c.cast(c.op("Equal", {best, c.constant(ids)}), dt);        // [N, C, T, out..]
  const int z = c.op("Mul", {mask, c.reshape(dy, with(out, 0, {N, C, 1}))});  // dY at the winning tap
  const int zc = c.reshape(z, with(out, 0, {N, C * T}));                      // [N, C*T, out..]
  c.set_dx(0, c.op("ConvTranspose", {zc, taps}, transposed_attrs(g, C)));
}

/// AveragePool (onnx AveragePool, torch avg_pool*d): dY / count of each window, spread over the window's taps. The
/// count is the taps inside [-pl, in + pr) with count_include_pad (ceil_mode's overhang excluded, as onnxruntime),
/// else those inside [0, in): per spatial dim the same for every N and C, so a constant [1, 1, out..].
void avgpool_grad(G& c) {
  const int dy = c.dy(0);
  if (dy < 0 || !c.wants(0)) return;
  const Node& n = c.node();
  const Shape x = c.value(c.x(0)).shape, y = c.value(c.y(0)).shape;
  const DType dt = c.value(c.x(0)).dtype;
  const Geom g = geometry(n, x, y, n.ints("kernel_shape"), true);
  const bool include_pad = n.i("count_include_pad", 0) != 0;
  const size_t sp = g.n();
  // Per-dim counts, then their outer product.
  std::vector<std::vector<double>> counts(sp);
  for (size_t i = 0; i < sp; ++i) {
    const int64_t lo = include_pad ? -g.pl[i] : 0, hi = include_pad ? g.in[i] + g.pr[i] : g.in[i];
    for (int64_t o = 0; o < g.out[i]; ++o) {
      int64_t cnt = 0;
      for (int64_t j = 0; j < g.k[i]; ++j) {
        const int64_t q = o * g.s[i] - g.pl[i] + j * g.d[i];
        cnt += q >= lo && q < hi;
      }
      counts[i].push_back(cnt > 0 ? 1.0 / static_cast<double>(cnt) : 0.0);
    }
  }
  std::vector<double> inv{1.0};
  for (size_t i = 0; i < sp; ++i) {
    std::vector<double> next;
    for (double a : inv)
      for (double b : counts[i]) next.push_back(a * b);
    inv = std::move(next);
  }
  const int scaled = c.op("Mul", {dy, filled(c, dt, with(Shape(y.begin() + 2, y.end()), 0, {1, 1}), inv)});
  Shape ws{x[1], 1};
  ws.insert(ws.end(), g.k.begin(), g.k.end());
  const int ones = filled(c, dt, ws, std::vector<double>(static_cast<size_t>(num_elements(ws)), 1.0));
  c.set_dx(0, c.op("ConvTranspose", {scaled, ones}, transposed_attrs(g, x[1])));
}

/// GlobalAveragePool: dX = dY / (number of spatial elements), broadcast over the spatial dims.
void global_avgpool_grad(G& c) {
  const int dy = c.dy(0);
  if (dy < 0 || !c.wants(0)) return;
  const Shape x = c.value(c.x(0)).shape;
  int64_t count = 1;
  for (size_t d = 2; d < x.size(); ++d) count *= x[d];
  const int scaled = c.op("Mul", {dy, c.scalar(1.0 / static_cast<double>(count), c.value(dy).dtype)});
  c.set_dx(0, c.expand(scaled, x));
}

/// BatchNormalization in inference form (onnx BatchNormalization with training_mode 0; torch batch_norm with
/// training=False): Y = scale (X - mean) / sqrt(var + eps) + B, the statistics being inputs. Gradients for X, scale,
/// B, and (when they are trained) mean and var. Parameters are [C], or before opset 9 with spatial=0 [C, D..]. The
/// training form (batch statistics, the running-statistics outputs) has no rule: InputError.
void batchnorm_grad(G& c) {
  const Node& n = c.node();
  bool training = n.i("training_mode", 0) != 0;
  for (size_t k = 1; k < n.outputs.size(); ++k) training = training || n.outputs[k] >= 0;
  if (training)
    throw InputError(
        fmt::format("--training: node '{}' (BatchNormalization): no gradient rule for the training form "
                    "(batch statistics); only the inference form is supported",
                    n.name));
  const int dy = c.dy(0);
  if (dy < 0) return;
  const Shape x = c.value(c.x(0)).shape;
  const DType dt = c.value(c.x(0)).dtype;
  const size_t rk = x.size();
  // Parameter i reshaped to broadcast against X: [1, s.., 1..].
  auto bshape = [&](size_t i) {
    Shape s = c.value(c.x(i)).shape;
    s.insert(s.begin(), 1);
    while (s.size() < rk) s.push_back(1);
    return s;
  };
  auto param = [&](size_t i) { return c.reshape(c.x(i), bshape(i)); };
  auto give = [&](size_t i, int full) {     // sums a broadcast gradient back to parameter i's shape
    const Shape s = c.value(c.x(i)).shape;  // a copy: emitting grows the graph's values
    c.set_dx(i, c.reshape(c.sum_to(full, bshape(i)), s));
  };
  const int inv_std =
      c.op("Reciprocal",
           {c.op("Sqrt", {c.op("Add", {param(4), c.scalar(static_cast<double>(n.f("epsilon", 1e-5f)), dt)})})});
  const int k = c.op("Mul", {param(1), inv_std});  // scale / sqrt(var + eps)
  if (c.wants(0)) c.set_dx(0, c.expand(c.op("Mul", {dy, k}), x));
  if (c.wants(2)) give(2, dy);
  if (c.wants(3)) give(3, c.op("Neg", {c.op("Mul", {dy, k})}));
  if (c.wants(1) || c.wants(4)) {
    const int centered = c.op("Sub", {c.x(0), param(3)});
    const int dyc = c.op("Mul", {dy, centered});
    if (c.wants(1)) give(1, c.op("Mul", {dyc, inv_std}));
    if (c.wants(4)) {  // d/dvar of (var + eps)^(-1/2) = -1/2 (var + eps)^(-3/2)
      const int cube = c.op("Mul", {inv_std, c.op("Mul", {inv_std, inv_std})});
      give(4, c.op("Mul", {dyc, c.op("Mul", {param(1), c.op("Mul", {cube, c.scalar(-0.5, dt)})})}));
    }
  }
}

}  // namespace

void register_conv_pool_gradients() {
  add_builtin_gradient("Conv", conv_grad);
  add_builtin_gradient("MaxPool", maxpool_grad);
  add_builtin_gradient("AveragePool", avgpool_grad);
  add_builtin_gradient("GlobalAveragePool", global_avgpool_grad);
  add_builtin_gradient("BatchNormalization", batchnorm_grad);
}

}  // namespace gspmd::rules_internal
