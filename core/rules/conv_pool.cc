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

}  // namespace gspmd::rules_internal
