// Tests for the conv/pool kernels of backend/kernels (ops_conv_pool.cc, ops_conv_pool_norm.cc): Conv, ConvTranspose,
// pools, normalizations. Real numbers: hand-computed small cases plus naive reference loops written here (independent
// of those files).
#include <cmath>
#include <cstring>
#include <random>

#include <gtest/gtest.h>

#include "backend/kernels/kernels.h"
#include "backend/kernels/onednn.h"
#include "tests/test_util/graph_builder.h"

namespace gspmd {
namespace {

using testing::F;
using testing::make_node;
using testing::rand_f;

Tensor to_f64(const Tensor& t) {
  Tensor r(DType::kFloat64, t.shape);
  for (int64_t i = 0; i < t.numel(); ++i) r.data<double>()[i] = t.data<float>()[i];
  return r;
}

using testing::vals;

Tensor run1(const Node& n, const std::vector<const Tensor*>& in, int64_t opset = 17) {
  auto o = run_kernel(n, in, opset);
  EXPECT_EQ(o.size(), 1u);
  return std::move(o.at(0));
}

void expect_near(const Tensor& got, const Tensor& want, double tol = 1e-4) {
  ASSERT_EQ(got.shape, want.shape);
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.dtype == DType::kFloat64 ? got.data<double>()[i] : got.data<float>()[i];
    const double w = want.dtype == DType::kFloat64 ? want.data<double>()[i] : want.data<float>()[i];
    ASSERT_NEAR(g, w, tol * std::max(1.0, std::abs(w))) << "at flat index " << i;
  }
}

using testing::unravel;

int64_t ravel(const std::vector<int64_t>& idx, const Shape& s) {
  int64_t off = 0;
  for (size_t i = 0; i < s.size(); ++i) off = off * s[i] + idx[i];
  return off;
}

// ---------------------------------------------------------------------------------------------------------------
// Conv references (direct formula over multi-indices).

struct ConvCase {
  Shape x, w;
  int64_t group = 1;
  std::vector<int64_t> strides = {}, dilations = {}, pads = {};  // empty = defaults
  std::string auto_pad = "";                                     // empty = NOTSET
  bool bias = true;
};

/// Expected pads (begin..., end...) and output spatial dims of a conv case.
void conv_geometry(const ConvCase& c, std::vector<int64_t>& pl, std::vector<int64_t>& out) {
  const size_t n = c.x.size() - 2;
  pl.assign(n, 0);
  out.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = c.x[2 + i], k = c.w[2 + i];
    const int64_t s = c.strides.empty() ? 1 : c.strides[i], d = c.dilations.empty() ? 1 : c.dilations[i];
    const int64_t ext = (k - 1) * d + 1;
    if (c.auto_pad == "SAME_UPPER" || c.auto_pad == "SAME_LOWER") {
      out[i] = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (out[i] - 1) * s + ext - in);
      pl[i] = c.auto_pad == "SAME_UPPER" ? total / 2 : (total + 1) / 2;
    } else if (c.auto_pad == "VALID") {
      out[i] = (in - ext) / s + 1;
    } else {
      const int64_t b = c.pads.empty() ? 0 : c.pads[i], e = c.pads.empty() ? 0 : c.pads[i + n];
      pl[i] = b;
      out[i] = (in + b + e - ext) / s + 1;
    }
  }
}

Tensor ref_conv(const ConvCase& c, const Tensor& x, const Tensor& w, const Tensor* b) {
  const size_t n = c.x.size() - 2;
  std::vector<int64_t> pl, out;
  conv_geometry(c, pl, out);
  const int64_t N = c.x[0], C = c.x[1], M = c.w[0], Cg = C / c.group, Mg = M / c.group;
  Shape os{N, M};
  os.insert(os.end(), out.begin(), out.end());
  Tensor y(DType::kFloat32, os);
  const Shape ks(c.w.begin() + 2, c.w.end());
  for (int64_t o = 0; o < y.numel(); ++o) {
    const auto oi = unravel(o, os);
    const int64_t m = oi[1], g = m / Mg;
    double acc = b ? b->data<float>()[m] : 0.0;
    for (int64_t ci = 0; ci < Cg; ++ci)
      for (int64_t kk = 0; kk < num_elements(ks); ++kk) {
        const auto ki = unravel(kk, ks);
        std::vector<int64_t> xi{oi[0], g * Cg + ci};
        bool inside = true;
        for (size_t d = 0; d < n; ++d) {
          const int64_t s = c.strides.empty() ? 1 : c.strides[d], dl = c.dilations.empty() ? 1 : c.dilations[d];
          const int64_t p = oi[2 + d] * s - pl[d] + ki[d] * dl;
          inside = inside && p >= 0 && p < c.x[2 + d];
          xi.push_back(p);
        }
        if (!inside) continue;
        std::vector<int64_t> wi{m, ci};
        wi.insert(wi.end(), ki.begin(), ki.end());
        acc += static_cast<double>(x.data<float>()[ravel(xi, c.x)]) * w.data<float>()[ravel(wi, c.w)];
      }
    y.data<float>()[o] = static_cast<float>(acc);
  }
  return y;
}

Node conv_node(const ConvCase& c, const std::string& op = "Conv") {
  std::map<std::string, AttrValue> a;
  if (c.group != 1) a["group"] = c.group;
  if (!c.strides.empty()) a["strides"] = c.strides;
  if (!c.dilations.empty()) a["dilations"] = c.dilations;
  if (!c.pads.empty()) a["pads"] = c.pads;
  if (!c.auto_pad.empty()) a["auto_pad"] = c.auto_pad;
  return make_node(op, a);
}

TEST(KernelsConv, HandComputed2D) {
  // 1x1x3x3 input 1..9, 2x2 kernel of ones, pads 1 on the top/left only, stride 2.
  const Tensor x = F({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  const Tensor w = F({1, 1, 2, 2}, {1, 1, 1, 1});
  const Tensor b = F({1}, {10});
  const Tensor y =
      run1(make_node("Conv", {{"pads", std::vector<int64_t>{1, 1, 0, 0}}, {"strides", std::vector<int64_t>{2, 2}}}),
           {&x, &w, &b});
  // Output 2x2: windows top-left at (-1,-1), (-1,1), (1,-1), (1,1).
  EXPECT_EQ(y.shape, (Shape{1, 1, 2, 2}));
  EXPECT_EQ(vals(y), (std::vector<float>{10 + 1, 10 + 2 + 3, 10 + 4 + 7, 10 + 5 + 6 + 8 + 9}));
}

TEST(KernelsConv, HandComputed1DDilated) {
  const Tensor x = F({1, 1, 5}, {1, 2, 3, 4, 5});
  const Tensor w = F({1, 1, 2}, {1, -1});
  // dilation 2: y[i] = x[i] - x[i+2].
  const Tensor y = run1(make_node("Conv", {{"dilations", std::vector<int64_t>{2}}}), {&x, &w});
  EXPECT_EQ(y.shape, (Shape{1, 1, 3}));
  EXPECT_EQ(vals(y), (std::vector<float>{-2, -2, -2}));
}

TEST(KernelsConv, GeometriesMatchReference) {
  const std::vector<ConvCase> cases = {
      {{2, 3, 7, 6}, {4, 3, 3, 3}},
      {{1, 3, 8, 8}, {5, 3, 3, 3}, 1, {2, 2}, {}, {1, 1, 1, 1}},
      {{1, 2, 8, 7}, {3, 2, 3, 2}, 1, {2, 2}, {}, {}},                 // even input, stride 2: last rows unused
      {{1, 4, 9, 9}, {6, 2, 3, 3}, 2, {1, 1}, {2, 2}, {2, 1, 0, 2}},   // groups, dilations, asymmetric pads
      {{2, 6, 7, 7}, {6, 1, 3, 3}, 6, {1, 1}, {}, {1, 1, 1, 1}},       // depthwise
      {{1, 6, 7, 7}, {12, 1, 3, 3}, 6, {2, 1}, {}, {}, "SAME_UPPER"},  // depthwise multiplier 2
      {{1, 3, 7, 8}, {2, 3, 4, 3}, 1, {2, 3}, {}, {}, "SAME_LOWER"},
      {{1, 3, 7, 8}, {2, 3, 4, 3}, 1, {2, 3}, {}, {}, "SAME_UPPER"},
      {{1, 3, 7, 8}, {2, 3, 4, 3}, 1, {2, 1}, {1, 2}, {}, "VALID"},
      {{2, 3, 11}, {4, 3, 3}, 1, {2}, {2}, {1, 2}},                                     // 1-D
      {{1, 4, 10}, {4, 1, 5}, 4, {1}, {}, {}, "SAME_UPPER"},                            // 1-D depthwise
      {{1, 2, 5, 6, 7}, {3, 2, 2, 3, 2}, 1, {1, 2, 1}, {1, 1, 2}, {0, 1, 1, 1, 0, 0}},  // 3-D
      {{1, 4, 4, 5, 6}, {4, 2, 3, 3, 3}, 2, {2, 2, 2}, {}, {1, 1, 1, 1, 1, 1}, "", false},
      {{1, 3, 5, 5}, {2, 3, 1, 1}, 1, {}, {}, {}, "", false},  // pointwise, no bias
  };
  uint32_t seed = 7;
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x " << shape_str(c.x) << " w " << shape_str(c.w) << " " << c.auto_pad);
    const Tensor x = rand_f(c.x, seed++), w = rand_f(c.w, seed++), b = rand_f({c.w[0]}, seed++);
    const Tensor want = ref_conv(c, x, w, c.bias ? &b : nullptr);
    const Node n = conv_node(c);
    std::vector<const Tensor*> in{&x, &w};
    if (c.bias) in.push_back(&b);
    expect_near(run1(n, in), want);  // float32: oneDNN
    const Tensor x64 = to_f64(x), w64 = to_f64(w), b64 = to_f64(b);
    std::vector<const Tensor*> in64{&x64, &w64};
    if (c.bias) in64.push_back(&b64);
    expect_near(run1(n, in64), want);  // float64: naive loops
  }
}

/// With an owner (run_kernel's `owners`: a model weight), Conv keeps its weights in oneDNN's blocked layout and
/// reorders them once; a different owner at the same address (the old weight freed, a new one allocated there)
/// reorders again, so a result is never computed from stale weights.
TEST(KernelsConv, OwnedWeightsArePackedOnceAndNeverStale) {
  const ConvCase c{{2, 16, 9, 9}, {16, 16, 3, 3}, 1, {}, {}, {1, 1, 1, 1}, "", false};
  const Node n = conv_node(c);
  const Tensor x = rand_f(c.x, 41);
  Tensor w = rand_f(c.w, 42);
  auto owned_by = [&](std::shared_ptr<int> token) { return std::shared_ptr<const Tensor>(std::move(token), &w); };
  auto run_owned = [&](const std::shared_ptr<const Tensor>& owner) {
    auto o = run_kernel(n, {&x, &w}, 17, {}, {nullptr, &owner});
    return std::move(o.at(0));
  };
  std::shared_ptr<const Tensor> first = owned_by(std::make_shared<int>(1));
  const int64_t before = dnn::packed_weight_reorders();
  expect_near(run_owned(first), ref_conv(c, x, w, nullptr));
  EXPECT_EQ(dnn::packed_weight_reorders(), before + 1);
  expect_near(run_owned(first), ref_conv(c, x, w, nullptr));
  EXPECT_EQ(dnn::packed_weight_reorders(), before + 1);  // kept
  expect_near(run1(n, {&x, &w}), ref_conv(c, x, w, nullptr));
  EXPECT_EQ(dnn::packed_weight_reorders(), before + 1);  // no owner: reordered for this call only
  first.reset();  // the weight is gone; a new one, other values, at the same address
  w = rand_f(c.w, 43);
  std::shared_ptr<const Tensor> second = owned_by(std::make_shared<int>(2));
  expect_near(run_owned(second), ref_conv(c, x, w, nullptr));
  EXPECT_EQ(dnn::packed_weight_reorders(), before + 2);
}

TEST(KernelsConv, ErrorsAndUnsupported) {
  const Tensor x = rand_f({1, 4, 5, 5}, 1), w = rand_f({2, 3, 3, 3}, 2);
  EXPECT_THROW(run1(make_node("Conv"), {&x, &w}), std::runtime_error);  // channel mismatch
  const Tensor w2 = rand_f({2, 4, 3, 3}, 3);
  EXPECT_THROW(run1(make_node("Conv", {{"auto_pad", std::string("BOGUS")}}), {&x, &w2}), std::runtime_error);
  Tensor xi(DType::kInt64, {1, 4, 5, 5}), wi(DType::kInt64, {2, 4, 3, 3});
  EXPECT_THROW(run1(make_node("Conv"), {&xi, &wi}), UnsupportedError);
}

// ---------------------------------------------------------------------------------------------------------------
// ConvTranspose.

TEST(KernelsConvTranspose, HandComputed) {
  // 1-D: x = [1, 2], w = [1, 10, 100], stride 2: y = [1, 10, 100+2, 20, 200].
  const Tensor x = F({1, 1, 2}, {1, 2});
  const Tensor w = F({1, 1, 3}, {1, 10, 100});
  Tensor y = run1(make_node("ConvTranspose", {{"strides", std::vector<int64_t>{2}}}), {&x, &w});
  EXPECT_EQ(vals(y), (std::vector<float>{1, 10, 102, 20, 200}));
  // pads 1/1 crop one element at each end; output_padding 1 adds one (zero) at the end.
  y = run1(make_node("ConvTranspose", {{"strides", std::vector<int64_t>{2}},
                                       {"pads", std::vector<int64_t>{1, 1}},
                                       {"output_padding", std::vector<int64_t>{1}}}),
           {&x, &w});
  EXPECT_EQ(vals(y), (std::vector<float>{10, 102, 20, 200}));
}

/// Scatter-form reference: y[n, g*Mg+o, i*s - pl + k*d] += x[n, g*Cg+c, i] * w[g*Cg+c, o, k].
Tensor ref_deconv(const Tensor& x, const Tensor& w, const Tensor* b, int64_t group, const std::vector<int64_t>& s,
                  const std::vector<int64_t>& d, const std::vector<int64_t>& pl, const Shape& os) {
  Tensor y(DType::kFloat32, os);
  const int64_t C = x.shape[1], Cg = C / group, Mg = w.shape[1];
  const size_t n = x.shape.size() - 2;
  for (int64_t o = 0; o < y.numel(); ++o) y.data<float>()[o] = b ? b->data<float>()[unravel(o, os)[1]] : 0.f;
  for (int64_t xi = 0; xi < x.numel(); ++xi) {
    const auto ix = unravel(xi, x.shape);
    const int64_t g = ix[1] / Cg;
    for (int64_t wi = 0; wi < w.numel(); ++wi) {
      const auto iw = unravel(wi, w.shape);
      if (iw[0] != ix[1]) continue;
      std::vector<int64_t> iy{ix[0], g * Mg + iw[1]};
      bool inside = true;
      for (size_t k = 0; k < n; ++k) {
        const int64_t p = ix[2 + k] * s[k] - pl[k] + iw[2 + k] * d[k];
        inside = inside && p >= 0 && p < os[2 + k];
        iy.push_back(p);
      }
      if (inside) y.data<float>()[ravel(iy, os)] += x.data<float>()[xi] * w.data<float>()[wi];
    }
  }
  return y;
}

TEST(KernelsConvTranspose, GeometriesMatchReference) {
  struct Case {
    Shape x, w;
    int64_t group;
    std::vector<int64_t> s, d, pads, opad;
  };
  const std::vector<Case> cases = {
      {{2, 3, 4, 5}, {3, 2, 3, 3}, 1, {1, 1}, {1, 1}, {0, 0, 0, 0}, {0, 0}},
      {{1, 2, 4, 4}, {2, 3, 3, 3}, 1, {2, 2}, {1, 1}, {1, 0, 1, 2}, {1, 0}},
      {{1, 4, 3, 5}, {4, 2, 2, 3}, 2, {2, 3}, {2, 1}, {0, 1, 0, 1}, {1, 2}},
      {{1, 2, 6}, {2, 2, 3}, 1, {3}, {1}, {1, 0}, {2}},
      {{1, 2, 3, 3, 2}, {2, 1, 2, 2, 2}, 2, {2, 1, 2}, {1, 1, 1}, {0, 0, 0, 0, 0, 0}, {0, 0, 1}},
  };
  uint32_t seed = 50;
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x " << shape_str(c.x) << " w " << shape_str(c.w));
    const size_t n = c.x.size() - 2;
    const Tensor x = rand_f(c.x, seed++), w = rand_f(c.w, seed++), b = rand_f({c.w[1] * c.group}, seed++);
    Shape os{c.x[0], c.w[1] * c.group};
    for (size_t i = 0; i < n; ++i)
      os.push_back(c.s[i] * (c.x[2 + i] - 1) + c.opad[i] + (c.w[2 + i] - 1) * c.d[i] + 1 - c.pads[i] - c.pads[i + n]);
    const Tensor want =
        ref_deconv(x, w, &b, c.group, c.s, c.d, std::vector<int64_t>(c.pads.begin(), c.pads.begin() + n), os);
    const Node node = make_node(
        "ConvTranspose",
        {{"group", c.group}, {"strides", c.s}, {"dilations", c.d}, {"pads", c.pads}, {"output_padding", c.opad}});
    expect_near(run1(node, {&x, &w, &b}), want);
    const Tensor x64 = to_f64(x), w64 = to_f64(w), b64 = to_f64(b);
    expect_near(run1(node, {&x64, &w64, &b64}), want);
  }
}

TEST(KernelsConvTranspose, OutputShapeAndSame) {
  const Tensor x = rand_f({1, 1, 3, 3}, 3), w = rand_f({1, 2, 3, 3}, 4);
  // output_shape 10x8 with stride 3x2: full = 3*2+1+... -> total padding split begin-light (SAME_UPPER default off).
  const Tensor y = run1(make_node("ConvTranspose", {{"strides", std::vector<int64_t>{3, 2}},
                                                    {"output_shape", std::vector<int64_t>{10, 8}}}),
                        {&x, &w});
  EXPECT_EQ(y.shape, (Shape{1, 2, 10, 8}));
  // Unpadded full output is 9x7; output_shape 10x8 adds one trailing row/col of zeros.
  const Tensor full = run1(make_node("ConvTranspose", {{"strides", std::vector<int64_t>{3, 2}}}), {&x, &w});
  ASSERT_EQ(full.shape, (Shape{1, 2, 9, 7}));
  for (int64_t c = 0; c < 2; ++c)
    for (int64_t i = 0; i < 10; ++i)
      for (int64_t j = 0; j < 8; ++j) {
        const float got = y.data<float>()[(c * 10 + i) * 8 + j];
        const float want = i < 9 && j < 7 ? full.data<float>()[(c * 9 + i) * 7 + j] : 0.f;
        ASSERT_NEAR(got, want, 1e-5) << c << " " << i << " " << j;
      }
  const Tensor same = run1(
      make_node("ConvTranspose", {{"strides", std::vector<int64_t>{2, 2}}, {"auto_pad", std::string("SAME_UPPER")}}),
      {&x, &w});
  EXPECT_EQ(same.shape, (Shape{1, 2, 6, 6}));
}

// ---------------------------------------------------------------------------------------------------------------
// Pools.

struct PoolCase {
  Shape x;
  std::vector<int64_t> k, s, d, pads;
  std::string auto_pad = "";  // "" (NOTSET), SAME_UPPER, SAME_LOWER, VALID
  bool ceil = false;
};

/// Reference pool: windows from explicit pl and output dims; avg divides by positions inside the padded input
/// (include_pad) or inside the input.
Tensor ref_pool(const std::string& op, const Tensor& x, const PoolCase& c, const std::vector<int64_t>& pl,
                const std::vector<int64_t>& pr, const std::vector<int64_t>& out, bool include_pad) {
  const size_t n = c.k.size();
  Shape os{x.shape[0], x.shape[1]};
  os.insert(os.end(), out.begin(), out.end());
  Tensor y(DType::kFloat32, os);
  const Shape ks(c.k.begin(), c.k.end());
  for (int64_t o = 0; o < y.numel(); ++o) {
    const auto oi = unravel(o, os);
    double mx = -INFINITY, sum = 0;
    int64_t cnt_in = 0, cnt_pad = 0;
    for (int64_t kk = 0; kk < num_elements(ks); ++kk) {
      const auto ki = unravel(kk, ks);
      std::vector<int64_t> xi{oi[0], oi[1]};
      bool inside = true, in_pad = true;
      for (size_t i = 0; i < n; ++i) {
        const int64_t s = c.s.empty() ? 1 : c.s[i], d = c.d.empty() ? 1 : c.d[i];
        const int64_t p = oi[2 + i] * s - pl[i] + ki[i] * d;
        inside = inside && p >= 0 && p < x.shape[2 + i];
        in_pad = in_pad && p >= -pl[i] && p < x.shape[2 + i] + pr[i];
        xi.push_back(p);
      }
      if (in_pad) ++cnt_pad;
      if (!inside) continue;
      ++cnt_in;
      const double v = x.data<float>()[ravel(xi, x.shape)];
      mx = std::max(mx, v);
      sum += v;
    }
    y.data<float>()[o] = static_cast<float>(op == "MaxPool" ? mx : sum / (include_pad ? cnt_pad : cnt_in));
  }
  return y;
}

void pool_geometry(const PoolCase& c, const Shape& x, std::vector<int64_t>& pl, std::vector<int64_t>& pr,
                   std::vector<int64_t>& out) {
  const size_t n = c.k.size();
  pl.assign(n, 0);
  pr.assign(n, 0);
  out.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t in = x[2 + i], s = c.s.empty() ? 1 : c.s[i], d = c.d.empty() ? 1 : c.d[i];
    const int64_t ext = (c.k[i] - 1) * d + 1;
    if (c.auto_pad == "SAME_UPPER" || c.auto_pad == "SAME_LOWER") {
      out[i] = (in + s - 1) / s;
      const int64_t total = std::max<int64_t>(0, (out[i] - 1) * s + ext - in);
      pl[i] = c.auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      pr[i] = total - pl[i];
    } else {
      if (!c.pads.empty()) {
        pl[i] = c.pads[i];
        pr[i] = c.pads[i + n];
      }
      const int64_t span = in + pl[i] + pr[i] - ext;
      out[i] = (c.ceil ? (span + s - 1) / s : span / s) + 1;
      if (c.ceil && (out[i] - 1) * s >= in + pl[i]) --out[i];
    }
  }
}

Node pool_node(const std::string& op, const PoolCase& c, bool include_pad) {
  std::map<std::string, AttrValue> a{{"kernel_shape", c.k}};
  if (!c.s.empty()) a["strides"] = c.s;
  if (!c.d.empty()) a["dilations"] = c.d;
  if (!c.pads.empty()) a["pads"] = c.pads;
  if (!c.auto_pad.empty()) a["auto_pad"] = c.auto_pad;
  if (c.ceil) a["ceil_mode"] = int64_t{1};
  if (include_pad) a["count_include_pad"] = int64_t{1};
  return make_node(op, a);
}

TEST(KernelsPool, HandComputed) {
  const Tensor x = F({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  const std::map<std::string, AttrValue> a{{"kernel_shape", std::vector<int64_t>{2, 2}},
                                           {"pads", std::vector<int64_t>{1, 1, 0, 0}},
                                           {"strides", std::vector<int64_t>{2, 2}}};
  EXPECT_EQ(vals(run1(make_node("MaxPool", a), {&x})), (std::vector<float>{1, 3, 7, 9}));
  EXPECT_EQ(vals(run1(make_node("AveragePool", a), {&x})), (std::vector<float>{1, 2.5f, 5.5f, 7}));
  auto ai = a;
  ai["count_include_pad"] = int64_t{1};
  EXPECT_EQ(vals(run1(make_node("AveragePool", ai), {&x})), (std::vector<float>{0.25f, 1.25f, 2.75f, 7}));
  // ceil_mode: 3x3 input, 2x2 kernel, stride 2 -> 2x2 output with a partial last window.
  const std::map<std::string, AttrValue> c{
      {"kernel_shape", std::vector<int64_t>{2, 2}}, {"strides", std::vector<int64_t>{2, 2}}, {"ceil_mode", int64_t{1}}};
  EXPECT_EQ(vals(run1(make_node("MaxPool", c), {&x})), (std::vector<float>{5, 6, 8, 9}));
  EXPECT_EQ(vals(run1(make_node("AveragePool", c), {&x})), (std::vector<float>{3, 4.5f, 7.5f, 9}));
  EXPECT_EQ(vals(run1(make_node("GlobalAveragePool"), {&x})), (std::vector<float>{5}));
  EXPECT_EQ(vals(run1(make_node("GlobalMaxPool"), {&x})), (std::vector<float>{9}));
  EXPECT_EQ(run1(make_node("GlobalMaxPool"), {&x}).shape, (Shape{1, 1, 1, 1}));
}

TEST(KernelsPool, GeometriesMatchReference) {
  const std::vector<PoolCase> cases = {
      {{2, 3, 8, 8}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}},
      {{1, 2, 9, 7}, {3, 2}, {2, 1}, {2, 2}, {1, 0, 2, 1}},
      {{1, 2, 7, 7}, {3, 3}, {2, 2}, {}, {}, "", true},  // ceil
      {{1, 2, 8, 6}, {3, 3}, {2, 2}, {}, {1, 1, 1, 1}, "", true},
      {{1, 2, 7, 8}, {3, 2}, {2, 3}, {}, {}, "SAME_UPPER"},
      {{1, 2, 7, 8}, {3, 2}, {2, 3}, {}, {}, "SAME_LOWER"},
      {{2, 3, 10}, {3}, {2}, {2}, {1, 1}},                              // 1-D
      {{1, 2, 5, 6, 7}, {2, 3, 2}, {2, 1, 2}, {}, {1, 1, 0, 0, 1, 1}},  // 3-D
  };
  uint32_t seed = 90;
  for (const auto& c : cases) {
    SCOPED_TRACE(::testing::Message() << "x " << shape_str(c.x) << " " << c.auto_pad << " ceil " << c.ceil);
    const Tensor x = rand_f(c.x, seed++);
    std::vector<int64_t> pl, pr, out;
    pool_geometry(c, c.x, pl, pr, out);
    const Tensor x64 = to_f64(x);
    expect_near(run1(pool_node("MaxPool", c, false), {&x}), ref_pool("MaxPool", x, c, pl, pr, out, false));
    expect_near(run1(pool_node("MaxPool", c, false), {&x64}), ref_pool("MaxPool", x, c, pl, pr, out, false));
    if (!c.d.empty()) continue;  // AveragePool has dilations only from opset 19
    for (bool inc : {false, true}) {
      SCOPED_TRACE(inc);
      const Tensor want = ref_pool("AveragePool", x, c, pl, pr, out, inc);
      expect_near(run1(pool_node("AveragePool", c, inc), {&x}), want);
      expect_near(run1(pool_node("AveragePool", c, inc), {&x64}), want);
    }
  }
}

TEST(KernelsPool, MaxPoolIndicesAndInt8) {
  const Tensor x = F({1, 1, 2, 3}, {1, 9, 3, 8, 2, 7});
  const Node n = make_node("MaxPool", {{"kernel_shape", std::vector<int64_t>{2, 2}}}, 2);
  auto o = run_kernel(n, {&x}, 12);
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(vals(o[0]), (std::vector<float>{9, 9}));
  EXPECT_EQ(o[1].dtype, DType::kInt64);
  EXPECT_EQ(std::vector<int64_t>(o[1].data<int64_t>(), o[1].data<int64_t>() + 2), (std::vector<int64_t>{1, 1}));
  // storage_order 1: column-major index of (0,1) in a 2x3 plane = 1*2 + 0 = 2.
  const Node nc =
      make_node("MaxPool", {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"storage_order", int64_t{1}}}, 2);
  o = run_kernel(nc, {&x}, 12);
  EXPECT_EQ(o[1].data<int64_t>()[0], 2);
  Tensor xi(DType::kInt8, {1, 1, 1, 4});
  const int8_t v[4] = {-5, 3, -1, 2};
  std::memcpy(xi.bytes.data(), v, 4);
  const Tensor yi = run1(make_node("MaxPool", {{"kernel_shape", std::vector<int64_t>{1, 2}}}), {&xi});
  EXPECT_EQ(yi.dtype, DType::kInt8);
  EXPECT_EQ(yi.data<int8_t>()[0], 3);
  EXPECT_EQ(yi.data<int8_t>()[2], 2);
}

TEST(KernelsPool, LpPool) {
  const Tensor x = F({1, 1, 2, 2}, {3, -4, 0, 0});
  EXPECT_NEAR(run1(make_node("LpPool", {{"kernel_shape", std::vector<int64_t>{2, 2}}}), {&x}).data<float>()[0], 5.f,
              1e-5);
  EXPECT_NEAR(run1(make_node("LpPool", {{"kernel_shape", std::vector<int64_t>{2, 2}}, {"p", int64_t{1}}}), {&x})
                  .data<float>()[0],
              7.f, 1e-5);
  EXPECT_NEAR(run1(make_node("GlobalLpPool"), {&x}).data<float>()[0], 5.f, 1e-5);
}

// ---------------------------------------------------------------------------------------------------------------
// Normalizations.

TEST(KernelsNorm, BatchNormalizationInference) {
  const Tensor x = rand_f({2, 3, 4, 5}, 5), sc = F({3}, {1, 2, 0.5f}), b = F({3}, {0, 1, -1}),
               mean = F({3}, {0.1f, -0.2f, 0.3f}), var = F({3}, {1, 0.5f, 2});
  const Tensor y = run1(make_node("BatchNormalization", {{"epsilon", 1e-3f}}), {&x, &sc, &b, &mean, &var}, 15);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const int64_t ch = (i / 20) % 3;
    const float want = (x.data<float>()[i] - mean.data<float>()[ch]) / std::sqrt(var.data<float>()[ch] + 1e-3f) *
                           sc.data<float>()[ch] +
                       b.data<float>()[ch];
    ASSERT_NEAR(y.data<float>()[i], want, 1e-5) << i;
  }
  // 2-D input [N, C].
  const Tensor x2 = F({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor y2 = run1(make_node("BatchNormalization", {{"epsilon", 0.f}}), {&x2, &sc, &b, &mean, &var}, 9);
  EXPECT_NEAR(y2.data<float>()[4], (5 + 0.2f) / std::sqrt(0.5f) * 2 + 1, 1e-5);
  // Before opset 14, training outputs (saved statistics) have no kernel.
  EXPECT_THROW(run_kernel(make_node("BatchNormalization", {}, 3), {&x, &sc, &b, &mean, &var}, 9), UnsupportedError);
}

// Training mode (opset >= 14): batch statistics (population variance) normalise Y; running statistics are
// mean * momentum + batch * (1 - momentum).
TEST(KernelsNorm, BatchNormalizationTraining) {
  const Tensor x = F({2, 1, 2}, {1, 2, 3, 4}), sc = F({1}, {2}), b = F({1}, {1}), mean = F({1}, {0.5f}),
               var = F({1}, {3});
  const auto out = run_kernel(
      make_node("BatchNormalization", {{"training_mode", int64_t{1}}, {"epsilon", 0.f}, {"momentum", 0.75f}}, 3),
      {&x, &sc, &b, &mean, &var}, 15);
  ASSERT_EQ(out.size(), 3u);
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(out[0].data<float>()[i], (i + 1 - 2.5f) / std::sqrt(1.25f) * 2 + 1, 1e-5) << i;
  EXPECT_NEAR(out[1].data<float>()[0], 0.5f * 0.75f + 2.5f * 0.25f, 1e-6);
  EXPECT_NEAR(out[2].data<float>()[0], 3 * 0.75f + 1.25f * 0.25f, 1e-6);
}

TEST(KernelsNorm, BatchNormalizationBadParams) {
  const Tensor x = rand_f({2, 3, 4, 5}, 5), sc = F({3}, {1, 2, 0.5f}), b = F({3}, {0, 1, -1}),
               mean = F({3}, {0.1f, -0.2f, 0.3f}), var = F({3}, {1, 0.5f, 2});
  const Tensor bad = F({2}, {1, 1});
  EXPECT_THROW(run1(make_node("BatchNormalization"), {&x, &bad, &b, &mean, &var}, 15), std::runtime_error);
}

TEST(KernelsNorm, InstanceNormalization) {
  const Tensor x = F({1, 2, 4}, {1, 2, 3, 4, 10, 10, 10, 10});
  const Tensor sc = F({2}, {2, 1}), b = F({2}, {1, 5});
  const Tensor y = run1(make_node("InstanceNormalization", {{"epsilon", 1e-5f}}), {&x, &sc, &b});
  // channel 0: mean 2.5, var 1.25; channel 1 is constant (normalises to 0, then + bias).
  const float is = 2.f / std::sqrt(1.25f + 1e-5f) / 2;
  const std::vector<float> want{1 - 3 * is, 1 - is, 1 + is, 1 + 3 * is, 5, 5, 5, 5};  // scale 2 * (+-1.5, +-0.5)
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(y.data<float>()[i], want[i], 1e-5) << i;
}

TEST(KernelsNorm, LRN) {
  const Tensor x = rand_f({1, 5, 2, 2}, 11);
  const float alpha = 0.01f, beta = 0.6f, bias = 1.5f;
  const int64_t size = 3;
  const Tensor y = run1(make_node("LRN", {{"alpha", alpha}, {"beta", beta}, {"bias", bias}, {"size", size}}), {&x});
  for (int64_t c = 0; c < 5; ++c)
    for (int64_t j = 0; j < 4; ++j) {
      double sq = 0;
      for (int64_t cc = std::max<int64_t>(0, c - 1); cc <= std::min<int64_t>(4, c + 1); ++cc)
        sq += std::pow(x.data<float>()[cc * 4 + j], 2);
      const double want = x.data<float>()[c * 4 + j] / std::pow(bias + alpha / size * sq, beta);
      ASSERT_NEAR(y.data<float>()[c * 4 + j], want, 1e-5);
    }
}

TEST(KernelsNorm, MeanVarianceNormalization) {
  const Tensor x = F({1, 2, 1, 2}, {1, 3, 10, 20});
  const Tensor y = run1(make_node("MeanVarianceNormalization"), {&x});  // axes 0,2,3: per channel
  EXPECT_NEAR(y.data<float>()[0], -1, 1e-5);
  EXPECT_NEAR(y.data<float>()[1], 1, 1e-5);
  EXPECT_NEAR(y.data<float>()[2], -1, 1e-5);
  const Tensor ya = run1(make_node("MeanVarianceNormalization", {{"axes", std::vector<int64_t>{1, 3}}}), {&x});
  // All four values: mean 8.5, std sqrt(((7.5)^2+(5.5)^2+(1.5)^2+(11.5)^2)/4).
  const double sd = std::sqrt((7.5 * 7.5 + 5.5 * 5.5 + 1.5 * 1.5 + 11.5 * 11.5) / 4);
  EXPECT_NEAR(ya.data<float>()[3], 11.5 / sd, 1e-5);
}

// A bidirectional GRU without `activations` uses the defaults (Sigmoid, Tanh) in both directions: the same outputs as
// spelling them out.
TEST(KernelsRnn, BidirectionalDefaultActivations) {
  const int64_t S = 3, B = 2, I = 4, H = 5;
  const Tensor x = rand_f({S, B, I}, 21), w = rand_f({2, 3 * H, I}, 22), r = rand_f({2, 3 * H, H}, 23);
  Node n = make_node("GRU", {{"direction", std::string("bidirectional")}, {"hidden_size", H}}, 2);
  n.inputs = {0, 1, 2};
  const std::vector<Tensor> by_default = run_kernel(n, {&x, &w, &r}, 17);
  n.attrs["activations"] = std::vector<std::string>{"Sigmoid", "Tanh", "Sigmoid", "Tanh"};
  const std::vector<Tensor> spelled = run_kernel(n, {&x, &w, &r}, 17);
  ASSERT_EQ(by_default.size(), 2u);
  ASSERT_EQ(by_default[0].shape, (Shape{S, 2, B, H}));
  for (size_t k = 0; k < 2; ++k) EXPECT_EQ(by_default[k].bytes, spelled[k].bytes) << k;
}

}  // namespace
}  // namespace gspmd
