// The gradient rules of convolution and pooling (--training; core/rules/gradient.h), beside their factor rules in
// conv_pool.cc.
//
// Conv: dX is the transposed convolution of dY by W (ConvTranspose with the forward geometry and an output_padding
// that restores X's size); dW is a convolution of X by dY with batch and channels swapped (strides and dilations
// exchanged, groups kept); dB sums dY over N and the spatial dims. MaxPool: each window's maximum is found again by a
// depthwise one-hot Conv that lays the window's taps out as channels (ArgMax over them, the first maximum in
// row-major window order wins on ties, as torch's CPU kernel does), and dY goes back through the same one-hot taps by
// ConvTranspose; no Indices output and no scatter, so the backward ops keep the forward's sharding (Indices would
// force replication, see the factor rule in conv_pool.cc) and exist at every opset. AveragePool: dY divided by each
// window's count, spread by a depthwise all-ones ConvTranspose. These are the vector-Jacobian products of
// torch.autograd's convolution_backward / max_pool*_with_indices_backward / avg_pool*_backward.
#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "core/rules/gradient.h"
#include "core/rules/rule.h"

namespace gspmd::rules_internal {
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
